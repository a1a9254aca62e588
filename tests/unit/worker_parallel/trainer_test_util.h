// Shared by the distributed-trainer tests: an in-memory batch source with the DataLoader's data-parallel contract.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tests/unit/worker/worker_test_util.h"
#include "worker/train/trainer.h"

namespace railyard::worker::testing {

// One global sequence of (B, T) samples over the license corpus (token ids modulo `vocab`); call k of rank r in a
// world of D gets samples [(k*D + r)*B, +B), as DataLoader(rank r, world D) does.
class StreamSource : public BatchSource {
 public:
  StreamSource(int rank, int world, int B, int T, int vocab)
      : rank_(rank), world_(world), B_(B), T_(T), vocab_(vocab) {}
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
  uint64_t calls_ = 0;
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

}  // namespace railyard::worker::testing
