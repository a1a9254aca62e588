// CUDA twins of the mixture-of-experts math (worker/model/moe_math.h; the moe_* functions of worker/device/kernels.h):
// the router's softmax and top-k, gathering an expert's rows, combining the experts' outputs, and their backward. The
// dispatch under capacity stays on the host (CpuKernels and CudaKernels alike get row/token from it). Same math,
// shapes and summation order per element as the CPU twins; every function enqueues on `stream`; errors throw
// CudaError naming the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace railyard::worker::cuda {

// One thread per token: probs (N,E) softmax in place, choice (N,k) the k largest (ties to the lower index).
void moe_route(float* probs, int32_t* choice, size_t N, size_t E, size_t k, cudaStream_t stream);
// dst (n,C) row i = src[idx[i]]; gate: times probs[idx[i], e].
void moe_gather_rows(float* dst, const float* src, const int32_t* idx, size_t n, size_t C, cudaStream_t stream);
void moe_gate_rows(float* dst, const float* src, const float* probs, const int32_t* idx, size_t e, size_t E, size_t n,
                   size_t C, cudaStream_t stream);
// out (N,C) = sum over kept choices (choice order) of probs[t, choice] * y[row]; one thread per element.
void moe_combine(float* out, const float* probs, const int32_t* choice, const int32_t* row, const float* y, size_t N,
                 size_t E, size_t k, size_t C, cudaStream_t stream);
// One warp per token: dprobs (N,E) from aux (E) * dloss and the gates' dot products (lanes over C, fixed-order warp
// sum), through the softmax.
void moe_router_backward(float* dprobs, const float* probs, const int32_t* choice, const int32_t* row, const float* y,
                         const float* dout, const float* aux, float dloss, size_t N, size_t E, size_t k, size_t C,
                         cudaStream_t stream);
// dx (N,C) = sum over kept choices (choice order) of dxe[row]; one thread per element.
void moe_combine_input_grads(float* dx, const int32_t* row, const float* dxe, size_t N, size_t k, size_t C,
                             cudaStream_t stream);

}  // namespace railyard::worker::cuda
