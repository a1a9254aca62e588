// The pids of the running pods, kept in <state-dir>/processes.json so that a restarted agent can kill the process
// groups an earlier run left behind (an agent killed with SIGKILL cannot stop its pods itself).
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "deploy/local/node_agent/supervisor.h"

namespace railyard::node_agent {

// Field 22 of /proc/<pid>/stat (start time in clock ticks), or "" if there is no such process: tells a recorded
// process from a later one that got the same pid.
std::string proc_start_time(pid_t pid);

class ProcessList {
 public:
  explicit ProcessList(std::string path) : path_(std::move(path)) {}

  // Records every process the supervisor runs now (best effort: a failure is logged). Called at every start and exit:
  // each process's start time is read from /proc once, not at every save (1,000 pods made that 10^6 reads).
  void save(const Supervisor& supervisor);
  // Kills the process groups of the recorded processes that still run, then forgets them.
  void kill_leftovers() const;

 private:
  std::string path_;
  std::mutex mu_;
  std::map<std::string, std::pair<pid_t, std::string>> started_;  // key -> (pid, start time) of the last save
};

}  // namespace railyard::node_agent
