// CUDA twins of context parallelism's ring attention kernels (Kernels<float>::ring_*, worker/device/kernels.h; CPU
// twins in worker/device/cpu_kernels.cc). Same layouts and math; one warp per (b, head, row) with the row's head
// channels in registers (head size <= 32 * kMaxPerLane, checked by attention_plan). The backward block is two
// kernels: d(queries) per query row, d(keys)/d(values) per key row (each recomputes the block's probabilities), so
// no atomics and a fixed summation order. Every function enqueues on `stream`; errors throw CudaError naming the
// kernel, bad shapes std::invalid_argument.
#pragma once

#include <cuda_runtime_api.h>

namespace railyard::worker::cuda {

void ring_forward_begin(float* kv, float* out, float* m, float* l, const float* qkv, int B, int Tc, int C, int NH,
                        cudaStream_t stream);
void ring_forward_block(float* out, float* m, float* l, const float* qkv, const float* kv, int B, int Tc, int C, int NH,
                        bool diagonal, cudaStream_t stream);
void ring_forward_end(float* out, float* lse, const float* m, const float* l, int B, int Tc, int C, int NH,
                      cudaStream_t stream);
void ring_backward_begin(float* kv, float* dkv, float* dqkv, float* D, const float* dout, const float* qkv,
                         const float* out, int B, int Tc, int C, int NH, cudaStream_t stream);
void ring_backward_block(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                         const float* lse, const float* D, int B, int Tc, int C, int NH, bool diagonal,
                         cudaStream_t stream);
void ring_backward_end(float* dqkv, const float* dkv, int B, int Tc, int C, cudaStream_t stream);

}  // namespace railyard::worker::cuda
