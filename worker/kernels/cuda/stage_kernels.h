// CUDA twins of the tensor/pipeline-parallel stage's own kernels (worker/kernels/cpu/vocab_parallel.h, and the
// accumulate/copy of worker/device/kernels.h): the vocab-parallel embedding and the three phases of the
// vocab-parallel cross entropy. Same math, shapes and accumulation rules as the CPU twins; every function enqueues on
// `stream`; errors throw CudaError naming the kernel. Separate from kernels.cu so the GPT kernels' translation unit
// stays as it is. Shapes: N rows, C channels, wte_local (Vl,C) holding vocabulary rows [v0, v0 + Vl) of which the
// first Vr are real tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace railyard::worker::cuda {

// out (N,C) = wte_local[inp - v0] for tokens held here, else 0.
void vocab_embedding_forward(float* out, const int32_t* inp, const float* wte_local, int v0, int Vl, size_t N, int C,
                             cudaStream_t stream);
// out (rows,C) += wpe[(row0 + i) mod Tn].
void add_positions_rows(float* out, const float* wpe, size_t row0, size_t rows, int Tn, int C, cudaStream_t stream);
// dwte_local (Vl,C) += dout rows of tokens held here; dwpe (Tn,C) += sum over b in order (when not null). No atomics,
// the CPU's summation order per element: the rows are grouped by token (launch.h token_rows over [v0, v0 + Vl), tokens
// relative to v0; device arrays) and each (token, channel) adds its rows in row order; dwpe gets one thread per element
// adding b = 0, 1, ... in order.
void vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout, const int32_t* rows,
                              const int32_t* tokens, const int32_t* starts, size_t distinct, int B, int Tn, int C,
                              cudaStream_t stream);
// One block per row (kCrossEntropyBlock threads, fixed-order block reductions).
void vocab_ce_local_max(float* mx, const float* logits, size_t N, int Vl, int Vr, cudaStream_t stream);
void vocab_ce_local_sums(float* sums, float* logits, const float* mx, const int32_t* targets, int v0, size_t N, int Vl,
                         int Vr, cudaStream_t stream);
void vocab_ce_finish(float* losses, float* logits, const float* sums, const float* mx, const int32_t* targets, int v0,
                     size_t N, int Vl, int Vr, float scale, cudaStream_t stream);
// out (n) += in (n)
void accumulate(float* out, const float* in, size_t n, cudaStream_t stream);
// x (n) = x / divisor (IEEE division: nvcc's default -prec-div=true), the dp mean of a sub-group's sum.
void divide(float* x, float divisor, size_t n, cudaStream_t stream);

}  // namespace railyard::worker::cuda
