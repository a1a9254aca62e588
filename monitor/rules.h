// Health rules over per-rank observations of a TrainingJob. Pure logic (time is passed in), so every rule, its
// debounce and the once-per-generation guarantee are unit-tested on synthetic series. docs/monitor.md describes the
// rules and their defaults.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/restart_request.h"
#include "common/wellknown.h"
#include "monitor/samples.h"

namespace railyard::monitor {

struct Policy {
  double hang_timeout_s = 300;  // spec.failurePolicy.hangTimeoutSeconds: upper bound of the stall threshold
  // stall threshold = min(hang_timeout, max(stall_factor x typical step, stall_floor)). With 1 s evaluations and 1 s
  // scrapes this detects a hang within max(3 step times, 10 s), the goal in docs/monitor.md.
  double stall_factor = 2;
  double stall_floor_s = 6;
  // A rank whose process the agent saw stopped (railyard_worker_process_stopped_since_timestamp_seconds) this long is
  // a Hang of that rank (the `stopped` rule); 0 turns the rule off (monitor flag --stopped-seconds).
  double stopped_s = 2;
  // Every rank of the world using no CPU (railyard_worker_cpu_idle_since_timestamp_seconds, served by a program's
  // agent) this long, with no step reported meanwhile, is a Hang (the `idle` rule), naming the rank that went idle
  // first; 0 turns the rule off (monitor flag --idle-seconds).
  double idle_s = 15;
  int world_size = 0;             // status.world.size of the job (0: unknown, and the idle rule waits)
  double straggler_factor = 2.0;  // spec.failurePolicy.stragglerFactor (vs the median of the other ranks)
  double straggler_window_s = 30;
  double unreachable_s = 30;  // a rank's target down or its series gone for this long
  int loss_window = 20;       // losses of the last N steps per rank
  int loss_min_points = 10;
  double loss_spike_z = 6;
  double loss_spike_ratio = 1.5;
  int checkpoint_interval_steps = 0;  // spec.checkpoint.intervalSteps; 0: no checkpoint rule
  double checkpoint_max_age_s = 0;    // 0: max(3 x intervalSteps x typical step, checkpoint_age_floor)
  double checkpoint_age_floor_s = 600;
  int debounce_evals = 2;  // consecutive evaluations a count-based condition must hold
  bool exclude_failed_nodes = true;
};

// The defaults overlaid with the job's spec (failurePolicy, checkpoint). Fields of the wrong type are ignored (the
// CRD schema already refuses them).
Policy policy_for_job(const nlohmann::json& job, const Policy& defaults);

inline double nan_value() { return std::numeric_limits<double>::quiet_NaN(); }

// The straggler rule's compute time per step is a rate over this many seconds of evaluations.
inline constexpr double kComputeHorizonS = 5;

struct RankObs {
  int rank = -1;
  std::string node;
  std::string generation;  // the series' generation label ("" when absent)
  bool reachable = true;   // false: the scrape target is down
  double step = nan_value();
  double last_step_ts = nan_value();
  double duration_sum = nan_value();  // else the histogram's _sum and _count
  double duration_count = nan_value();
  // Cumulative compute seconds (railyard_worker_step_phase_seconds_total{phase="compute"}) and optimizer steps
  // (railyard_worker_steps_total): time a rank spends on its own work, without the waits in collectives. In
  // synchronous data parallelism every rank's step takes the same wall time (the fast ones wait for the slow one), so
  // only this tells the straggler from the ranks that wait for it.
  double compute_total = nan_value();
  double steps_total = nan_value();
  double loss = nan_value();
  bool loss_present = false;  // a NaN loss and a missing loss both read as NaN
  double nonfinite_total = nan_value();
  double checkpoint_step = nan_value();
  double checkpoint_ts = nan_value();
  // When the rank last wrote to stdout/stderr (railyard_worker_last_output_timestamp_seconds, served by the agent of
  // a program's pod): the silence rule's only sign of life of a program that reports no steps.
  double last_output_ts = nan_value();
  // railyard_worker_paused: the rank runs a pass that completes no step (validation, samples, a synchronous
  // checkpoint), and when its last such pass ended (railyard_worker_pause_end_timestamp_seconds).
  bool paused = false;
  double pause_end_ts = nan_value();
  // When the agent first saw the rank's process stopped; 0 while it runs (programs' ranks only: the agent serves it).
  double stopped_since = nan_value();
  // Since when the rank's process has used no CPU time; 0 while it computes (programs' ranks only: the agent serves
  // it).
  double cpu_idle_since = nan_value();
};

struct JobKey {
  std::string ns, name;
  auto operator<=>(const JobKey&) const = default;
};

// Groups worker samples (railyard_worker_*, railyard_checkpoint_last_*, up) by namespace/job and rank. Series
// without namespace, job or an integer rank label are skipped: they are not a training worker's.
std::map<JobKey, std::map<int, RankObs>> group_samples(const std::vector<Sample>& samples);
// The names of the series group_samples reads (common/metrics/names.h; a histogram's _sum and _count): the monitor
// asks Prometheus for these and no others.
std::vector<std::string> read_series();

struct Verdict {
  std::string rule;    // one of rule_names()
  std::string reason;  // the restart reason: Hang, RankUnreachable, Straggler, NonFiniteLoss, LossSpike, ...
  int rank = -1;       // -1: no single rank to blame
  std::string node;
  std::string evidence;
  int64_t generation = 0;
  double onset = 0;  // when the condition started (unix seconds): detection latency = at - onset
  double at = 0;
  bool node_suspect = false;  // the node may be at fault (stall, unreachable, straggler)
  // false: a warning, not a restart (checkpoint_age: restoring the old checkpoint would lose every step since). Once
  // per episode (until the checkpoints catch up), and it does not keep the generation's restart from firing later.
  bool restart = true;
};

class Evaluator {
 public:
  // One evaluation of one job at time `now` (unix seconds). Returns at most one verdict per job and generation:
  // after one fired (or mark_fired was called) the generation stays quiet, and a new generation starts afresh.
  std::optional<Verdict> evaluate(const JobKey& job, int64_t generation, const std::map<int, RankObs>& ranks,
                                  const Policy& policy, double now);
  // A restart was already requested for this generation (read back from the annotation after a monitor restart,
  // or by the Alertmanager path).
  void mark_fired(const JobKey& job, int64_t generation);
  bool fired(const JobKey& job, int64_t generation) const;
  void forget(const JobKey& job);

