#include "worker/train/train_metrics.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/flash_checkpoint.h"
#include "common/metrics/job_labels.h"
#include "common/metrics/names.h"
#include "common/pod_env.h"

namespace railyard::worker {

TrainMetrics::TrainMetrics(metrics::Registry& r, const metrics::Labels& l)
    : step_(r.gauge(metrics::names::kWorkerStep, "Last completed training step.").add(l)),
      total_steps_(r.gauge(metrics::names::kWorkerTotalSteps, "Steps the run is configured for.").add(l)),
      steps_total_(r.counter(metrics::names::kWorkerStepsTotal, "Optimizer steps taken by this process.").add(l)),
      last_step_ts_(r.gauge(metrics::names::kWorkerLastStepTimestamp, "When the last step completed.").add(l)),
      step_seconds_(r.histogram(metrics::names::kWorkerStepDuration, "Wall time of one training step.",
                                metrics::names::worker_step_duration_buckets())
                        .add(l)),
      loss_(r.gauge(metrics::names::kWorkerLoss, "Training loss of the last step (NaN when non-finite).").add(l)),
      val_loss_(r.gauge(metrics::names::kWorkerValidationLoss, "Loss of the last validation.").add(l)),
      lr_(r.gauge(metrics::names::kWorkerLearningRate, "Learning rate of the last step.").add(l)),
      grad_norm_(r.gauge(metrics::names::kWorkerGradNorm, "Global gradient norm before clipping.").add(l)),
      tokens_per_second_(
          r.gauge(metrics::names::kWorkerTokensPerSecond, "Training throughput of the last step.").add(l)),
      flops_per_second_(
          r.gauge(metrics::names::kWorkerFlopsPerSecond, "Model FLOP/s of the last step (6N + 12LCT per token).")
              .add(l)),
      mfu_(r.gauge(metrics::names::kWorkerMfuRatio, "FLOP/s of the last step over the peak it is measured against.")
               .add(l)),
      nonfinite_(r.counter(metrics::names::kWorkerNonfiniteTotal, "Steps with a non-finite loss or gradient.").add(l)),
      paused_(
          r.gauge(metrics::names::kWorkerPaused,
                  "1 while the rank runs a pass that completes no training step (validation, samples, a synchronous "
                  "checkpoint); the stall rules then wait hangTimeoutSeconds.")
              .add(l)),
      pause_end_(r.gauge(metrics::names::kWorkerPauseEndTimestamp,
                         "When the rank's last pause ended (0: none yet); the stall rules count it as progress.")
                     .add(l)) {
  paused_.set(0);  // present from the start, as a 0 (not paused), like every series of this process
  auto& phases = r.counter(metrics::names::kWorkerStepPhaseSecondsTotal,
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
  if (m_ == nullptr || m_->pause_depth_++ > 0) return;
  m_->paused_.set(1);
  if (m_->pause_listener_) m_->pause_listener_(true);
}
TrainMetrics::Pause::~Pause() {
  if (m_ == nullptr || --m_->pause_depth_ > 0) return;
  m_->pause_end_.set_to_current_time();
  m_->paused_.set(0);
  if (m_->pause_listener_) m_->pause_listener_(false);
}

metrics::Labels TrainMetrics::labels_from_env() {
  return {{metrics::kNamespaceLabel, env_or(pod_env::kJobNamespace, "")},
          {metrics::kTrainingJobLabel, env_or(pod_env::kJobName, "")},
          {"generation", env_or(flash::kGenerationEnv, "")},
          {"rank", env_or(pod_env::kRank, "0")},
          {"node", env_or(pod_env::kNodeName, "")}};
}

}  // namespace railyard::worker
