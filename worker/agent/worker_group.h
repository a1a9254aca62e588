// The agent's local ranks as processes: starts one per local rank (each in its own process group, killed with the
// agent), reaps them, and stops them (the signal, then SIGKILL after the grace). Knows nothing of the rendezvous:
// what an exit means for the job is the caller's (on_exit).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "worker/agent/agent_metrics.h"
#include "worker/agent/output_watch.h"

namespace railyard::worker {

struct Worker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int exit_code = -1;
  int signal = 0;
  std::string progress_file;
  int64_t last_step = -1;  // the last step forwarded to the rendezvous (WorkerReports)
};

// One rank to start: everything its process needs, built before fork.
struct RankLaunch {
  int local_rank = 0;
  int global_rank = 0;
  std::string progress_file;
  std::vector<std::string> env;  // "NAME=value": the process's whole environment (rank_env)
};

class WorkerGroup {
 public:
  // Called for every exit recorded with a reason (the exit reason reported to the service).
  using OnExit = std::function<void(const Worker&, const char* reason)>;

  // output: when set, each rank's stdout/stderr go through it (a program's ranks, RAILYARD_AGENT_RANK_METRICS).
  WorkerGroup(std::chrono::milliseconds grace, AgentMetrics& metrics, OutputWatch* output, OnExit on_exit);

  // Forgets the previous generation's workers and starts `command` once per launch, in order. Throws Error when a
  // fork or pipe fails; the workers started before stay in the group (stop() ends them).
  void start(int64_t generation, std::vector<std::string> command, std::vector<RankLaunch> launches);

  // Records the exits of workers that have ended, without waiting.
  void reap(const char* reason);

  // Signals every worker's group, waits up to the grace period, then SIGKILLs what is left. reason: the exit
  // reason reported to the service, or nullptr to report nothing (the generation is already superseded).
  void stop(int sig, const char* reason);

  // torchrun mode: what a worker starts outside its process group (torch >= 2 gives each rank a session of its own)
  // goes with it. stop() continues the worker's descendants with its signal (a SIGSTOPped rank can then act on
  // torchrun's SIGTERM), SIGKILLs them with the group, and ends whatever is left as the agent's children: with the
  // agent as their subreaper (PR_SET_CHILD_SUBREAPER, set by the caller) a dead torchrun's orphans are those.
  void set_end_process_tree(bool on) { end_tree_ = on; }

  bool any_running() const;
  // Every worker exited 0 (false when none was started).
  bool all_ok() const;

  std::vector<Worker>& workers() { return workers_; }

 private:
  void record_exit(Worker& w, int status, const char* reason);
  void end_orphans();

  std::chrono::milliseconds grace_;
  AgentMetrics& metrics_;
  OutputWatch* output_;
  OnExit on_exit_;
  int64_t generation_ = 0;
  std::vector<Worker> workers_;
  bool end_tree_ = false;
};

}  // namespace railyard::worker
