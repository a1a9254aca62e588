// One AdamW step over a range of the flat fp32 buffers: the single CPU home of the update that AdamW (through the
// device's adamw_update), ZeroAdamW (its shard) and OffloadAdamW (its staged groups) all run, element for element.
// The scalars are computed as worker/kernels/cuda/launch.cc's adamw_constants computes them, so CPU and GPU agree.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/kernels/cpu/thread_pool.h"

namespace railyard::worker::cpu {

// The step's scalars: step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t) (bias corrections in double pow, then
// float, as on the GPU).
struct AdamWStep {
  float b1 = 0, b2 = 0, eps = 0, step_size = 0, bc2_sqrt = 0;
};
AdamWStep adamw_step(float lr, float b1, float b2, float eps, int64_t t);

// For i in [0, n):  g = grad[i] * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//                   p = p * decay - step_size * m / (sqrt(v) / bc2_sqrt + eps)
// decay = 1 - lr * weight_decay for decayed tensors, 1 for the others. p, m, v updated in place.
void adamw_update(ThreadPool& pool, float* p, const float* grad, float* m, float* v, size_t n, const AdamWStep& s,
                  float decay, float grad_scale);

}  // namespace railyard::worker::cpu
