#include "deploy/local/node_agent/control.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/atomic_file.h"
#include "common/error.h"
#include "tests/unit/node_agent/temp_dir.h"

namespace na = railyard::node_agent;

using railyard::node_agent::testing::TempDir;

TEST_CASE("control endpoint: port file, success replies, errors become one-line messages") {
  TempDir d("na-ctl");
  std::string seen_action;
  {
    na::ControlServer server(d.path, [&](const std::string& action, const nlohmann::json& args) -> nlohmann::json {
      seen_action = action;
      if (action == "kill" && args.value("pod", "") == "ns/missing") throw na::ControlError(404, "no pod ns/missing");
      if (action == "boom") throw std::runtime_error("internal failure");
      return {{"message", "did " + action + " " + args.value("pod", "")}, {"pid", 42}};
    });
    CHECK(server.port() > 0);
    CHECK(std::stoi(railyard::read_file(d.path + "/control.port")) == server.port());

    auto reply = na::control_call(d.path, "kill", {{"pod", "ns/p"}});
    CHECK(reply["ok"] == true);
    CHECK(reply["message"] == "did kill ns/p");
    CHECK(reply["pid"] == 42);
    CHECK(seen_action == "kill");
    CHECK_THROWS_WITH_AS(na::control_call(d.path, "kill", {{"pod", "ns/missing"}}), "no pod ns/missing",
                         railyard::Error);
    CHECK_THROWS_WITH_AS(na::control_call(d.path, "boom", nlohmann::json::object()), "internal failure",
                         railyard::Error);
  }
  // The server removes its port file when it stops; a client then says no agent runs.
  CHECK_FALSE(std::filesystem::exists(d.path + "/control.port"));
  CHECK_THROWS_WITH_AS(na::control_call(d.path, "status", nlohmann::json::object()),
                       doctest::Contains("no running railyard-node-agent"), railyard::Error);
  // A stale port file (agent killed) names the port and asks whether the agent runs.
  railyard::write_file_atomic(d.path + "/control.port", "1\n");
  CHECK_THROWS_WITH_AS(na::control_call(d.path, "status", nlohmann::json::object()),
                       doctest::Contains("is the agent running?"), railyard::Error);
}
