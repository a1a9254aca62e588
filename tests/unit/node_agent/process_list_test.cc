#include "deploy/local/node_agent/process_list.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/error.h"
#include "tests/unit/node_agent/temp_dir.h"

namespace na = railyard::node_agent;
using namespace std::chrono_literals;

using railyard::node_agent::testing::TempDir;

TEST_CASE("process list: a restarted agent kills what the earlier run recorded, and nothing else") {
  TempDir d("na-procs");
  const std::string file = d.path + "/processes.json";
  na::Supervisor sup;
  sup.start("uid-1", {{"sleep", "30"}, {}, d.path, d.path + "/uid-1.log"});
  pid_t pid = *sup.pid("uid-1");
  CHECK_FALSE(na::proc_start_time(pid).empty());

  // The pid was reused by another process (other start time): left alone.
  railyard::write_file_atomic(file, nlohmann::json{{"uid-1", {{"pid", pid}, {"start", "1"}}}}.dump());
  na::ProcessList(file).kill_leftovers();
  CHECK_FALSE(sup.wait("uid-1", 300ms));
  CHECK_FALSE(std::filesystem::exists(file));

  // As recorded by save(): the group is killed.
  na::ProcessList list(file);
  list.save(sup);
  auto saved = nlohmann::json::parse(railyard::read_file(file));
  CHECK(saved["uid-1"]["pid"] == pid);
  list.kill_leftovers();
  CHECK(sup.wait("uid-1", 5000ms));
  CHECK_FALSE(std::filesystem::exists(file));
}
