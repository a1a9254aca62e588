#include "worker/kernels/cpu/adamw.h"

#include <cmath>

namespace railyard::worker::cpu {

AdamWStep adamw_step(float lr, float b1, float b2, float eps, int64_t t) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), static_cast<double>(t)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), static_cast<double>(t)));
  return {b1, b2, eps, lr / bc1, std::sqrt(bc2)};
}

void adamw_update(ThreadPool& pool, float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s,
                  float decay, float grad_scale) {
  // Scalars as locals captured by value: captured by reference they could alias the float stores below, which keeps
  // GCC from hoisting them and from vectorising the loop.
  const float b1 = s.b1, b2 = s.b2, eps = s.eps, step_size = s.step_size, bc2_sqrt = s.bc2_sqrt;
  pool.parallel_for(n, [=](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      const float gi = g[i] * grad_scale;
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  });
}

}  // namespace railyard::worker::cpu
