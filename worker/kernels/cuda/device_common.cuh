// Device-side pieces every kernel file uses: the grid-stride loop and the fixed-order warp and block reductions (the
// same xor-shuffle pattern and warp order on every run: deterministic). Included by the .cu files only; everything
// here is inline, so each translation unit gets its own copy (no relocatable device code).
#pragma once

#include "worker/kernels/cuda/launch.h"

namespace railyard::worker::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// i over [0, n), one thread each, striding by the whole grid (launches from elementwise_launch).
#define RAILYARD_GRID_STRIDE(i, n)                                                     \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Block-wide reductions for kCrossEntropyBlock threads; every thread gets the result. `shared` holds one slot per warp.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < kCrossEntropyBlock / kWarpSize; ++w) r += shared[w];  // fixed order: deterministic
  return r;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = shared[0];
  for (int w = 1; w < kCrossEntropyBlock / kWarpSize; ++w) r = fmaxf(r, shared[w]);
  return r;
}

}  // namespace railyard::worker::cuda
