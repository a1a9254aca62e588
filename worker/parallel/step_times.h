// Per-step wall time split of the distributed trainer, in seconds. The pipeline model fills compute, tp_comm and
// pp_wait; the data-parallel reducer and the optimizer fill the other two. Fields add up to the step's wall time
// (up to bookkeeping), so a log line or metric can show where a step went.
#pragma once

namespace railyard::worker::parallel {

struct StepTimes {
  double compute = 0;    // kernels of forward and backward
  double tp_comm = 0;    // tensor-parallel all-reduces (f, g, embedding, vocab-parallel cross entropy)
  double pp_wait = 0;    // blocked in pipeline recv/send waits: the measured bubble plus transfer time
  double dp_comm = 0;    // data-parallel gradient reduction not hidden behind backward
  double optimizer = 0;  // clipping, AdamW, ZeRO all-gather

  StepTimes& operator+=(const StepTimes& o) {
    compute += o.compute;
    tp_comm += o.tp_comm;
    pp_wait += o.pp_wait;
    dp_comm += o.dp_comm;
    optimizer += o.optimizer;
    return *this;
  }
  double total() const { return compute + tp_comm + pp_wait + dp_comm + optimizer; }
};

}  // namespace railyard::worker::parallel
