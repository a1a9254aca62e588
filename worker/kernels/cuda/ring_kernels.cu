// CUDA kernels of ring attention (see ring_kernels.h). No cub/cooperative_groups, as kernels.cu.
#include <cmath>

#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/device_common.cuh"
#include "worker/kernels/cuda/launch.h"
#include "worker/kernels/cuda/ring_kernels.h"

namespace railyard::worker::cuda {
namespace {

// The warp's row of the B*NH*Tc (b, head, position) rows: where its head's channels start in (B,Tc,*) tensors.
struct WarpRow {
  size_t row;  // ((b NH) + h) Tc + pos: index into m, l, lse, D
  size_t bh;   // b NH + h
  size_t bt0;  // b Tc: the sequence's first token
  size_t ch;   // h hs: the head's first channel
  int pos, hs, lane;
};

// False past the last row (the whole warp: one warp per row, so the shuffles see all 32 lanes).
__device__ __forceinline__ bool warp_row(WarpRow& w, int B, int Tc, int C, int NH) {
  const size_t r = blockIdx.x * static_cast<size_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  if (r >= static_cast<size_t>(B) * NH * Tc) return false;
  w.row = r;
  w.pos = static_cast<int>(r % Tc);
  w.bh = r / Tc;
  w.hs = C / NH;
  w.bt0 = w.bh / NH * Tc;
  w.ch = w.bh % NH * w.hs;
  w.lane = threadIdx.x % kWarpSize;
  return true;
}

// The lane's channels c = lane + 32 k of one head row.
__device__ __forceinline__ void load(float (&v)[kMaxPerLane], const float* row, int hs, int lane) {
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    v[k] = c < hs ? row[c] : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float (&a)[kMaxPerLane], const float* row, int hs, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    if (c < hs) s += a[k] * row[c];
  }
  return warp_sum(s);
}

__device__ __forceinline__ void add_scaled(float (&acc)[kMaxPerLane], float p, const float* row, int hs, int lane) {
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    if (c < hs) acc[k] += p * row[c];
  }
}

__device__ __forceinline__ void add_to(float* row, const float (&v)[kMaxPerLane], int hs, int lane) {
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    if (c < hs) row[c] += v[k];
  }
}

// kv (B,Tc,2C) = the key/value part of qkv (B,Tc,3C)
__global__ void ring_pack_kernel(float* kv, const float* qkv, int C, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t bt = i / (2 * C), c = i % (2 * C);
    kv[i] = qkv[bt * 3 * C + C + c];
  }
}

__global__ void ring_unpack_kernel(float* dqkv, const float* dkv, int C, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t bt = i / (2 * C), c = i % (2 * C);
    dqkv[bt * 3 * C + C + c] = dkv[i];
  }
}

__global__ void ring_fill_kernel(float* x, float v, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) { x[i] = v; }
}

__global__ void ring_forward_block_kernel(float* out, float* m, float* l, const float* qkv, const float* kv, int B,
                                          int Tc, int C, int NH, int diagonal, float scale) {
  WarpRow w;
  if (!warp_row(w, B, Tc, C, NH)) return;
  const int hs = w.hs, lane = w.lane;
  float q[kMaxPerLane], o[kMaxPerLane];
  load(q, qkv + (w.bt0 + w.pos) * 3 * C + w.ch, hs, lane);
  float* orow = out + (w.bt0 + w.pos) * C + w.ch;
  load(o, orow, hs, lane);
  const int visible = diagonal ? w.pos + 1 : Tc;
  const float* kb = kv + w.bt0 * 2 * C + w.ch;
  float bm = -INFINITY;
  for (int t = 0; t < visible; ++t) bm = fmaxf(bm, dot(q, kb + static_cast<size_t>(t) * 2 * C, hs, lane) * scale);
  const float mold = m[w.row], mnew = fmaxf(mold, bm), a = expf(mold - mnew);
  float lsum = l[w.row] * a;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) o[k] *= a;
  for (int t = 0; t < visible; ++t) {
    const float* krow = kb + static_cast<size_t>(t) * 2 * C;
    const float p = expf(dot(q, krow, hs, lane) * scale - mnew);
    lsum += p;
    add_scaled(o, p, krow + C, hs, lane);
  }
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int c = lane + k * kWarpSize;
    if (c < hs) orow[c] = o[k];
  }
  if (lane == 0) {
    m[w.row] = mnew;
    l[w.row] = lsum;
  }
}

