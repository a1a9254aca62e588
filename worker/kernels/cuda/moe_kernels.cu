// CUDA kernels of the mixture-of-experts layer (see moe_kernels.h). No atomics: each output element has one owner
// thread (or one warp) that sums in the CPU twin's order.
#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/device_common.cuh"
#include "worker/kernels/cuda/launch.h"
#include "worker/kernels/cuda/moe_kernels.h"

namespace railyard::worker::cuda {
namespace {

__global__ void moe_route_kernel(float* probs, int32_t* choice, size_t N, int E, int k) {
  RAILYARD_GRID_STRIDE(t, N) {
    float* p = probs + t * E;
    float mx = p[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, p[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      p[e] = expf(p[e] - mx);
      sum += p[e];
    }
    for (int e = 0; e < E; ++e) p[e] /= sum;
    int32_t* ch = choice + t * k;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= ch[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      ch[j] = best;
    }
  }
}

__global__ void moe_gather_rows_kernel(float* dst, const float* src, const int32_t* idx, size_t C, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) { dst[i] = src[static_cast<size_t>(idx[i / C]) * C + i % C]; }
}

__global__ void moe_gate_rows_kernel(float* dst, const float* src, const float* probs, const int32_t* idx, size_t e,
                                     size_t E, size_t C, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t t = static_cast<size_t>(idx[i / C]);
    dst[i] = probs[t * E + e] * src[t * C + i % C];
  }
}

__global__ void moe_combine_kernel(float* out, const float* probs, const int32_t* choice, const int32_t* row,
                                   const float* y, size_t E, int k, size_t C, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t t = i / C, c = i % C;
    float o = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t r = row[t * k + j];
      if (r < 0) continue;
      o += probs[t * E + choice[t * k + j]] * y[static_cast<size_t>(r) * C + c];
    }
    out[i] = o;
  }
}

__global__ void moe_combine_input_grads_kernel(float* dx, const int32_t* row, const float* dxe, int k, size_t C,
                                               size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t t = i / C, c = i % C;
    float o = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int32_t r = row[t * k + j];
      if (r >= 0) o += dxe[static_cast<size_t>(r) * C + c];
    }
    dx[i] = o;
  }
}

// One warp per token t. The row dp = dprobs[t] is written by lanes over E; __syncwarp orders the lanes' global
// writes before the next phase reads them.
__global__ void moe_router_backward_kernel(float* dprobs, const float* probs, const int32_t* choice, const int32_t* row,
                                           const float* y, const float* dout, const float* aux, float dloss, size_t N,
                                           int E, int k, int C) {
  const size_t t = blockIdx.x * static_cast<size_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (t >= N) return;  // whole warps leave together: t is the same for all lanes of a warp
  float* dp = dprobs + t * E;
  const float* p = probs + t * E;
  for (int e = lane; e < E; e += kWarpSize) dp[e] = aux[e] * dloss;
  __syncwarp();
  const float* d = dout + t * C;
  for (int j = 0; j < k; ++j) {
    const int32_t r = row[t * k + j];
    if (r < 0) continue;  // the same branch for every lane
    const float* yr = y + static_cast<size_t>(r) * C;
    float dot = 0.0f;
    for (int c = lane; c < C; c += kWarpSize) dot += d[c] * yr[c];
    dot = warp_sum(dot);
    if (lane == 0) dp[choice[t * k + j]] += dot;
    __syncwarp();
  }
  float s = 0.0f;
  for (int e = lane; e < E; e += kWarpSize) s += p[e] * dp[e];
  s = warp_sum(s);
  for (int e = lane; e < E; e += kWarpSize) dp[e] = p[e] * (dp[e] - s);
}

}  // namespace

void moe_route(float* probs, int32_t* choice, size_t N, size_t E, size_t k, cudaStream_t stream) {
  const Launch l = elementwise_launch(N);
  if (l.grid == 0 || E == 0) return;
  moe_route_kernel<<<l.grid, l.block, 0, stream>>>(probs, choice, N, static_cast<int>(E), static_cast<int>(k));
  check_launch("moe_route_kernel");
}

void moe_gather_rows(float* dst, const float* src, const int32_t* idx, size_t n, size_t C, cudaStream_t stream) {
  const Launch l = elementwise_launch(n * C);
  if (l.grid == 0) return;
  moe_gather_rows_kernel<<<l.grid, l.block, 0, stream>>>(dst, src, idx, C, n * C);
  check_launch("moe_gather_rows_kernel");
}

void moe_gate_rows(float* dst, const float* src, const float* probs, const int32_t* idx, size_t e, size_t E, size_t n,
                   size_t C, cudaStream_t stream) {
  const Launch l = elementwise_launch(n * C);
  if (l.grid == 0) return;
  moe_gate_rows_kernel<<<l.grid, l.block, 0, stream>>>(dst, src, probs, idx, e, E, C, n * C);
  check_launch("moe_gate_rows_kernel");
}

void moe_combine(float* out, const float* probs, const int32_t* choice, const int32_t* row, const float* y, size_t N,
                 size_t E, size_t k, size_t C, cudaStream_t stream) {
  const Launch l = elementwise_launch(N * C);
  if (l.grid == 0) return;
  moe_combine_kernel<<<l.grid, l.block, 0, stream>>>(out, probs, choice, row, y, E, static_cast<int>(k), C, N * C);
  check_launch("moe_combine_kernel");
}

void moe_router_backward(float* dprobs, const float* probs, const int32_t* choice, const int32_t* row, const float* y,
                         const float* dout, const float* aux, float dloss, size_t N, size_t E, size_t k, size_t C,
                         cudaStream_t stream) {
  const Launch l = rows_launch(N);
  if (l.grid == 0 || E == 0) return;
  moe_router_backward_kernel<<<l.grid, l.block, 0, stream>>>(dprobs, probs, choice, row, y, dout, aux, dloss, N,
                                                             static_cast<int>(E), static_cast<int>(k),
                                                             static_cast<int>(C));
  check_launch("moe_router_backward_kernel");
}

void moe_combine_input_grads(float* dx, const int32_t* row, const float* dxe, size_t N, size_t k, size_t C,
                             cudaStream_t stream) {
  const Launch l = elementwise_launch(N * C);
  if (l.grid == 0) return;
  moe_combine_input_grads_kernel<<<l.grid, l.block, 0, stream>>>(dx, row, dxe, static_cast<int>(k), C, N * C);
  check_launch("moe_combine_input_grads_kernel");
}

}  // namespace railyard::worker::cuda
