#include "deploy/local/node_agent/process_list.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/log.h"

namespace railyard::node_agent {
namespace {

using Json = nlohmann::json;
constexpr const char* kComp = "node-agent";

}  // namespace

std::string proc_start_time(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all;
  if (!std::getline(in, all)) return "";
  auto close = all.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(all.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

void ProcessList::save(const Supervisor& supervisor) {
  std::lock_guard<std::mutex> l(mu_);
  Json j = Json::object();
  std::map<std::string, std::pair<pid_t, std::string>> now;
  for (const auto& key : supervisor.keys()) {
    auto pid = supervisor.pid(key);
    if (!pid) continue;
    // Same key and pid as at the last save: the same process, unless the pid was reaped and reused in between; then
    // the stale start time only makes kill_leftovers spare that process, never kill a stranger.
    auto was = started_.find(key);
    const std::string start =
        was != started_.end() && was->second.first == *pid ? was->second.second : proc_start_time(*pid);
    now[key] = {*pid, start};
    j[key] = {{"pid", *pid}, {"start", start}};
  }
  started_ = std::move(now);
  try {
    // Only the agent's own crash matters (a machine crash ends the pods too); see ip_allocator.cc.
    write_file_atomic(path_, j.dump() + "\n", Durability::ProcessCrash);
  } catch (const std::exception& e) {
    log::warn(kComp, "cannot save process list", {{"error", e.what()}});
  }
}

void ProcessList::kill_leftovers() const {
  if (!std::filesystem::exists(path_)) return;
  Json j;
  try {
    j = Json::parse(read_file(path_, "process list"));
  } catch (const std::exception&) {
    return;
  }
  for (const auto& [uid, v] : j.items()) {
    pid_t pid = v.value("pid", 0);
    if (pid <= 1) continue;
    std::string start = proc_start_time(pid);
    // A live leader with another start time is an unrelated process that got the pid; leave it alone.
    if (!start.empty() && start != v.value("start", "")) continue;
    if (::kill(-pid, SIGKILL) == 0) {
      log::info(kComp, "killed process group left by an earlier agent run",
                {{"uid", uid}, {"pgid", std::to_string(pid)}});
    }
  }
  std::filesystem::remove(path_);
}

}  // namespace railyard::node_agent
