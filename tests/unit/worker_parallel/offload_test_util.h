// Shared by the optimizer offload tests (test_offload.cc, test_offload_device.cc): a run's losses and final optimizer
// state, compared bit for bit.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/train/trainer.h"

namespace railyard::worker::testing {

// small_train_config (lr 3e-3, 2 warm-up steps) with clipping on (the offloaded update starts only after the whole
// gradient's norm), a fixed peak_flops (no GEMM-rate measurement) and `offload` with `threads` update threads.
inline TrainConfig offload_train_config(int steps, int B, int T, int micro, OffloadMode offload, int threads) {
  TrainConfig tc = small_train_config(steps, B, T, micro, /*lr=*/3e-3, /*warmup_steps=*/2);
  tc.grad_clip = 1.0;
  tc.peak_flops = 1e9;
  tc.offload = offload;
  tc.offload_threads = threads;
  return tc;
}

struct OffloadRun {
  std::vector<double> losses, norms, vals;
  std::vector<float> params, m, v;
  int64_t adam_t = 0;
};

// The trainer's parameters, AdamW moments and step count into `out`.
inline void take_state(Trainer& tr, OffloadRun& out) {
  const TrainerState st = tr.state();
  out.params.assign(st.params, st.params + st.num_params);
  out.m.assign(st.adam_m, st.adam_m + st.num_params);
  out.v.assign(st.adam_v, st.adam_v + st.num_params);
  out.adam_t = st.adam_t;
}

// `steps` steps; after every other step a validation pass, whose forward runs while the offloaded update of the step
// before is still writing (it must wait for each group like the training forward).
inline OffloadRun train_offload(Trainer& tr, BatchSource* val, int steps) {
  OffloadRun out;
  for (int s = 0; s < steps; ++s) {
    const StepResult r = tr.step();
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
    if (val != nullptr && s % 2 == 0) out.vals.push_back(tr.validate());
  }
  take_state(tr, out);
  return out;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void check_bitwise(const OffloadRun& got, const OffloadRun& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  CHECK(got.losses == want.losses);
  CHECK(got.norms == want.norms);
  CHECK(got.vals == want.vals);
  CHECK(got.adam_t == want.adam_t);
  CHECK(same_bits(got.params, want.params));
  CHECK(same_bits(got.m, want.m));
  CHECK(same_bits(got.v, want.v));
}

}  // namespace railyard::worker::testing
