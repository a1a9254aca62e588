// The agent's side of torchrun mode (worker/agent/torchrun_launch.h): the failed rank read from torchrun's failure
// summary, the rank processes found among torchrun's descendants by their LOCAL_RANK (real processes), and a worker's
// whole tree ended with it, processes in sessions of their own included (WorkerGroup with the agent as subreaper).
#include "worker/agent/torchrun_launch.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/agent/agent_test_util.h"
#include "worker/agent/agent_metrics.h"
#include "worker/agent/worker_group.h"

namespace fs = std::filesystem;
using namespace railyard::worker;

using railyard::agent_testing::slurp;
using railyard::agent_testing::TempDir;

namespace {

// What Debian 12's torchrun (torch 1.13) writes to stderr when local rank 1 of node 1 is killed with SIGKILL.
const char* kSummary =
    R"(WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 412 closing signal SIGTERM
ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 1 (pid: 413) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 33, in <module>
    sys.exit(load_entry_point('torch==1.13.0a0+gitunknown', 'console_scripts', 'torchrun')())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/app/train_gpt.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-05_07:10:11
  host      : pytorch-ddp-worker-1
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 412)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_07:10:11
  host      : pytorch-ddp-worker-1
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 413)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 413
============================================================)";

// The shell's `echo $! > FILE` is done: the redirection creates the file before echo writes the pid and its newline,
// so a file that merely exists may still be empty.
bool written(const fs::path& p) {
  const std::string s = slurp(p);
  return !s.empty() && s.back() == '\n';
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

bool alive(pid_t p) {
  // A zombie still answers kill(0): read its state instead.
  std::ifstream in("/proc/" + std::to_string(p) + "/stat");
  if (!in) return false;
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// sh -c script with only PATH and OUT in its environment (no LOCAL_RANK: it plays torchrun).
pid_t spawn_shell(const std::string& script, const fs::path& out) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    const std::string out_env = "OUT=" + out.string();
    const char* argv[] = {"/bin/sh", "-c", script.c_str(), nullptr};
    const char* envp[] = {"PATH=/usr/bin:/bin", out_env.c_str(), nullptr};
    ::execve(argv[0], const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    ::_exit(127);
  }
  return pid;
}

}  // namespace

TEST_CASE("the failed rank and its exit are read from torchrun's failure summary") {
  const auto f = parse_torchrun_failure(kSummary);
  REQUIRE(f);
  CHECK(f->local_rank == 1);  // the root cause, not the rank listed under "Failures"
  CHECK(f->exit_code == -1);  // a signal, as an exit report carries it
  CHECK(f->signal == 9);

  // An exit code, and a tail that starts inside the root cause (the header cut off).
  const auto g = parse_torchrun_failure(
      "  rank      : 5 (local_rank: 2)\n  exitcode  : 3 (pid: 99)\n  error_file: <N/A>\n  traceback : ...\n=====");
  REQUIRE(g);
  CHECK(g->local_rank == 2);
  CHECK(g->exit_code == 3);
  CHECK(g->signal == 0);

  // No summary: torchrun itself failed (bad arguments, an import error), or someone else's text.
  CHECK_FALSE(parse_torchrun_failure("torchrun: error: unrecognized arguments: --bogus"));
  CHECK_FALSE(parse_torchrun_failure(""));
  CHECK_FALSE(parse_torchrun_failure("Root Cause (first observed failure):\n[0]:\n  rank : 1 (local_rank: x)"));
  CHECK_FALSE(parse_torchrun_failure("  rank : 1 (local_rank: 1)\n  exitcode  : 999999 (pid: 1)"));
}

TEST_CASE("descendants are followed through every level of a process table") {
  const std::vector<ProcessEntry> table = {{10, 1}, {11, 10}, {12, 10}, {13, 12}, {20, 1}, {21, 20}};
  auto d = descendants(table, 10);
  std::sort(d.begin(), d.end());
  CHECK(d == std::vector<pid_t>{11, 12, 13});
  CHECK(descendants(table, 13).empty());
  // A table read while processes came and went may hold a cycle: it ends.
  CHECK(descendants({{1, 2}, {2, 1}}, 1) == std::vector<pid_t>{2});
}

TEST_CASE("the rank processes are torchrun's topmost descendants with each LOCAL_RANK") {
  TempDir tmp("railyard-torchrun-test");
  // "torchrun" (no LOCAL_RANK) starts rank 0 directly and rank 1 as a shell with a child of its own (a DataLoader
  // worker inherits its rank's LOCAL_RANK); nobody is rank 2.
  const pid_t root = spawn_shell(
      "LOCAL_RANK=0 sleep 30 & echo $! > $OUT/r0; "
      "LOCAL_RANK=1 sh -c 'sleep 30 & echo $! > $OUT/r1child; wait' & echo $! > $OUT/r1; wait",
      tmp.path);
  REQUIRE(wait_for(
      [&] { return written(tmp.path / "r0") && written(tmp.path / "r1") && written(tmp.path / "r1child"); }, 10));
  const pid_t r0 = std::stoi(slurp(tmp.path / "r0"));
  const pid_t r1 = std::stoi(slurp(tmp.path / "r1"));
  const pid_t r1child = std::stoi(slurp(tmp.path / "r1child"));
  CHECK(local_rank_of(r0) == 0);
  CHECK(local_rank_of(r1child) == 1);
  CHECK(local_rank_of(root) == -1);
  CHECK(find_rank_processes(root, 3) == std::vector<pid_t>{r0, r1, -1});
  ::kill(-root, SIGKILL);
  ::waitpid(root, nullptr, 0);
}

TEST_CASE("a worker's whole tree ends with it, processes in sessions of their own included") {
  TempDir tmp("railyard-torchrun-test");
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0);  // as the agent in torchrun mode
  AgentConfig cfg;                                            // no metrics endpoint
  AgentMetrics metrics(cfg);
  WorkerGroup group(std::chrono::milliseconds(300), metrics, nullptr, nullptr);
  group.set_end_process_tree(true);
  const std::string script = "setsid sleep 30 & echo $! > " + (tmp.path / "away").string() + "; sleep 30 & echo $! > " +
                             (tmp.path / "near").string() + "; wait";
  RankLaunch launch;
  launch.env = {"PATH=/usr/bin:/bin"};
  group.start(1, {"/bin/sh", "-c", script}, {launch});
  REQUIRE(wait_for([&] { return written(tmp.path / "away") && written(tmp.path / "near"); }, 10));
  const pid_t away = std::stoi(slurp(tmp.path / "away"));  // setsid: neither in the worker's group nor its session
  const pid_t near = std::stoi(slurp(tmp.path / "near"));
  REQUIRE(alive(away));
  group.stop(SIGTERM, nullptr);
  CHECK_FALSE(alive(near));
  CHECK_FALSE(alive(away));

  // The worker died first (torchrun killed on its own): what it left is the agent's child now, and ends at stop().
  group.start(2, {"/bin/sh", "-c", "setsid sleep 30 & echo $! > " + (tmp.path / "orphan").string()}, {launch});
  REQUIRE(wait_for([&] { return written(tmp.path / "orphan"); }, 10));
  const pid_t orphan = std::stoi(slurp(tmp.path / "orphan"));
  REQUIRE(wait_for(
      [&] {
        group.reap("exited");
        return !group.any_running();
      },
      10));
  CHECK(alive(orphan));  // orphaned onto this process (the subreaper), still running
  group.stop(SIGTERM, nullptr);
  CHECK_FALSE(alive(orphan));
  ::prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
}
