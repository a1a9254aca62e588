#include "worker/parallel/zero.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "worker/kernels/cpu/adamw.h"

namespace railyard::worker::parallel {

std::vector<TensorSpan> tensor_spans(const std::array<size_t, kNumParamTensors>& sizes) {
  std::vector<TensorSpan> spans;
  size_t off = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    if (sizes[i] == 0) continue;
    spans.push_back({off, sizes[i], decays(i)});
    off += sizes[i];
  }
  return spans;
}

BucketLayout::BucketLayout(size_t n, int dp, size_t bucket_elems, size_t align) : n_(n), dp_(dp) {
  if (dp < 1) throw ConfigError("data-parallel degree must be >= 1, got " + std::to_string(dp));
  if (n == 0) throw Error("BucketLayout: empty buffer");
  const size_t d = static_cast<size_t>(dp), unit = d * std::max<size_t>(1, align);
  // Whole multiples of D (x align), so every bucket but the last reduce-scatters in place.
  per_bucket_ = std::max(unit, bucket_elems / unit * unit);
  for (size_t b = 0; b < n; b += per_bucket_) {
    Bucket k;
    k.begin = b;
    k.end = std::min(n, b + per_bucket_);
    const size_t a = std::max<size_t>(1, align);
    k.piece = ((k.size() + d - 1) / d + a - 1) / a * a;
    k.shard_offset = shard_size_;
    shard_size_ += k.piece;
    buckets_.push_back(k);
  }
}

std::pair<size_t, size_t> BucketLayout::own(size_t b, int r) const {
  const Bucket& k = buckets_[b];
  const size_t s = std::min(k.end, k.begin + static_cast<size_t>(r) * k.piece);
  return {s, std::min(k.end, s + k.piece)};
}

size_t BucketLayout::bucket_of(size_t i) const { return i / per_bucket_; }

ZeroAdamW::ZeroAdamW(const BucketLayout& layout, int rank, std::vector<TensorSpan> spans, const AdamWHyper& hyper,
                     ThreadPool& pool)
    : layout_(layout),
      rank_(rank),
      spans_(std::move(spans)),
      hyper_(hyper),
      pool_(pool),
      m_(layout.shard_size()),
      v_(layout.shard_size()) {}

template <typename F>
void ZeroAdamW::for_each_run(F&& f) const {
  const auto& bs = layout_.buckets();
  for (size_t b = 0; b < bs.size(); ++b) {
    auto [s, e] = layout_.own(b, rank_);
    // Split the piece where a tensor ends: the decay flag is per tensor.
    auto it = std::upper_bound(spans_.begin(), spans_.end(), s,
                               [](size_t x, const TensorSpan& t) { return x < t.offset + t.count; });
    while (s < e && it != spans_.end()) {
      const size_t run_end = std::min(e, it->offset + it->count);
      f(s, run_end, bs[b].shard_offset + (s - bs[b].begin - static_cast<size_t>(rank_) * bs[b].piece), it->decay);
      s = run_end;
      ++it;
    }
  }
}

void ZeroAdamW::update(float* params, const float* grads, bool shard_layout, float lr, float grad_scale) {
  ++t_;
  const cpu::AdamWStep step = cpu::adamw_step(lr, hyper_.beta1, hyper_.beta2, hyper_.eps, t_);
  for_each_run([&](size_t s, size_t e, size_t so, bool decays_here) {
    const float decay = decays_here ? 1.0f - lr * hyper_.weight_decay : 1.0f;
    const float* g = shard_layout ? grads + so : grads + s;
    cpu::adamw_update(pool_, params + s, g, m_.data() + so, v_.data() + so, e - s, step, decay, grad_scale);
  });
}

std::vector<ZeroAdamW::Run> ZeroAdamW::runs() const {
  std::vector<Run> out;
  for_each_run([&](size_t s, size_t e, size_t so, bool decay) { out.push_back({s, e, so, decay}); });
  return out;
}

double ZeroAdamW::sum_squares(const float* grads, bool shard_layout,
                              const std::vector<std::pair<size_t, size_t>>* only) const {
  double total = 0;
  for_each_run([&](size_t s, size_t e, size_t so, bool) {
    const float* g = shard_layout ? grads + so : grads + s;  // g[i - s] is element i
    auto add = [&](size_t b, size_t en) {
      for (size_t i = b; i < en; ++i) total += static_cast<double>(g[i - s]) * g[i - s];
    };
    if (only == nullptr || only->empty()) {
      add(s, e);
      return;
    }
    for (const auto& [ob, oe] : *only) {
      if (oe <= s || ob >= e) continue;
      add(std::max(s, ob), std::min(e, oe));
    }
  });
  return total;
}

}  // namespace railyard::worker::parallel
