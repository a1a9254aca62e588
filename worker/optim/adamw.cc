#include "worker/optim/adamw.h"

#include <cmath>
#include <cstring>

namespace railyard::worker {

namespace {
constexpr size_t kNormChunk = 1 << 16;
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return max_lr * static_cast<double>(step + 1) / warmup_steps;
  const double min_lr = max_lr * min_lr_frac;
  const int64_t span = std::max<int64_t>(1, static_cast<int64_t>(total_steps) - warmup_steps);
  double r = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  r = std::min(1.0, std::max(0.0, r));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * r)) * (max_lr - min_lr);
}

bool decays(int i) {
  const auto name = kParamNames[i];
  return name == "wte" || name == "wpe" || name == "qkvw" || name == "attprojw" || name == "fcw" || name == "fcprojw";
}

float clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.0f;
  const double f = max_norm / (norm + 1e-6);
  return f < 1.0 ? static_cast<float>(f) : 1.0f;
}

AdamW::AdamW(const GptConfig& config, const AdamWHyper& hyper, ThreadPool& pool)
    : config_(config),
      hyper_(hyper),
      pool_(pool),
      m_(num_parameters(config)),
      v_(num_parameters(config)),
      partials_((num_parameters(config) + kNormChunk - 1) / kNormChunk) {}

double AdamW::global_norm(const float* g) { return grad_global_norm(g, m_.size(), pool_, partials_); }

double grad_global_norm(const float* g, size_t n, ThreadPool& pool, std::vector<double>& partials) {
  const size_t chunks = (n + kNormChunk - 1) / kNormChunk;
  partials.resize(chunks);
  pool.parallel_for(chunks, [&](size_t c0, size_t c1) {
    for (size_t c = c0; c < c1; ++c) {
      const size_t b = c * kNormChunk, e = std::min(n, b + kNormChunk);
      // 8 independent lanes in a fixed order (GCC's vector extension, so it compiles to packed double adds and
      // FMAs whatever the cost model thinks); nothing is reassociated, so the result is the same on every machine.
      typedef double Lanes __attribute__((vector_size(64)));
      typedef float Floats __attribute__((vector_size(32)));
      Lanes acc = {0, 0, 0, 0, 0, 0, 0, 0};
      size_t i = b;
      for (; i + 8 <= e; i += 8) {
        Floats f;
        std::memcpy(&f, g + i, sizeof(f));
        const Lanes d = __builtin_convertvector(f, Lanes);
        acc += d * d;
      }
      double s = 0;
      for (int k = 0; k < 8; ++k) s += acc[k];
      for (; i < e; ++i) s += static_cast<double>(g[i]) * g[i];
      partials[c] = s;
    }
  });
  double total = 0;
  for (double p : partials) total += p;
  return std::sqrt(total);
}

void AdamW::update(float* params, const float* grads, float lr, float grad_scale) {
  ++t_;
  const float b1 = hyper_.beta1, b2 = hyper_.beta2, eps = hyper_.eps;
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), static_cast<double>(t_)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), static_cast<double>(t_)));
  const float step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  auto sizes = param_sizes(config_);
  size_t offset = 0;
  // The 16 llm.c tensors, then the MoE router (L, E, C), a matrix: decayed.
  const int tensors = kNumParamTensors + (router_size(config_) > 0 ? 1 : 0);
  for (int ti = 0; ti < tensors; ++ti) {
    const bool router = ti == kNumParamTensors;
    const float decay = router || decays(ti) ? 1.0f - lr * hyper_.weight_decay : 1.0f;
    const size_t count = router ? router_size(config_) : sizes[ti];
    float* p = params + offset;
    const float* g = grads + offset;
    float* m = m_.data() + offset;
    float* v = v_.data() + offset;
    // Captured by value: float scalars captured by reference could alias the float stores below, which keeps GCC
    // from hoisting them and from vectorising the loop.
    pool_.parallel_for(count, [=](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        const float gi = g[i] * grad_scale;
        const float mi = b1 * m[i] + (1.0f - b1) * gi;
        const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
      }
    });
    offset += count;
  }
}

}  // namespace railyard::worker
