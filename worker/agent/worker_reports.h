// What the agent tells the rendezvous service about its workers (docs/rendezvous.md "POST /v1/exit",
// "POST /v1/progress"): every exit, queued and delivered at once (kept while the service is unreachable or has
// forgotten the job), and each rank's newest step from its progress file. For a program's ranks it also feeds the
// agent-served series (RankExporter) from the same progress file and output.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "common/rendezvous_protocol.h"
#include "worker/agent/hang_watch.h"
#include "worker/agent/output_watch.h"
#include "worker/agent/rank_exporter.h"
#include "worker/agent/rendezvous_client.h"
#include "worker/agent/torchrun_launch.h"
#include "worker/agent/worker_group.h"

namespace railyard::worker {

// Whether process `pid` is stopped (state T or t in /proc/<pid>/stat: SIGSTOP, SIGTSTP, a tracer); nullopt when the
// process is gone or its stat unreadable.
std::optional<bool> process_stopped(pid_t pid);

// What /proc/<pid>/stat says of a process: whether it is stopped (as process_stopped) and the CPU time it and the
// children it reaped have used (utime + stime + cutime + cstime, in seconds); nullopt when it cannot be read (gone).
struct ProcessStat {
  bool stopped = false;
  double cpu_seconds = 0;
};
std::optional<ProcessStat> process_stat(pid_t pid);
// The CPU time of `pid` and of every live descendant in `table` (list_processes): a rank whose command is a shell
// (`sh -c "python train.py"`) computes in a child, and a DataLoader's workers are children too. nullopt when gone.
std::optional<double> tree_cpu_seconds(pid_t pid, const std::vector<ProcessEntry>& table);

class WorkerReports {
 public:
  // ranks_out: null unless the agent serves its ranks' series. output: the ranks' output (a failed rank's exit report
  // carries its last words from it); null in tests without one.
  WorkerReports(RendezvousClient& client, rdzv::JobRef ref, RankExporter* ranks_out, OutputWatch* output);

  // torchrun mode: the one worker is the pod's torchrun, which runs `local_ranks` ranks. Its exit is reported per rank
  // as the service counts them: every rank once when it succeeded (torchrun exits 0 only when all did) or was stopped,
  // and when it failed, the rank its failure summary names with that rank's exit code or signal (local rank 0 and
  // torchrun's own code when the summary is missing: torchrun itself failed). Every rank's output clock is the
  // pod's: the ranks write to torchrun's streams.
  void set_torchrun(int local_ranks) { torchrun_ranks_ = local_ranks; }

  // A new generation: reports carry its number; what was queued for the previous one is dropped.
  void start_generation(int64_t generation);

  // Queues the exit report of w (reason: rdzv::kExitExited, kExitStopped, ...). A failed exit's report carries the
  // rank's last output lines (waiting briefly for the rest of its output to arrive).
  void exited(const Worker& w, const char* reason);
  bool pending() const { return !pending_.empty(); }
  // torchrun mode: torchrun said local rank `local_rank` failed (its "failed (exitcode: ...)" line, `message`), while
  // it still runs: reported as that rank's exit now, not when torchrun exits.
  void rank_failed(int local_rank, int exit_code, int signal, std::string message);

  // Sends queued exit reports; keeps those that could not be delivered. Stops at the first unreachable answer so
  // that a dead service costs one call's retries, not one per report.
  void flush();

  // Forwards each worker's newest progress record (a step not forwarded before; w.last_step keeps track), and shows
  // each running worker to the hang watch: a rank it finds hung is reported (reason "hung") as if it had exited.
  void forward_progress(std::vector<Worker>& workers);

  // The agent's hang detection (hang_watch.h); off until set (torchrun mode keeps it off: its one worker is torchrun,
  // not a rank).
  void watch_hangs(const HangPolicy& p) { hangs_.emplace(p); }

 private:
  RendezvousClient& client_;
  rdzv::JobRef ref_;
  RankExporter* ranks_out_;
  OutputWatch* output_;
  int64_t generation_ = 0;
  std::vector<rdzv::ExitReport> pending_;
  int torchrun_ranks_ = 0;  // 0: one worker per rank
  std::optional<HangWatch> hangs_;
  // Queues a hung rank's report (rank still running: exit code and signal 0).
  void hung(const Worker& w, const HangVerdict& v);
};

}  // namespace railyard::worker
