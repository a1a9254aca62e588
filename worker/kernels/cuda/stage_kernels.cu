// CUDA kernels of the tensor/pipeline-parallel stage (see stage_kernels.h). No cub/cooperative_groups, as kernels.cu.
#include <cmath>

#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/device_common.cuh"
#include "worker/kernels/cuda/kernels.h"
#include "worker/kernels/cuda/launch.h"
#include "worker/kernels/cuda/stage_kernels.h"

namespace railyard::worker::cuda {
namespace {

__global__ void vocab_embedding_forward_kernel(float* out, const int32_t* inp, const float* wte, int v0, int Vl, int C,
                                               size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t r = i / C;
    const int row = inp[r] - v0;
    out[i] = row >= 0 && row < Vl ? wte[static_cast<size_t>(row) * C + i % C] : 0.0f;
  }
}

__global__ void add_positions_rows_kernel(float* out, const float* wpe, size_t row0, int Tn, int C, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t r = i / C;
    out[i] += wpe[((row0 + r) % Tn) * C + i % C];
  }
}

// dwpe (Tn,C): one thread per element adds b = 0, 1, ... into it in order (the CPU twin's order): no atomics.
__global__ void positions_backward_kernel(float* dwpe, const float* dout, int B, int Tn, int C) {
  RAILYARD_GRID_STRIDE(i, static_cast<size_t>(Tn) * C) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[static_cast<size_t>(b) * Tn * C + i];
    dwpe[i] = acc;
  }
}

__global__ void vocab_ce_local_max_kernel(float* mx, const float* logits, int Vl, int Vr) {
  __shared__ float red[kCrossEntropyBlock / kWarpSize];
  const float* z = logits + blockIdx.x * static_cast<size_t>(Vl);
  float m = -INFINITY;
  for (int v = threadIdx.x; v < Vr; v += blockDim.x) m = fmaxf(m, z[v]);
  m = block_max(m, red);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void vocab_ce_local_sums_kernel(float* sums, float* logits, const float* mx, const int32_t* targets, int v0,
                                           size_t N, int Vl, int Vr) {
  __shared__ float red[kCrossEntropyBlock / kWarpSize];
  const size_t r = blockIdx.x;
  float* z = logits + r * Vl;
  const int t = targets[r] - v0;
  const float m = mx[r];
  // The raw target logit is read before any thread overwrites it; the reduction's barriers order the two.
  if (threadIdx.x == 0) sums[N + r] = t >= 0 && t < Vr ? z[t] : 0.0f;
  __syncthreads();
  float s = 0.0f;
  for (int v = threadIdx.x; v < Vr; v += blockDim.x) {
    const float e = expf(z[v] - m);
    z[v] = e;
    s += e;
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) sums[r] = s;
}

__global__ void vocab_ce_finish_kernel(float* losses, float* logits, const float* sums, const float* mx,
                                       const int32_t* targets, int v0, size_t N, int Vl, int Vr, float scale) {
  const size_t r = blockIdx.x;
  float* z = logits + r * Vl;
  const float S = sums[r];
  if (threadIdx.x == 0) losses[r] = logf(S) + mx[r] - sums[N + r];
  const float k = scale / S;
  const int t = targets[r] - v0;
  for (int v = threadIdx.x; v < Vl; v += blockDim.x) {
    z[v] = v < Vr ? z[v] * k - (v == t ? scale : 0.0f) : 0.0f;
  }
}

__global__ void accumulate_kernel(float* out, const float* in, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) { out[i] += in[i]; }
}

__global__ void divide_kernel(float* x, float divisor, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) { x[i] = x[i] / divisor; }
}

}  // namespace

void vocab_embedding_forward(float* out, const int32_t* inp, const float* wte_local, int v0, int Vl, size_t N, int C,
                             cudaStream_t stream) {
  const size_t n = N * static_cast<size_t>(C);
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  vocab_embedding_forward_kernel<<<l.grid, l.block, 0, stream>>>(out, inp, wte_local, v0, Vl, C, n);
  check_launch("vocab_embedding_forward_kernel");
}

void add_positions_rows(float* out, const float* wpe, size_t row0, size_t rows, int Tn, int C, cudaStream_t stream) {
  const size_t n = rows * static_cast<size_t>(C);
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  add_positions_rows_kernel<<<l.grid, l.block, 0, stream>>>(out, wpe, row0, Tn, C, n);
  check_launch("add_positions_rows_kernel");
}

void vocab_embedding_backward(float* dwte_local, float* dwpe, const float* dout, const int32_t* rows,
                              const int32_t* tokens, const int32_t* starts, size_t distinct, int B, int Tn, int C,
                              cudaStream_t stream) {
  if (B <= 0 || Tn <= 0 || C <= 0) return;
  token_rows_backward(dwte_local, dout, rows, tokens, starts, distinct, C, stream);
  if (dwpe == nullptr) return;
  const Launch l = elementwise_launch(static_cast<size_t>(Tn) * C);
  positions_backward_kernel<<<l.grid, l.block, 0, stream>>>(dwpe, dout, B, Tn, C);
  check_launch("positions_backward_kernel");
}

void vocab_ce_local_max(float* mx, const float* logits, size_t N, int Vl, int Vr, cudaStream_t stream) {
  const Launch l = crossentropy_launch(N);
  if (l.grid == 0) return;
  vocab_ce_local_max_kernel<<<l.grid, l.block, 0, stream>>>(mx, logits, Vl, Vr);
  check_launch("vocab_ce_local_max_kernel");
}

void vocab_ce_local_sums(float* sums, float* logits, const float* mx, const int32_t* targets, int v0, size_t N, int Vl,
                         int Vr, cudaStream_t stream) {
  const Launch l = crossentropy_launch(N);
  if (l.grid == 0) return;
  vocab_ce_local_sums_kernel<<<l.grid, l.block, 0, stream>>>(sums, logits, mx, targets, v0, N, Vl, Vr);
  check_launch("vocab_ce_local_sums_kernel");
}

void vocab_ce_finish(float* losses, float* logits, const float* sums, const float* mx, const int32_t* targets, int v0,
                     size_t N, int Vl, int Vr, float scale, cudaStream_t stream) {
  const Launch l = crossentropy_launch(N);
  if (l.grid == 0) return;
  vocab_ce_finish_kernel<<<l.grid, l.block, 0, stream>>>(losses, logits, sums, mx, targets, v0, N, Vl, Vr, scale);
  check_launch("vocab_ce_finish_kernel");
}

void accumulate(float* out, const float* in, size_t n, cudaStream_t stream) {
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  accumulate_kernel<<<l.grid, l.block, 0, stream>>>(out, in, n);
  check_launch("accumulate_kernel");
}

void divide(float* x, float divisor, size_t n, cudaStream_t stream) {
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  divide_kernel<<<l.grid, l.block, 0, stream>>>(x, divisor, n);
  check_launch("divide_kernel");
}

}  // namespace railyard::worker::cuda
