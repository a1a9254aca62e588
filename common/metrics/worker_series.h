// The per-rank series of a training process (docs/monitor.md "metric contract"): one name and one type each, served
// by the built-in trainer (worker/train/train_metrics.cc) and, for a program, by its pod agent from the ranks'
// progress files and output (worker/agent/rank_exporter.cc); read by railyard-monitor (monitor/rules.cc), the
// recording rules (deploy/prometheus/rules/), the dashboards and `railyard report`. Every series also carries the
// job's labels (job_labels.h), `rank` and `generation`.
#pragma once

#include <vector>

#include "common/metrics/metrics.h"

namespace railyard::metrics::worker_series {

inline constexpr const char* kStep = "railyard_worker_step";               // gauge: last completed step
inline constexpr const char* kStepsTotal = "railyard_worker_steps_total";  // counter: steps in this process/generation
inline constexpr const char* kLastStepTimestamp = "railyard_worker_last_step_timestamp_seconds";  // gauge
// Histogram: wall time per training step. The recording rules and the monitor read its _sum and _count (mean step
// time over a window), so it is a histogram wherever it is served; a source that sees k steps at once (a progress
// record that skips steps) observes their mean k times, so _sum/_count stays the true mean.
inline constexpr const char* kStepDuration = "railyard_worker_step_duration_seconds";
inline constexpr const char* kLoss = "railyard_worker_loss";                          // gauge, NaN when non-finite
inline constexpr const char* kTokensPerSecond = "railyard_worker_tokens_per_second";  // gauge
inline constexpr const char* kNonfiniteTotal = "railyard_worker_nonfinite_total";     // counter
inline constexpr const char* kStepPhaseSecondsTotal = "railyard_worker_step_phase_seconds_total";  // counter, `phase`
inline constexpr const char* kLastOutputTimestamp = "railyard_worker_last_output_timestamp_seconds";  // gauge (agent)
// Gauge (agent, for a program's ranks): when the agent first saw the rank's process stopped (state T or t in
// /proc/<pid>/stat: SIGSTOP, SIGTSTP, a debugger holding it), 0 while it runs. A stopped process makes no progress
// and answers nothing; the monitor's `stopped` rule finds it in seconds, naming the rank.
inline constexpr const char* kProcessStoppedSince = "railyard_worker_process_stopped_since_timestamp_seconds";
// Gauge (agent, for a program's ranks): since when the rank's process tree has used no CPU time (utime + stime of the
// process, its live descendants and their reaped children in /proc advancing by less than 1 % of the agent's poll
// interval), 0 while it computes. A rank
// blocked for good (a deadlock, a lost peer, a sleep) stops using CPU first, its peers at their next collective; the
// monitor's `idle` rule finds a job whose every rank is idle, naming the one that went idle first.
inline constexpr const char* kCpuIdleSince = "railyard_worker_cpu_idle_since_timestamp_seconds";
inline constexpr const char* kPaused = "railyard_worker_paused";                                  // gauge (trainer)
inline constexpr const char* kPauseEndTimestamp = "railyard_worker_pause_end_timestamp_seconds";  // gauge (trainer)

// The step-time buckets both sources use: 10 ms to about 82 s, doubling.
inline std::vector<double> step_duration_buckets() { return exponential_buckets(0.01, 2, 14); }

}  // namespace railyard::metrics::worker_series