__global__ void ring_forward_end_kernel(float* out, float* lse, const float* m, const float* l, int B, int Tc, int C,
                                        int NH) {
  WarpRow w;
  if (!warp_row(w, B, Tc, C, NH)) return;
  const float inv = 1.0f / l[w.row];
  float* orow = out + (w.bt0 + w.pos) * C + w.ch;
  for (int c = w.lane; c < w.hs; c += kWarpSize) orow[c] *= inv;
  if (w.lane == 0) lse[w.row] = m[w.row] + logf(l[w.row]);
}

__global__ void ring_rowdot_kernel(float* D, const float* dout, const float* out, int B, int Tc, int C, int NH) {
  WarpRow w;
  if (!warp_row(w, B, Tc, C, NH)) return;
  const size_t at = (w.bt0 + w.pos) * C + w.ch;
  float s = 0.0f;
  for (int c = w.lane; c < w.hs; c += kWarpSize) s += out[at + c] * dout[at + c];
  s = warp_sum(s);
  if (w.lane == 0) D[w.row] = s;
}

// d(queries) of one query row over the block's visible keys.
__global__ void ring_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* kv,
                                        const float* lse, const float* D, int B, int Tc, int C, int NH, int diagonal,
                                        float scale) {
  WarpRow w;
  if (!warp_row(w, B, Tc, C, NH)) return;
  const int hs = w.hs, lane = w.lane;
  float q[kMaxPerLane], g[kMaxPerLane], dq[kMaxPerLane] = {};
  load(q, qkv + (w.bt0 + w.pos) * 3 * C + w.ch, hs, lane);
  load(g, dout + (w.bt0 + w.pos) * C + w.ch, hs, lane);
  const float L = lse[w.row], Dr = D[w.row];
  const int visible = diagonal ? w.pos + 1 : Tc;
  const float* kb = kv + w.bt0 * 2 * C + w.ch;
  for (int t = 0; t < visible; ++t) {
    const float* krow = kb + static_cast<size_t>(t) * 2 * C;
    const float p = expf(dot(q, krow, hs, lane) * scale - L);
    const float ds = p * (dot(g, krow + C, hs, lane) - Dr) * scale;
    add_scaled(dq, ds, krow, hs, lane);
  }
  add_to(dqkv + (w.bt0 + w.pos) * 3 * C + w.ch, dq, hs, lane);
}

// d(keys), d(values) of one key row (position w.pos of the block) over the queries that see it.
__global__ void ring_backward_dkv_kernel(float* dkv, const float* dout, const float* qkv, const float* kv,
                                         const float* lse, const float* D, int B, int Tc, int C, int NH, int diagonal,
                                         float scale) {
  WarpRow w;
  if (!warp_row(w, B, Tc, C, NH)) return;
  const int hs = w.hs, lane = w.lane, t = w.pos;
  float k[kMaxPerLane], v[kMaxPerLane], dk[kMaxPerLane] = {}, dv[kMaxPerLane] = {};
  const float* krow = kv + (w.bt0 + t) * 2 * C + w.ch;
  load(k, krow, hs, lane);
  load(v, krow + C, hs, lane);
  for (int i = diagonal ? t : 0; i < Tc; ++i) {
    const float* qrow = qkv + (w.bt0 + i) * 3 * C + w.ch;
    const float* grow = dout + (w.bt0 + i) * C + w.ch;
    const size_t qr = w.bh * Tc + i;
    const float p = expf(dot(k, qrow, hs, lane) * scale - lse[qr]);
    const float ds = p * (dot(v, grow, hs, lane) - D[qr]) * scale;
    add_scaled(dv, p, grow, hs, lane);
    add_scaled(dk, ds, qrow, hs, lane);
  }
  float* dkrow = dkv + (w.bt0 + t) * 2 * C + w.ch;
  add_to(dkrow, dk, hs, lane);
  add_to(dkrow + C, dv, hs, lane);
}

float head_scale(int B, int Tc, int C, int NH) {
  const AttentionPlan p = attention_plan(B, Tc, C, NH);  // validates the shape (head size <= 128)
  return 1.0f / std::sqrt(static_cast<float>(p.head_size));
}

