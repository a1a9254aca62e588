#include "worker/agent/worker_group.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "worker/agent/torchrun_launch.h"

namespace railyard::worker {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kComponent = "agent";

}  // namespace

WorkerGroup::WorkerGroup(std::chrono::milliseconds grace, AgentMetrics& metrics, OutputWatch* output, OnExit on_exit)
    : grace_(grace), metrics_(metrics), output_(output), on_exit_(std::move(on_exit)) {}

void WorkerGroup::start(int64_t generation, std::vector<std::string> command, std::vector<RankLaunch> launches) {
  // Everything the child needs is built before fork: between fork and exec only async-signal-safe calls.
  const std::string exec_error = "railyard agent: cannot exec the worker command \"" + command.front() +
                                 "\" (not found or not executable); exit code 127\n";
  std::vector<char*> argv;
  for (auto& s : command) argv.push_back(s.data());
  argv.push_back(nullptr);

  generation_ = generation;
  workers_.clear();
  for (RankLaunch& launch : launches) {
    std::vector<char*> envp;
    for (auto& s : launch.env) envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    const OutputWatch::ChildEnds ends = output_ ? output_->open(launch.local_rank) : OutputWatch::ChildEnds{};

    pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("agent: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::setpgid(0, 0);  // own group: signals reach the whole worker tree, and the pod's group signal does not
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a killed agent
      if (::getppid() != parent) ::_exit(127);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      if (ends.out >= 0 && (::dup2(ends.out, 1) < 0 || ::dup2(ends.err, 2) < 0)) ::_exit(127);
      ::execvpe(argv[0], argv.data(), envp.data());
      (void)!::write(2, exec_error.data(), exec_error.size());
      ::_exit(127);
    }
    if (ends.out >= 0) {
      ::close(ends.out);  // the child holds them now: EOF on the read end once it and its children are gone
      ::close(ends.err);
    }
    ::setpgid(pid, pid);
    Worker w;
    w.local_rank = launch.local_rank;
    w.global_rank = launch.global_rank;
    w.progress_file = launch.progress_file;
    w.pid = pid;
    w.running = true;
    workers_.push_back(w);
    metrics_.worker_starts.increment();
    log::info(kComponent, "worker started",
              {{"generation", std::to_string(generation)},
               {"rank", std::to_string(w.global_rank)},
               {"local_rank", std::to_string(w.local_rank)},
               {"pid", std::to_string(pid)}});
  }
}

void WorkerGroup::record_exit(Worker& w, int status, const char* reason) {
  w.running = false;
  if (WIFEXITED(status)) {
    w.exit_code = WEXITSTATUS(status);
    w.signal = 0;
  } else if (WIFSIGNALED(status)) {
    w.exit_code = -1;
    w.signal = WTERMSIG(status);
  }
  metrics_.worker_exits
      .add(metrics_.with_outcome(w.signal != 0      ? "signaled"
                                 : w.exit_code == 0 ? "succeeded"
                                                    : "failed"))
      .increment();
  log::info(kComponent, "worker exited",
            {{"generation", std::to_string(generation_)},
             {"rank", std::to_string(w.global_rank)},
             {"exit_code", std::to_string(w.exit_code)},
             {"signal", std::to_string(w.signal)}});
  if (reason != nullptr && on_exit_) on_exit_(w, reason);
}

void WorkerGroup::reap(const char* reason) {
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    pid_t r = ::waitpid(w.pid, &status, WNOHANG);
    if (r == w.pid) record_exit(w, status, reason);
  }
}

bool WorkerGroup::any_running() const {
  for (const auto& w : workers_)
    if (w.running) return true;
  return false;
}

void WorkerGroup::stop(int sig, const char* reason) {
  for (auto& w : workers_)
    if (w.running) {
      ::kill(-w.pid, sig);
      // A stopped (hung, SIGSTOPped) worker cannot act on the signal until it runs again: continue it, so it
      // saves its step and exits within the grace instead of waiting for SIGKILL.
      if (sig != SIGKILL) ::kill(-w.pid, SIGCONT);
      if (end_tree_ && sig != SIGKILL)
        for (pid_t d : descendants(list_processes(), w.pid)) ::kill(d, SIGCONT);
    }
  auto until = Clock::now() + grace_;
  while (any_running() && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    reap(reason);
  }
  if (end_tree_) {
    // Before the workers go: their descendants are found through them (afterwards, through the agent).
    const auto table = list_processes();
    for (const auto& w : workers_)
      for (pid_t d : descendants(table, w.pid)) ::kill(d, SIGKILL);
  }
  for (auto& w : workers_) {
    ::kill(-w.pid, SIGKILL);  // also orphans left in the group by a worker that already exited
    if (!w.running) continue;
    int status = 0;
    if (::waitpid(w.pid, &status, 0) == w.pid) record_exit(w, status, reason);
  }
  if (end_tree_) end_orphans();
}

void WorkerGroup::end_orphans() {
  // Every worker is reaped: any child of the agent now is a descendant a worker left behind (the agent is their
  // subreaper). Killing one may orphan its own children onto the agent, hence the rounds.
  const pid_t self = ::getpid();
  for (int round = 0; round < 50; ++round) {
    std::vector<pid_t> orphans;
    for (const auto& p : list_processes())
      if (p.ppid == self) orphans.push_back(p.pid);
    if (orphans.empty()) return;
    for (pid_t p : orphans) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    log::info(kComponent, "ended processes the workers left behind", {{"count", std::to_string(orphans.size())}});
  }
}

bool WorkerGroup::all_ok() const {
  if (workers_.empty()) return false;
  for (const auto& w : workers_)
    if (w.running || w.exit_code != 0 || w.signal != 0) return false;
  return true;
}

}  // namespace railyard::worker
