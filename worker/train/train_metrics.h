// The trainer's Prometheus series: the same numbers as the per-step log line, plus what the monitor's rules read
// (docs/monitor.md "metric contract"). Labels: namespace, job, generation, rank, node.
#pragma once

#include <functional>

#include "common/metrics/metrics.h"
#include "worker/train/step_result.h"

namespace railyard::worker {

class TrainMetrics {
 public:
  TrainMetrics(metrics::Registry& registry, const metrics::Labels& labels);
  void on_step(const StepResult& r, int64_t total_steps);
  void on_validation(double val_loss);

  // Marks the rank paused (railyard_worker_paused 1) while it lives: validation, samples and the checkpoint hook take
  // longer than a step and report none, and the monitor's and the alerts' stall rules would take them for a hang
  // (docs/monitor.md "Pauses"). Null: no metrics, nothing to mark.
  class Pause {
   public:
    explicit Pause(TrainMetrics* m);
    ~Pause();
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    TrainMetrics* m_;
  };

  // Called with true when the first nested Pause begins and with false when the last ends: the trainer marks its
  // progress file with it, which the pod agent's hang watch reads (worker/agent/hang_watch.h).
  void set_pause_listener(std::function<void(bool paused)> f) { pause_listener_ = std::move(f); }

  // Labels of this process from the agent's environment (RAILYARD_JOB_NAMESPACE, RAILYARD_JOB_NAME,
  // RAILYARD_GENERATION, RANK, RAILYARD_NODE_NAME); missing values become "" (rank "0").
  static metrics::Labels labels_from_env();

 private:
  metrics::Gauge& step_;
  metrics::Gauge& total_steps_;
  metrics::Counter& steps_total_;
  metrics::Gauge& last_step_ts_;
  metrics::Histogram& step_seconds_;
  metrics::Gauge& loss_;
  metrics::Gauge& val_loss_;
  metrics::Gauge& lr_;
  metrics::Gauge& grad_norm_;
  metrics::Gauge& tokens_per_second_;
  metrics::Gauge& flops_per_second_;
  metrics::Gauge& mfu_;
  metrics::Counter& nonfinite_;
  metrics::Gauge& paused_;
  metrics::Gauge& pause_end_;
  int pause_depth_ = 0;  // nested Pauses (the training loop's thread only)
  std::function<void(bool)> pause_listener_;
  // railyard_worker_step_phase_seconds_total{phase}: compute, tp_comm, pp_wait, dp_comm, optimizer.
  metrics::Counter *phase_compute_, *phase_tp_, *phase_pp_, *phase_dp_, *phase_opt_;
};

}  // namespace railyard::worker