void pack(float* kv, const float* qkv, int B, int Tc, int C, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * Tc * 2 * C;
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  ring_pack_kernel<<<l.grid, l.block, 0, stream>>>(kv, qkv, C, n);
  check_launch("ring_pack_kernel");
}

}  // namespace

void ring_forward_begin(float* kv, float* out, float* m, float* l, const float* qkv, int B, int Tc, int C, int NH,
                        cudaStream_t stream) {
  head_scale(B, Tc, C, NH);
  pack(kv, qkv, B, Tc, C, stream);
  const size_t rows = static_cast<size_t>(B) * NH * Tc;
  const Launch f = elementwise_launch(rows);
  ring_fill_kernel<<<f.grid, f.block, 0, stream>>>(m, -INFINITY, rows);
  check_launch("ring_fill_kernel");
  RAILYARD_CUDA_CHECK(cudaMemsetAsync(l, 0, rows * sizeof(float), stream));
  RAILYARD_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(B) * Tc * C * sizeof(float), stream));
}

void ring_forward_block(float* out, float* m, float* l, const float* qkv, const float* kv, int B, int Tc, int C, int NH,
                        bool diagonal, cudaStream_t stream) {
  const float scale = head_scale(B, Tc, C, NH);
  const Launch r = rows_launch(static_cast<size_t>(B) * NH * Tc);
  ring_forward_block_kernel<<<r.grid, r.block, 0, stream>>>(out, m, l, qkv, kv, B, Tc, C, NH, diagonal ? 1 : 0, scale);
  check_launch("ring_forward_block_kernel");
}

void ring_forward_end(float* out, float* lse, const float* m, const float* l, int B, int Tc, int C, int NH,
                      cudaStream_t stream) {
  head_scale(B, Tc, C, NH);
  const Launch r = rows_launch(static_cast<size_t>(B) * NH * Tc);
  ring_forward_end_kernel<<<r.grid, r.block, 0, stream>>>(out, lse, m, l, B, Tc, C, NH);
  check_launch("ring_forward_end_kernel");
}

void ring_backward_begin(float* kv, float* dkv, float* dqkv, float* D, const float* dout, const float* qkv,
                         const float* out, int B, int Tc, int C, int NH, cudaStream_t stream) {
  head_scale(B, Tc, C, NH);
  pack(kv, qkv, B, Tc, C, stream);
  const size_t bt = static_cast<size_t>(B) * Tc;
  RAILYARD_CUDA_CHECK(cudaMemsetAsync(dkv, 0, bt * 2 * C * sizeof(float), stream));
  RAILYARD_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, bt * 3 * C * sizeof(float), stream));
  const Launch r = rows_launch(static_cast<size_t>(B) * NH * Tc);
  ring_rowdot_kernel<<<r.grid, r.block, 0, stream>>>(D, dout, out, B, Tc, C, NH);
  check_launch("ring_rowdot_kernel");
}

void ring_backward_block(float* dqkv, float* dkv, const float* dout, const float* qkv, const float* kv,
                         const float* lse, const float* D, int B, int Tc, int C, int NH, bool diagonal,
                         cudaStream_t stream) {
  const float scale = head_scale(B, Tc, C, NH);
  const Launch r = rows_launch(static_cast<size_t>(B) * NH * Tc);
  ring_backward_dq_kernel<<<r.grid, r.block, 0, stream>>>(dqkv, dout, qkv, kv, lse, D, B, Tc, C, NH, diagonal ? 1 : 0,
                                                          scale);
  check_launch("ring_backward_dq_kernel");
  ring_backward_dkv_kernel<<<r.grid, r.block, 0, stream>>>(dkv, dout, qkv, kv, lse, D, B, Tc, C, NH, diagonal ? 1 : 0,
                                                           scale);
  check_launch("ring_backward_dkv_kernel");
}

void ring_backward_end(float* dqkv, const float* dkv, int B, int Tc, int C, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * Tc * 2 * C;
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  ring_unpack_kernel<<<l.grid, l.block, 0, stream>>>(dqkv, dkv, C, n);
  check_launch("ring_unpack_kernel");
}

}  // namespace railyard::worker::cuda
