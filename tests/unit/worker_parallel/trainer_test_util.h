// Shared by the distributed-trainer tests: an in-memory batch source with the DataLoader's data-parallel contract.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "tests/unit/worker/worker_test_util.h"
#include "worker/model/gpt.h"
#include "worker/train/trainer.h"

namespace railyard::worker::testing {

// One global sequence of (B, T) samples over the license corpus (token ids modulo `vocab`); call k of rank r in a
// world of D gets samples [(k*D + r)*B, +B), as DataLoader(rank r, world D) does. `first_call`: the calls already
// made (a loader restored at that position).
class StreamSource : public BatchSource {
 public:
  StreamSource(int rank, int world, int B, int T, int vocab, uint64_t first_call = 0)
      : rank_(rank), world_(world), B_(B), T_(T), vocab_(vocab), calls_(first_call) {}
  void next_batch(int32_t* inputs, int32_t* targets) override {
    static const std::vector<int32_t> c = license_corpus();
    for (int b = 0; b < B_; ++b) {
      const uint64_t sample = (calls_ * world_ + rank_) * B_ + b;
      const size_t start = (sample * 7919) % (c.size() - T_ - 1);
      for (int t = 0; t < T_; ++t) {
        inputs[b * T_ + t] = c[start + t] % vocab_;
        targets[b * T_ + t] = c[start + t + 1] % vocab_;
      }
    }
    ++calls_;
  }

 private:
  uint64_t rank_, world_;
  int B_, T_, vocab_;
  uint64_t calls_;
};

// M random (B, T) micro-batches of inputs and targets in [0, vocab), back to back: what the model-level equivalence
// tests feed one process and every parallel layout alike.
struct TokenData {
  std::vector<int32_t> in, tgt;  // (M, B, T)
};
inline TokenData random_tokens(int M, int B, int T, int vocab, uint32_t seed) {
  TokenData d;
  std::mt19937 rng(seed);
  for (int i = 0; i < M * B * T; ++i) {
    d.in.push_back(static_cast<int32_t>(rng() % vocab));
    d.tgt.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return d;
}

// The quiet TrainConfig the trainer tests start from: `steps` steps of `micro` (B, T) micro-batches per global batch,
// the rest (grad clipping among it) TrainConfig's defaults unless the test sets it.
inline TrainConfig small_train_config(int steps, int B, int T, int micro, double lr,
                                      int warmup_steps = TrainConfig{}.warmup_steps) {
  TrainConfig tc;
  tc.steps = steps;
  tc.batch = B;
  tc.seq_len = T;
  tc.global_batch_tokens = static_cast<int64_t>(micro) * B * T;
  tc.lr = lr;
  tc.warmup_steps = warmup_steps;
  tc.quiet = true;
  return tc;
}

// small_train_config at lr 1e-2 with 2 warm-up steps, sequence parallelism on or off: what the sequence-parallel
// comparisons (worker_parallel_sp, worker_parallel_moe_stage) train with and without it.
inline TrainConfig sp_train_config(int steps, int B, int T, int micro, bool sp) {
  TrainConfig tc = small_train_config(steps, B, T, micro, /*lr=*/1e-2, /*warmup_steps=*/2);
  tc.sequence_parallel = sp;
  return tc;
}

// What the model-level layout tests compare against: gradient accumulation over the M (B, T) micro-batches of `d` in
// one process from init_weights(seed), each weighted 1/M. `after_micro` sees the model after each backward.
struct AccumulatedGrads {
  double loss = 0;
  std::vector<float> grads;  // full llm.c buffer
};
inline AccumulatedGrads accumulate_grads(const GptConfig& cfg, int B, int T, uint64_t seed, const TokenData& d, int M,
                                         const std::function<void(const Gpt<float>&)>& after_micro = nullptr) {
  ThreadPool pool(1);
  Gpt<float> model(cfg, B, T, pool);
  model.init_weights(seed);
  model.zero_grad();
  AccumulatedGrads r;
  const size_t N = static_cast<size_t>(B) * T;
  for (int m = 0; m < M; ++m) {
    r.loss += model.forward(d.in.data() + m * N, d.tgt.data() + m * N, Gpt<float>::Mode::kTrain, 1.0f / M);
    model.backward(true);
    if (after_micro) after_micro(model);
  }
  r.loss /= M;
  r.grads.assign(model.grads(), model.grads() + model.num_params());
  return r;
}

// Every step's result and the parameters after the last one.
struct LayoutRun {
  std::vector<StepResult> steps;  // rank 0's (checked equal in loss on every rank)
  std::vector<float> params;      // full buffer after the last step
};

// tc.steps steps of the single-process Trainer on StreamSource data: the reference of the distributed-trainer tests.
inline LayoutRun run_single_trainer(const GptConfig& cfg, const TrainConfig& tc) {
  ThreadPool pool(1);
  StreamSource src(0, 1, tc.batch, tc.seq_len, cfg.vocab_size);
  Trainer tr(cfg, tc, pool, src);
  LayoutRun out;
  for (int s = 0; s < tc.steps; ++s) out.steps.push_back(tr.step());
  out.params.assign(tr.model().params(), tr.model().params() + tr.model().num_params());
  return out;
}

// Max-norm relative error of one tensor: max |a - b| / max |b| (max |a - b| where b is all zeros).
inline double rel_err(const float* a, const float* b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return m == 0 ? d : d / m;
}

// ParallelModel::forward_backward's next_micro_batch: the micro-batches of N tokens of `in` and `tgt` from index
// `first` on, one a call (a replica's share of what one process accumulates).
inline std::function<void(int32_t*, int32_t*)> micro_batches(const std::vector<int32_t>& in,
                                                             const std::vector<int32_t>& tgt, int first, size_t N) {
  return [&in, &tgt, next = static_cast<size_t>(first), N](int32_t* i, int32_t* t) mutable {
    std::memcpy(i, in.data() + next * N, N * sizeof(int32_t));
    std::memcpy(t, tgt.data() + next * N, N * sizeof(int32_t));
    ++next;
  };
}

// max |v[i]|: the scale parameter tolerances are relative to.
inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// max |a[i] - b[i]| over b's elements.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < b.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  return worst;
}

}  // namespace railyard::worker::testing