  // What the evaluator keeps of a job between evaluations, reset by each generation. Public only so that the rule
  // functions in rules.cc can name the parts they own; nothing else uses it.
  struct RankState {  // the bookkeeping pass's, for each rank seen in this generation
    std::string node;
    double down_since = -1;
    int down_evals = 0;
    double prev_sum = nan_value(), prev_count = nan_value();
    double duration = nan_value();
    // (time, compute_total, steps_total) of the last few evaluations: the compute time per step is taken over
    // kComputeHorizonS, as a rate() would, because one evaluation's few steps are too noisy to compare.
    std::deque<std::array<double, 3>> compute_hist;
    double compute = nan_value();  // compute seconds per step over the horizon
  };
  struct StragglerState {  // the straggler rule's, per rank
    double slow_since = -1;
    int slow_evals = 0;
  };
  struct LossState {  // the loss_spike rule's, per rank
    std::vector<double> losses;
    double last_loss_step = nan_value();
    int spike_steps = 0;
  };
  struct CheckpointState {  // the checkpoint_age rule's
    double old_since = -1;
    int old_evals = 0;
    bool warned = false;
  };
  struct JobState {
    int64_t generation = -1;
    bool fired = false;
    double first_seen = -1;
    double max_step = nan_value();
    double progress_at = 0;
    std::map<int, RankState> ranks;
    std::map<int, StragglerState> straggler;
    std::map<int, LossState> loss;
    CheckpointState checkpoint;
  };

 private:
  std::map<JobKey, JobState> jobs_;
};

// The annotation contract (keys, RestartRequest, format and parse) is common/restart_request.h (docs/monitor.md).

// The rules in the order Evaluator::evaluate tries them (docs/monitor.md "The rules"): nonfinite, stopped, idle,
// silence, stall, unreachable, straggler, loss_spike, checkpoint_age. The first that finds something gives the
// verdict and the rules after it are not run in that evaluation.
std::vector<std::string_view> rule_names();

RestartRequest request_from_verdict(const Verdict& v, const std::string& time);

}  // namespace railyard::monitor
