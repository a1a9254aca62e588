// The agent as the metrics endpoint of ranks that serve none themselves: a program's (spec.program) ranks write at
// most a progress file, yet the monitor's rules read railyard_worker_* series per rank. For each local rank the
// agent serves those series on pod_ip:(base port + local rank), the address the monitor scrapes for any worker pod
// (railyard.dev/metrics-port), from what it sees: the rank's progress file and when the rank last wrote to its
// stdout or stderr. The contract for the program is the progress file (docs/programs.md "Progress, status and the
// monitor"); the series are the trainer's (docs/monitor.md "metric contract") plus
// railyard_worker_last_output_timestamp_seconds, which the monitor's silence rule reads when no rank reports steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"

namespace railyard::worker {

// One progress record: what a rank wrote to $RAILYARD_PROGRESS_FILE after a step.
//   {"step": 120, "loss": 2.41, "tokens_per_second": 5120.0, "compute_seconds": 31.5}
// step is required (an integer); the rest optional. loss may be NaN or +-Infinity (Python's json.dump writes them
// as bare NaN / Infinity tokens) or null: a non-finite loss. compute_seconds: cumulative seconds of the rank's own
// work (no waits for other ranks), which lets the straggler rule tell the slow rank from those waiting for it.
struct ProgressRecord {
  int64_t step = 0;
  bool has_loss = false;
  double loss = 0;  // NaN/Inf when the program reported a non-finite loss (has_loss true)
  double tokens_per_second = 0;
  std::optional<double> compute_seconds;
  // Cumulative seconds this process's steps waited for synchronous checkpoint saves, and its checkpoint restore took
  // (the trainer writes both; optional for programs): forwarded to the rendezvous service for the goodput ledger.
  std::optional<double> checkpoint_stall_seconds;
  std::optional<double> restore_seconds;
  // Whether the rank is in a pass that completes no step (validation, samples, a synchronous checkpoint); absent when
  // the rank does not mark its pauses (the agent's hang watch then counts no stall: worker/agent/hang_watch.h).
  std::optional<bool> paused;
};

// Parses the file's text; nullopt when it is not such a record (a torn or foreign file is skipped, not fatal).
std::optional<ProgressRecord> parse_progress(const std::string& text);

class RankExporter {
 public:
  // Binds pod_ip:(base_port + l) for l in [0, local_ranks): throws Error naming the port when one is taken.
  // labels: namespace, job, node (rank and generation are added per generation).
  RankExporter(const std::string& pod_ip, int base_port, int local_ranks, const metrics::Labels& labels);
  ~RankExporter();

  // A new generation: the previous generation's series go, each local rank gets its global rank's, and its output
  // clock starts at `now` (a rank that never writes is silent from its start).
  void start_generation(int64_t generation, const std::vector<int>& global_ranks, double now);
  // A new progress record of local rank l, written at `written` (unix seconds: the file's modification time).
  void on_progress(int local_rank, const ProgressRecord& r, double written);
  // Local rank l last wrote to its stdout or stderr at `when` (unix seconds).
  void on_output(int local_rank, double when);
  // Local rank l's process is (`stopped`) or is not stopped, as seen at `now`: the stopped-since series holds when it
  // was first seen stopped, 0 while it runs.
  void on_process_state(int local_rank, bool stopped, double now);
  // Local rank l's process had used `cpu_seconds` of CPU time (user + system) at `now`: the idle-since series holds
  // the last sample at which that had advanced (by at least 1 % of the time between samples), 0 while it advances;
  // cpu_seconds < 0: the process is gone (exited: not idle, 0).
  void on_process_cpu(int local_rank, double cpu_seconds, double now);

  int port(int local_rank) const;

 private:
  struct Rank;
  std::vector<std::unique_ptr<Rank>> ranks_;
  metrics::Labels labels_;
};

}  // namespace railyard::worker
