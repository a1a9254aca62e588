// Runs pod processes: each in its own session/process group (so signals reach its children), stdout+stderr to a
// log file. A monitor thread reaps the group leaders, kills what is left of a group once its leader exits (a
// container ends with its main process), and enforces SIGTERM -> SIGKILL grace deadlines.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"

namespace railyard::node_agent {

struct SpawnSpec {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::string working_dir;  // created (with parents) if missing
  std::string log_path;     // opened for append; parent dirs created
};

struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code, or 128 + signal when signaled (the container-runtime convention)
  int signal = 0;  // when signaled
  std::chrono::system_clock::time_point finished_at;
};

// One line describing how a process ended: "exited with code 3", "killed by signal 9 (SIGKILL)".
std::string describe(const ExitStatus& s);

class SpawnError : public Error {
 public:
  using Error::Error;
};

class Supervisor {
 public:
  // Called from the monitor thread, without the supervisor's lock held, once per process that ended.
  using ExitCallback = std::function<void(const std::string& key, pid_t pid, const ExitStatus& status)>;

  explicit Supervisor(ExitCallback on_exit = {});
  ~Supervisor();  // stop_all(2 s)
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts a process under `key` (one live process per key). Throws SpawnError if exec fails (command not found,
  // working dir not creatable, ...) or if a process for the key is still running. The process is killed if the
  // calling thread exits (PR_SET_PDEATHSIG follows the forking thread): call this from a long-lived thread.
  pid_t start(const std::string& key, const SpawnSpec& spec);

  // Sends a signal to the whole process group. False if there is no live process for the key.
  bool signal(const std::string& key, int sig);
  // SIGTERM (plus SIGCONT, so a frozen process can act on it) to the group now, SIGKILL once `grace` passed.
  bool terminate(const std::string& key, std::chrono::milliseconds grace);
  std::optional<pid_t> pid(const std::string& key) const;
  bool running(const std::string& key) const;
  std::vector<std::string> keys() const;

  // Waits until the process for `key` has ended (true) or the timeout passed (false).
  bool wait(const std::string& key, std::chrono::milliseconds timeout);
  // Terminates every process with the given grace and waits (bounded by grace + 2 s) for them to end.
  void stop_all(std::chrono::milliseconds grace);

 private:
  struct Proc {
    pid_t pid = 0;
    std::optional<std::chrono::steady_clock::time_point> kill_at;
  };
  void monitor_loop();

  ExitCallback on_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Proc> procs_;
  bool stopping_ = false;
  std::thread monitor_;
};

}  // namespace railyard::node_agent
