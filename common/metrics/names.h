// Every metric Railyard serves: its name and its type, defined once (docs/monitor.md "metric contract"). The producer
// registers the family with the typed name (metrics::Registry takes a CounterName, GaugeName or HistogramName, so a
// name cannot be served as another type), and every reader in C++ (railyard-monitor, `railyard report`) builds its
// selectors from the same constants. The recording and alert rules, the dashboards and the docs are checked against
// this file by tools/contracts_check (ctest `contracts_check`): an unknown railyard_* name there, a _bucket/_sum/_count
// of something that is not a histogram, or a name defined twice fails the test; tests/unit/common/metric_names_test.cc
// checks the list itself (unique names, the naming rules).
#pragma once

#include <string>
#include <vector>

namespace railyard::metrics {

enum class Type { Counter, Gauge, Histogram };

template <Type T>
struct Name {
  const char* name;
  static constexpr Type type = T;
};
using CounterName = Name<Type::Counter>;
using GaugeName = Name<Type::Gauge>;
using HistogramName = Name<Type::Histogram>;

// A name with its type, for the list of all of them.
struct AnyName {
  const char* name;
  Type type;
};
template <Type T>
constexpr AnyName any(Name<T> n) {
  return {n.name, T};
}

// The series a histogram is served as (what a reader selects).
inline std::string sum_series(HistogramName h) { return std::string(h.name) + "_sum"; }
inline std::string count_series(HistogramName h) { return std::string(h.name) + "_count"; }
inline std::string bucket_series(HistogramName h) { return std::string(h.name) + "_bucket"; }

std::vector<double> exponential_buckets(double start, double factor, int count);  // metrics.h

namespace names {

// --- The per-rank series of a training process: served by the built-in trainer (worker/train/train_metrics.cc) and,
// for a program, by its pod agent from the ranks' progress files and output (worker/agent/rank_exporter.cc); read by
// railyard-monitor (monitor/rules.cc), the recording rules (deploy/prometheus/rules/), the dashboards and
// `railyard report`. Every series carries the job's labels (job_labels.h), `rank` and `generation`.
inline constexpr GaugeName kWorkerStep{"railyard_worker_step"};                 // last completed step
inline constexpr CounterName kWorkerStepsTotal{"railyard_worker_steps_total"};  // steps in this process/generation
inline constexpr GaugeName kWorkerTotalSteps{"railyard_worker_total_steps"};    // steps the run is configured for
inline constexpr GaugeName kWorkerLastStepTimestamp{"railyard_worker_last_step_timestamp_seconds"};
// Wall time per training step. The recording rules and the monitor read its _sum and _count (mean step time over a
// window), so it is a histogram wherever it is served; a source that sees k steps at once (a progress record that
// skips steps) observes their mean k times, so _sum/_count stays the true mean.
inline constexpr HistogramName kWorkerStepDuration{"railyard_worker_step_duration_seconds"};
inline constexpr GaugeName kWorkerLoss{"railyard_worker_loss"};  // NaN when non-finite
inline constexpr GaugeName kWorkerValidationLoss{"railyard_worker_validation_loss"};
inline constexpr GaugeName kWorkerLearningRate{"railyard_worker_learning_rate"};
inline constexpr GaugeName kWorkerGradNorm{"railyard_worker_grad_norm"};
inline constexpr GaugeName kWorkerTokensPerSecond{"railyard_worker_tokens_per_second"};
inline constexpr GaugeName kWorkerFlopsPerSecond{"railyard_worker_flops_per_second"};
inline constexpr GaugeName kWorkerMfuRatio{"railyard_worker_mfu_ratio"};
inline constexpr CounterName kWorkerNonfiniteTotal{"railyard_worker_nonfinite_total"};
inline constexpr CounterName kWorkerStepPhaseSecondsTotal{"railyard_worker_step_phase_seconds_total"};   // `phase`
inline constexpr GaugeName kWorkerLastOutputTimestamp{"railyard_worker_last_output_timestamp_seconds"};  // agent
// Agent, for a program's ranks: when the agent first saw the rank's process stopped (state T or t in
// /proc/<pid>/stat: SIGSTOP, SIGTSTP, a debugger holding it), 0 while it runs. A stopped process makes no progress
// and answers nothing; the monitor's `stopped` rule finds it in seconds, naming the rank.
inline constexpr GaugeName kWorkerProcessStoppedSince{"railyard_worker_process_stopped_since_timestamp_seconds"};
// Agent, for a program's ranks: since when the rank's process tree has used no CPU time (utime + stime of the
// process, its live descendants and their reaped children in /proc advancing by less than 1 % of the agent's poll
// interval), 0 while it computes. A rank blocked for good (a deadlock, a lost peer, a sleep) stops using CPU first,
// its peers at their next collective; the monitor's `idle` rule finds a job whose every rank is idle, naming the one
// that went idle first.
inline constexpr GaugeName kWorkerCpuIdleSince{"railyard_worker_cpu_idle_since_timestamp_seconds"};
// Trainer: the rank runs a pass that completes no step (validation, samples, a synchronous checkpoint), and when its
// last such pass ended.
inline constexpr GaugeName kWorkerPaused{"railyard_worker_paused"};
inline constexpr GaugeName kWorkerPauseEndTimestamp{"railyard_worker_pause_end_timestamp_seconds"};
// The step-time buckets both sources use: 10 ms to about 82 s, doubling.
inline std::vector<double> worker_step_duration_buckets() { return exponential_buckets(0.01, 2, 14); }

// --- Checkpoints (worker/train/checkpointing.cc); the last-checkpoint pair is read by the monitor's age rule.
inline constexpr HistogramName kCheckpointSnapshotSeconds{"railyard_checkpoint_snapshot_seconds"};
inline constexpr HistogramName kCheckpointStallSeconds{"railyard_checkpoint_stall_seconds"};
inline constexpr HistogramName kCheckpointPersistSeconds{"railyard_checkpoint_persist_seconds"};
inline constexpr HistogramName kCheckpointMemorySnapshotSeconds{"railyard_checkpoint_memory_snapshot_seconds"};
inline constexpr GaugeName kCheckpointSaveBytes{"railyard_checkpoint_save_bytes"};
inline constexpr CounterName kCheckpointSavesTotal{"railyard_checkpoint_saves_total"};  // `result`
inline constexpr GaugeName kCheckpointRestoreSeconds{"railyard_checkpoint_restore_seconds"};
inline constexpr GaugeName kCheckpointRestoreBytes{"railyard_checkpoint_restore_bytes"};
inline constexpr GaugeName kCheckpointRestoredStep{"railyard_checkpoint_restored_step"};
inline constexpr GaugeName kCheckpointRestoredFromMemory{"railyard_checkpoint_restored_from_memory"};
inline constexpr GaugeName kCheckpointLastStep{"railyard_checkpoint_last_step"};
inline constexpr GaugeName kCheckpointLastTimestamp{"railyard_checkpoint_last_timestamp_seconds"};

// --- The pod agent (worker/agent/agent_metrics.cc).
inline constexpr GaugeName kAgentGeneration{"railyard_agent_generation"};
inline constexpr CounterName kAgentGenerationsTotal{"railyard_agent_generations_total"};
inline constexpr HistogramName kAgentRendezvousWaitSeconds{"railyard_agent_rendezvous_wait_seconds"};
inline constexpr CounterName kAgentWorkerStartsTotal{"railyard_agent_worker_starts_total"};
inline constexpr CounterName kAgentWorkerExitsTotal{"railyard_agent_worker_exits_total"};  // `outcome`
inline constexpr CounterName kAgentRendezvousErrorsTotal{"railyard_agent_rendezvous_errors_total"};
inline constexpr HistogramName kAgentPeerCopySeconds{"railyard_agent_peer_copy_seconds"};
inline constexpr CounterName kAgentPeerCopyBytesTotal{"railyard_agent_peer_copy_bytes_total"};
inline constexpr CounterName kAgentPeerCopyErrorsTotal{"railyard_agent_peer_copy_errors_total"};

// --- The operator (operator/controller/controller.cc, placement.cc, main.cc).
inline constexpr GaugeName kOperatorLeader{"railyard_operator_leader"};
inline constexpr GaugeName kOperatorJobs{"railyard_operator_jobs"};                       // `phase`
inline constexpr CounterName kOperatorRestartsTotal{"railyard_operator_restarts_total"};  // `reason`
inline constexpr CounterName kOperatorReconcileErrorsTotal{"railyard_operator_reconcile_errors_total"};
inline constexpr HistogramName kOperatorPlacementSeconds{"railyard_operator_placement_seconds"};
inline constexpr HistogramName kOperatorPlacementHops{"railyard_operator_placement_hops"};
inline constexpr HistogramName kOperatorRecoverySeconds{"railyard_operator_recovery_seconds"};    // `reason`
inline constexpr HistogramName kOperatorDetectionSeconds{"railyard_operator_detection_seconds"};  // `symptom`
// A job's goodput ledger (status.goodput, operator/controller/goodput.h): seconds by `cause`, as of its last status
// write.
inline constexpr GaugeName kOperatorJobSeconds{"railyard_operator_job_seconds"};  // `cause`
// controller-runtime's names and meanings, so that dashboards made for Kubebuilder operators read ours.
inline constexpr GaugeName kWorkqueueDepth{"workqueue_depth"};
inline constexpr CounterName kWorkqueueAddsTotal{"workqueue_adds_total"};
inline constexpr CounterName kWorkqueueRetriesTotal{"workqueue_retries_total"};
inline constexpr CounterName kControllerRuntimeReconcileTotal{"controller_runtime_reconcile_total"};
inline constexpr CounterName kControllerRuntimeReconcileErrorsTotal{"controller_runtime_reconcile_errors_total"};
inline constexpr HistogramName kControllerRuntimeReconcileTimeSeconds{"controller_runtime_reconcile_time_seconds"};

// --- railyard-monitor (monitor/monitor.cc).
inline constexpr CounterName kMonitorEvaluationsTotal{"railyard_monitor_evaluations_total"};
inline constexpr CounterName kMonitorVerdictsTotal{"railyard_monitor_verdicts_total"};         // `rule`, `reason`
inline constexpr CounterName kMonitorQueryErrorsTotal{"railyard_monitor_query_errors_total"};  // `source`
inline constexpr CounterName kMonitorWebhookRequestsTotal{"railyard_monitor_webhook_requests_total"};  // `code`
inline constexpr HistogramName kMonitorDetectionLatencySeconds{"railyard_monitor_detection_latency_seconds"};
inline constexpr HistogramName kMonitorEvaluationDurationSeconds{"railyard_monitor_evaluation_duration_seconds"};
inline constexpr CounterName kMonitorRejectedSeriesTotal{"railyard_monitor_rejected_series_total"};
inline constexpr GaugeName kMonitorSeries{"railyard_monitor_series"};
inline constexpr GaugeName kMonitorLeader{"railyard_monitor_leader"};

// Prometheus' own per-target health series, which the monitor reads (not served by Railyard).
inline constexpr GaugeName kUp{"up"};

// Every name above, once (tools/contracts_check checks that none is missing here).
inline constexpr AnyName kAll[] = {
    any(kWorkerStep),
    any(kWorkerStepsTotal),
    any(kWorkerTotalSteps),
    any(kWorkerLastStepTimestamp),
    any(kWorkerStepDuration),
    any(kWorkerLoss),
    any(kWorkerValidationLoss),
    any(kWorkerLearningRate),
    any(kWorkerGradNorm),
    any(kWorkerTokensPerSecond),
    any(kWorkerFlopsPerSecond),
    any(kWorkerMfuRatio),
    any(kWorkerNonfiniteTotal),
    any(kWorkerStepPhaseSecondsTotal),
    any(kWorkerLastOutputTimestamp),
    any(kWorkerProcessStoppedSince),
    any(kWorkerCpuIdleSince),
    any(kWorkerPaused),
    any(kWorkerPauseEndTimestamp),
    any(kCheckpointSnapshotSeconds),
    any(kCheckpointStallSeconds),
    any(kCheckpointPersistSeconds),
    any(kCheckpointMemorySnapshotSeconds),
    any(kCheckpointSaveBytes),
    any(kCheckpointSavesTotal),
    any(kCheckpointRestoreSeconds),
    any(kCheckpointRestoreBytes),
    any(kCheckpointRestoredStep),
    any(kCheckpointRestoredFromMemory),
    any(kCheckpointLastStep),
    any(kCheckpointLastTimestamp),
    any(kAgentGeneration),
    any(kAgentGenerationsTotal),
    any(kAgentRendezvousWaitSeconds),
    any(kAgentWorkerStartsTotal),
    any(kAgentWorkerExitsTotal),
    any(kAgentRendezvousErrorsTotal),
    any(kAgentPeerCopySeconds),
    any(kAgentPeerCopyBytesTotal),
    any(kAgentPeerCopyErrorsTotal),
    any(kOperatorLeader),
    any(kOperatorJobs),
    any(kOperatorRestartsTotal),
    any(kOperatorReconcileErrorsTotal),
    any(kOperatorPlacementSeconds),
    any(kOperatorPlacementHops),
    any(kOperatorRecoverySeconds),
    any(kOperatorDetectionSeconds),
    any(kOperatorJobSeconds),
    any(kWorkqueueDepth),
    any(kWorkqueueAddsTotal),
    any(kWorkqueueRetriesTotal),
    any(kControllerRuntimeReconcileTotal),
    any(kControllerRuntimeReconcileErrorsTotal),
    any(kControllerRuntimeReconcileTimeSeconds),
    any(kMonitorEvaluationsTotal),
    any(kMonitorVerdictsTotal),
    any(kMonitorQueryErrorsTotal),
    any(kMonitorWebhookRequestsTotal),
    any(kMonitorDetectionLatencySeconds),
    any(kMonitorEvaluationDurationSeconds),
    any(kMonitorRejectedSeriesTotal),
    any(kMonitorSeries),
    any(kMonitorLeader),
    any(kUp),
};

}  // namespace names

}  // namespace railyard::metrics
