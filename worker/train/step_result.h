// What one optimizer step reports: the trainer returns it, the log line, the metrics (train_metrics.h) and the
// checkpoint hooks read it. Its own header so that those readers need not include the trainer.
#pragma once

#include <cstdint>

#include "worker/parallel/step_times.h"

namespace railyard::worker {

struct StepResult {
  int64_t step = 0;  // 0-based index of the step just taken
  double loss = 0;   // mean over the global batch
  double lr = 0;
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // non-finite loss or gradients: no update
  double seconds = 0;
  double cpu_seconds = 0;  // process CPU time of the step (all threads): less sensitive to a busy machine
  double tokens_per_second = 0;
  double flops_per_second = 0;
  double mfu = 0;             // flops_per_second / peak (0 if no peak known)
  parallel::StepTimes times;  // where the step's wall time went (compute, tp/pp/dp communication, optimizer)
  // Mixture of experts: the load-balancing loss (included in `loss`) and the share of (token, choice) assignments
  // dropped at capacity, over the step's micro-batches.
  double moe_aux_loss = 0;
  double moe_dropped_fraction = 0;
};

}  // namespace railyard::worker
