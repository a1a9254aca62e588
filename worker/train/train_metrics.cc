#include "worker/train/train_metrics.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/metrics/job_labels.h"
#include "common/metrics/worker_series.h"

namespace railyard::worker {

TrainMetrics::TrainMetrics(metrics::Registry& r, const metrics::Labels& l)
    : step_(r.gauge(metrics::worker_series::kStep, "Last completed training step.").add(l)),
      total_steps_(r.gauge("railyard_worker_total_steps", "Steps the run is configured for.").add(l)),
      steps_total_(r.counter(metrics::worker_series::kStepsTotal, "Optimizer steps taken by this process.").add(l)),
      last_step_ts_(r.gauge(metrics::worker_series::kLastStepTimestamp, "When the last step completed.").add(l)),
      step_seconds_(r.histogram(metrics::worker_series::kStepDuration, "Wall time of one training step.",
                                metrics::worker_series::step_duration_buckets())
                        .add(l)),
      loss_(r.gauge(metrics::worker_series::kLoss, "Training loss of the last step (NaN when non-finite).").add(l)),
      val_loss_(r.gauge("railyard_worker_validation_loss", "Loss of the last validation.").add(l)),
      lr_(r.gauge("railyard_worker_learning_rate", "Learning rate of the last step.").add(l)),
      grad_norm_(r.gauge("railyard_worker_grad_norm", "Global gradient norm before clipping.").add(l)),
      tokens_per_second_(
          r.gauge(metrics::worker_series::kTokensPerSecond, "Training throughput of the last step.").add(l)),
      flops_per_second_(
          r.gauge("railyard_worker_flops_per_second", "Model FLOP/s of the last step (6N + 12LCT per token).").add(l)),
      mfu_(
          r.gauge("railyard_worker_mfu_ratio", "FLOP/s of the last step over the peak it is measured against.").add(l)),
      nonfinite_(
          r.counter(metrics::worker_series::kNonfiniteTotal, "Steps with a non-finite loss or gradient.").add(l)),
      paused_(
          r.gauge(metrics::worker_series::kPaused,
                  "1 while the rank runs a pass that completes no training step (validation, samples, a synchronous "
                  "checkpoint); the stall rules then wait hangTimeoutSeconds.")
              .add(l)),
      pause_end_(r.gauge(metrics::worker_series::kPauseEndTimestamp,
                         "When the rank's last pause ended (0: none yet); the stall rules count it as progress.")
                     .add(l)) {
  paused_.set(0);  // present from the start, as a 0 (not paused), like every series of this process
  auto& phases = r.counter(metrics::worker_series::kStepPhaseSecondsTotal,
                           "Step wall time by phase: compute, tp_comm (tensor-parallel all-reduces), pp_wait (pipeline "
                           "recv/send waits), dp_comm (data-parallel reduction not hidden by backward), optimizer.");
  auto with = [&](const char* phase) {
    metrics::Labels x = l;
    x["phase"] = phase;
    return &phases.add(x);
  };
  phase_compute_ = with("compute");
  phase_tp_ = with("tp_comm");
  phase_pp_ = with("pp_wait");
  phase_dp_ = with("dp_comm");
  phase_opt_ = with("optimizer");
}

void TrainMetrics::on_step(const StepResult& res, int64_t total_steps) {
  step_.set(static_cast<double>(res.step + 1));
  total_steps_.set(static_cast<double>(total_steps));
  steps_total_.increment();
  last_step_ts_.set_to_current_time();
  step_seconds_.observe(res.seconds);
  loss_.set(res.loss);
  lr_.set(res.lr);
  grad_norm_.set(res.grad_norm);
  tokens_per_second_.set(res.tokens_per_second);
  flops_per_second_.set(res.flops_per_second);
  mfu_.set(res.mfu);
  if (res.skipped) nonfinite_.increment();
  phase_compute_->increment(std::max(0.0, res.times.compute));
  phase_tp_->increment(std::max(0.0, res.times.tp_comm));
  phase_pp_->increment(std::max(0.0, res.times.pp_wait));
  phase_dp_->increment(std::max(0.0, res.times.dp_comm));
  phase_opt_->increment(std::max(0.0, res.times.optimizer));
}

void TrainMetrics::on_validation(double val_loss) { val_loss_.set(val_loss); }

TrainMetrics::Pause::Pause(TrainMetrics* m) : m_(m) {
  if (m_ != nullptr) m_->paused_.set(1);
}
TrainMetrics::Pause::~Pause() {
  if (m_ == nullptr) return;
  m_->pause_end_.set_to_current_time();
  m_->paused_.set(0);
}

metrics::Labels TrainMetrics::labels_from_env() {
  return {{metrics::kNamespaceLabel, env_or("RAILYARD_JOB_NAMESPACE", "")},
          {metrics::kTrainingJobLabel, env_or("RAILYARD_JOB_NAME", "")},
          {"generation", env_or("RAILYARD_GENERATION", "")},
          {"rank", env_or("RANK", "0")},
          {"node", env_or("RAILYARD_NODE_NAME", "")}};
}

}  // namespace railyard::worker
