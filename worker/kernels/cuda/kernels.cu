// CUDA kernels of the GPT forward and backward passes (see kernels.h). One translation unit on purpose: CI compiles it
// for sm_80, sm_90 and compute_90 PTX on 2 cores, so no cub/cooperative_groups headers (they dominate nvcc's front
// end time) and no templates beyond what the math needs.
#include <cmath>

#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/device_common.cuh"
#include "worker/kernels/cuda/kernels.h"
#include "worker/kernels/cuda/launch.h"

namespace railyard::worker::cuda {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// encoder

__global__ void encoder_forward_kernel(float* out, const int32_t* inp, const float* wte, const float* wpe, int Tn,
                                       int C, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const size_t row = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(row % Tn);
    out[i] = wte[static_cast<size_t>(inp[row]) * C + c] + wpe[static_cast<size_t>(t) * C + c];
  }
}

// One thread per channel walks the rows in order: a token's rows land on the same dwte row without atomics.
// Block (u, y): distinct token u, channels y * blockDim.x + threadIdx.x; the token's rows in row order.
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* rows, const int32_t* tokens,
                                            const int32_t* starts, int C) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const size_t u = blockIdx.x;
  float* w = dwte + static_cast<size_t>(tokens[u]) * C + c;
  float acc = *w;
  for (int32_t i = starts[u]; i < starts[u + 1]; ++i) acc += dout[static_cast<size_t>(rows[i]) * C + c];
  *w = acc;
}

__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int Tn, int C) {
  RAILYARD_GRID_STRIDE(i, static_cast<size_t>(Tn) * C) {
    const size_t t = i / C, c = i % C;
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += dout[(static_cast<size_t>(b) * Tn + t) * C + c];
    dwpe[i] += s;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// layernorm: one warp per row

// The rest of one warp's row once each lane has summed its share of x (`lane_sum`): o = (x - mean) * rstd * w + b,
// and from lane 0 the row's *mean and *rstd for the backward pass.
__device__ __forceinline__ void layernorm_row(float* o, float* mean, float* rstd, const float* x, float lane_sum,
                                              const float* w, const float* b, int C, int lane) {
  const float m = warp_sum(lane_sum) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = x[c] - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
  for (int c = lane; c < C; c += kWarpSize) o[c] = (x[c] - m) * s * w[c] + b[c];
  if (lane == 0) {
    *mean = m;
    *rstd = s;
  }
}

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, size_t N, int C) {
  const size_t row = blockIdx.x * static_cast<size_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const float* x = inp + row * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) sum += x[c];
  layernorm_row(out + row * C, mean + row, rstd + row, x, sum, w, b, C, lane);
}

__global__ void residual_layernorm_forward_kernel(float* residual, float* out, float* mean, float* rstd, const float* a,
                                                  const float* b, const float* w, const float* bias, size_t N, int C) {
  const size_t row = blockIdx.x * static_cast<size_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  float* x = residual + row * C;
  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float r = a[row * C + c] + b[row * C + c];
    x[c] = r;  // re-read below by the same lane only: no synchronisation needed
    sum += r;
  }
  layernorm_row(out + row * C, mean + row, rstd + row, x, sum, w, bias, C, lane);
}

__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                               const float* mean, const float* rstd, size_t N, int C) {
  const size_t row = blockIdx.x * static_cast<size_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* d = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float dn = w[c] * d[c];
    dnorm_mean += dn;
    dnorm_norm_mean += dn * (x[c] - m) * s;
  }
  dnorm_mean = warp_sum(dnorm_mean) / C;
  dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
  float* di = dinp + row * C;
  for (int c = lane; c < C; c += kWarpSize) {
    const float norm = (x[c] - m) * s;
    di[c] += (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// scratch: [chunk][C] dw partials, then [chunk][C] db partials.
__global__ void layernorm_backward_partials_kernel(float* scratch, const float* dout, const float* inp,
                                                   const float* mean, const float* rstd, size_t N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const size_t chunk = blockIdx.y;
  const size_t r0 = chunk * kLayernormRowsPerChunk;
  const size_t r1 = min(N, r0 + kLayernormRowsPerChunk);
  float dw = 0.0f, db = 0.0f;
  for (size_t r = r0; r < r1; ++r) {
    const float d = dout[r * C + c];
    dw += d * (inp[r * C + c] - mean[r]) * rstd[r];
    db += d;
  }
  scratch[chunk * C + c] = dw;
  scratch[(gridDim.y + chunk) * C + c] = db;
}

__global__ void layernorm_backward_reduce_kernel(float* dw, float* db, const float* scratch, unsigned chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0.0f, sb = 0.0f;
  for (unsigned k = 0; k < chunks; ++k) {
    sw += scratch[static_cast<size_t>(k) * C + c];
    sb += scratch[static_cast<size_t>(chunks + k) * C + c];
  }
  dw[c] += sw;
  db[c] += sb;
}

// ---------------------------------------------------------------------------------------------------------------
// attention. Block (b, h, row block): kRowsPerBlock warps, warp w owns row rb * kRowsPerBlock + w; lane holds elements
// d = lane + 32 i (i < per_lane) of its row. Keys (or queries for dk/dv) pass through shared memory in tiles.

struct AttnIdx {
  int b, h, rb;
};

__device__ AttnIdx attn_index(int NH, unsigned row_blocks) {
  AttnIdx x;
  x.rb = static_cast<int>(blockIdx.x % row_blocks);
  const int bh = static_cast<int>(blockIdx.x / row_blocks);
  x.h = bh % NH;
  x.b = bh / NH;
  return x;
}

// Copies rows [r0, r0 + kAttentionTile) of a (B,T,stride) tensor's head slice (offset, hs wide) into tile (zeros
// past T).
__device__ void load_tile(float* tile, const float* base, int r0, int Tn, int stride, int hs) {
  for (int i = threadIdx.x; i < kAttentionTile * hs; i += blockDim.x) {
    const int r = r0 + i / hs, d = i % hs;
    tile[i] = r < Tn ? base[static_cast<size_t>(r) * stride + d] : 0.0f;
  }
}

__device__ __forceinline__ void load_row(float (&v)[kMaxPerLane], const float* row, int hs, float scale) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + kWarpSize * i;
    v[i] = d < hs ? row[d] * scale : 0.0f;
  }
}

__device__ __forceinline__ float dot_tile(const float (&v)[kMaxPerLane], const float* tile_row, int hs) {
  const int lane = threadIdx.x % kWarpSize;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + kWarpSize * i;
    if (d < hs) s += v[i] * tile_row[d];
  }
  return warp_sum(s);
}

__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, int Tn, int C, int NH, int hs,
                                         unsigned row_blocks) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = smem + kAttentionTile * hs;
  const AttnIdx ix = attn_index(NH, row_blocks);
  const int lane = threadIdx.x % kWarpSize;
  const int t = ix.rb * kRowsPerBlock + static_cast<int>(threadIdx.x / kWarpSize);
  const int C3 = 3 * C;
  const float* base = qkv + static_cast<size_t>(ix.b) * Tn * C3 + ix.h * hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  float q[kMaxPerLane], acc[kMaxPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (t < Tn) load_row(q, base + static_cast<size_t>(t) * C3, hs, scale);
  float m = -INFINITY, l = 0.0f;
  const int last = min(Tn - 1, ix.rb * kRowsPerBlock + kRowsPerBlock - 1);
  for (int k0 = 0; k0 <= last; k0 += kAttentionTile) {
    __syncthreads();
    load_tile(ks, base + C, k0, Tn, C3, hs);
    load_tile(vs, base + 2 * C, k0, Tn, C3, hs);
    __syncthreads();
    if (t >= Tn) continue;
    const int jn = min(kAttentionTile, t - k0 + 1);  // causal: keys s <= t
    for (int j = 0; j < jn; ++j) {
      const float score = dot_tile(q, ks + j * hs, hs);
      const float m_new = fmaxf(m, score);
      const float corr = expf(m - m_new), p = expf(score - m_new);
      l = l * corr + p;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int d = lane + kWarpSize * i;
        acc[i] = acc[i] * corr + (d < hs ? p * vs[j * hs + d] : 0.0f);
      }
      m = m_new;
    }
  }
  if (t >= Tn) return;
  float* o = out + (static_cast<size_t>(ix.b) * Tn + t) * C + ix.h * hs;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + kWarpSize * i;
    if (d < hs) o[d] = acc[i] / l;
  }
  if (lane == 0) lse[(static_cast<size_t>(ix.b) * NH + ix.h) * Tn + t] = m + logf(l);
}

// D[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d]: the softmax backward's row term.
__global__ void attention_backward_d_kernel(float* D, const float* dout, const float* out, int Tn, int C, int NH,
                                            int hs, size_t rows) {
  const size_t row = blockIdx.x * static_cast<size_t>(kRowsPerBlock) + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const size_t t = row % Tn, bh = row / Tn;
  const size_t h = bh % NH, b = bh / NH;
  const size_t off = (b * Tn + t) * C + h * hs;
  float s = 0.0f;
  for (int d = lane; d < hs; d += kWarpSize) s += dout[off + d] * out[off + d];
  s = warp_sum(s);
  if (lane == 0) D[row] = s;
}

// dq[t] = scale * sum_{s<=t} p[t,s] (dout[t].v[s] - D[t]) k[s]
__global__ void attention_backward_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                             const float* D, int Tn, int C, int NH, int hs, unsigned row_blocks) {
  extern __shared__ float smem[];
  float* ks = smem;
  float* vs = smem + kAttentionTile * hs;
  const AttnIdx ix = attn_index(NH, row_blocks);
  const int lane = threadIdx.x % kWarpSize;
  const int t = ix.rb * kRowsPerBlock + static_cast<int>(threadIdx.x / kWarpSize);
  const int C3 = 3 * C;
  const float* base = qkv + static_cast<size_t>(ix.b) * Tn * C3 + ix.h * hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  float q[kMaxPerLane], go[kMaxPerLane], dq[kMaxPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
  float row_lse = 0.0f, row_d = 0.0f;
  if (t < Tn) {
    load_row(q, base + static_cast<size_t>(t) * C3, hs, scale);
    load_row(go, dout + (static_cast<size_t>(ix.b) * Tn + t) * C + ix.h * hs, hs, 1.0f);
    const size_t r = (static_cast<size_t>(ix.b) * NH + ix.h) * Tn + t;
    row_lse = lse[r];
    row_d = D[r];
  }
  const int last = min(Tn - 1, ix.rb * kRowsPerBlock + kRowsPerBlock - 1);
  for (int k0 = 0; k0 <= last; k0 += kAttentionTile) {
    __syncthreads();
    load_tile(ks, base + C, k0, Tn, C3, hs);
    load_tile(vs, base + 2 * C, k0, Tn, C3, hs);
    __syncthreads();
    if (t >= Tn) continue;
    const int jn = min(kAttentionTile, t - k0 + 1);
    for (int j = 0; j < jn; ++j) {
      const float p = expf(dot_tile(q, ks + j * hs, hs) - row_lse);
      const float ds = p * (dot_tile(go, vs + j * hs, hs) - row_d) * scale;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int d = lane + kWarpSize * i;
        if (d < hs) dq[i] += ds * ks[j * hs + d];
      }
    }
  }
  if (t >= Tn) return;
  float* o = dqkv + (static_cast<size_t>(ix.b) * Tn + t) * C3 + ix.h * hs;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + kWarpSize * i;
    if (d < hs) o[d] = dq[i];
  }
}

// For key row s: dv[s] = sum_{t>=s} p[t,s] dout[t];  dk[s] = scale * sum_{t>=s} p[t,s] (dout[t].v[s] - D[t]) q[t].
__global__ void attention_backward_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                              const float* D, int Tn, int C, int NH, int hs, unsigned row_blocks) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* gos = smem + kAttentionTile * hs;
  float* lses = gos + kAttentionTile * hs;
  float* ds_row = lses + kAttentionTile;
  const AttnIdx ix = attn_index(NH, row_blocks);
  const int lane = threadIdx.x % kWarpSize;
  const int s = ix.rb * kRowsPerBlock + static_cast<int>(threadIdx.x / kWarpSize);
  const int C3 = 3 * C;
  const float* base = qkv + static_cast<size_t>(ix.b) * Tn * C3 + ix.h * hs;
  const float* go_base = dout + static_cast<size_t>(ix.b) * Tn * C + ix.h * hs;
  const size_t stat_base = (static_cast<size_t>(ix.b) * NH + ix.h) * Tn;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  float k[kMaxPerLane], v[kMaxPerLane];
  float dk[kMaxPerLane] = {0.0f, 0.0f, 0.0f, 0.0f}, dv[kMaxPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (s < Tn) {
    load_row(k, base + static_cast<size_t>(s) * C3 + C, hs, scale);  // pre-scaled: q.k*scale in one dot
    load_row(v, base + static_cast<size_t>(s) * C3 + 2 * C, hs, 1.0f);
  }
  for (int q0 = ix.rb * kRowsPerBlock; q0 < Tn; q0 += kAttentionTile) {
    __syncthreads();
    load_tile(qs, base, q0, Tn, C3, hs);
    load_tile(gos, go_base, q0, Tn, C, hs);
    for (int i = threadIdx.x; i < kAttentionTile; i += blockDim.x) {
      const int t = q0 + i;
      lses[i] = t < Tn ? lse[stat_base + t] : 0.0f;
      ds_row[i] = t < Tn ? D[stat_base + t] : 0.0f;
    }
    __syncthreads();
    if (s >= Tn) continue;
    const int j0 = max(0, s - q0), jn = min(kAttentionTile, Tn - q0);  // causal: queries t >= s
    for (int j = j0; j < jn; ++j) {
      const float p = expf(dot_tile(k, qs + j * hs, hs) - lses[j]);
      const float ds = p * (dot_tile(v, gos + j * hs, hs) - ds_row[j]) * scale;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int d = lane + kWarpSize * i;
        if (d < hs) {
          dv[i] += p * gos[j * hs + d];
          dk[i] += ds * qs[j * hs + d];
        }
      }
    }
  }
  if (s >= Tn) return;
  float* o = dqkv + (static_cast<size_t>(ix.b) * Tn + s) * C3 + ix.h * hs;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + kWarpSize * i;
    if (d < hs) {
      o[C + d] = dk[i];
      o[2 * C + d] = dv[i];
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// elementwise

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dinp[i] = grad * dout[i];
  }
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
}

__global__ void to_bf16_kernel(bf16* out, const float* in, size_t n) {
  RAILYARD_GRID_STRIDE(i, n) { out[i] = __float2bfloat16_rn(in[i]); }
}

// Block: 32 columns (threadIdx.x % 32: a warp reads 32 consecutive floats of one row) x kColumnSumRowLanes row lanes.
__global__ void bias_backward_kernel(float* dbias, const float* dout, size_t N, int OC) {
  __shared__ float partial[kColumnSumRowLanes][kWarpSize];
  const int tx = threadIdx.x % kWarpSize, ty = threadIdx.x / kWarpSize;
  const int c = blockIdx.x * kWarpSize + tx;
  float s = 0.0f;
  if (c < OC) {
    for (size_t r = ty; r < N; r += kColumnSumRowLanes) s += dout[r * OC + c];
  }
  partial[ty][tx] = s;
  __syncthreads();
  if (ty != 0 || c >= OC) return;
  float total = 0.0f;
  for (int y = 0; y < kColumnSumRowLanes; ++y) total += partial[y][tx];  // fixed order: deterministic
  dbias[c] += total;
}

__global__ void adamw_kernel(float* params, bf16* params_bf16, const float* grads, float* m, float* v, size_t n,
                             float beta1, float beta2, float eps, float step_size, float bc2_sqrt, float decay,
                             float grad_scale) {
  RAILYARD_GRID_STRIDE(i, n) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    params[i] = p;
    if (params_bf16 != nullptr) params_bf16[i] = __float2bfloat16_rn(p);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// cross entropy: one block per row

__global__ void crossentropy_kernel(float* losses, float* logits, const int32_t* targets, int V, int Vp, float dloss,
                                    bool write_grad) {
  __shared__ float red[kCrossEntropyBlock / kWarpSize];
  __shared__ float z_target;
  const size_t row = blockIdx.x;
  float* z = logits + row * Vp;
  const int target = targets[row];
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(z[v] - mx);
  if (threadIdx.x == 0) z_target = z[target];
  sum = block_sum(sum, red);  // its __syncthreads also publish z_target before anyone overwrites z
  if (threadIdx.x == 0) losses[row] = logf(sum) + mx - z_target;
  if (!write_grad) return;
  const float scale = dloss / sum;
  for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
    z[v] = v < V ? expf(z[v] - mx) * scale - (v == target ? dloss : 0.0f) : 0.0f;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// global gradient norm: one block per chunk of `chunk` elements; each thread sums its strided elements in double, then
// the block's threads are added in a fixed tree order (no atomics: reproducible run to run).

__global__ void sum_squares_kernel(double* partials, const float* x, size_t n, size_t chunk) {
  __shared__ double shared[kSumSquaresBlock];
  const size_t b = blockIdx.x * chunk, e = b + chunk < n ? b + chunk : n;
  double s = 0.0;
  for (size_t i = b + threadIdx.x; i < e; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  shared[threadIdx.x] = s;
  __syncthreads();
  for (unsigned o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) shared[threadIdx.x] += shared[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// launchers

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int Tn, int C,
                     cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * Tn * C;
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  encoder_forward_kernel<<<l.grid, l.block, 0, stream>>>(out, inp, wte, wpe, Tn, C, n);
  check_launch("encoder_forward_kernel");
}

void token_rows_backward(float* dw, const float* dout, const int32_t* rows, const int32_t* tokens,
                         const int32_t* starts, size_t distinct, int C, cudaStream_t stream) {
  const EncoderBackwardLaunch lw = encoder_backward_launch(distinct, C);
  if (lw.grid_x == 0) return;
  encoder_backward_wte_kernel<<<dim3(lw.grid_x, lw.grid_y), lw.block, 0, stream>>>(dw, dout, rows, tokens, starts, C);
  check_launch("encoder_backward_wte_kernel");
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* rows, const int32_t* tokens,
                      const int32_t* starts, size_t distinct, int B, int Tn, int C, cudaStream_t stream) {
  if (B <= 0 || Tn <= 0 || C <= 0) return;
  token_rows_backward(dwte, dout, rows, tokens, starts, distinct, C, stream);
  const Launch lp = elementwise_launch(static_cast<size_t>(Tn) * C);
  encoder_backward_wpe_kernel<<<lp.grid, lp.block, 0, stream>>>(dwpe, dout, B, Tn, C);
  check_launch("encoder_backward_wpe_kernel");
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, size_t N,
                       int C, cudaStream_t stream) {
  const Launch l = rows_launch(N);
  if (l.grid == 0) return;
  layernorm_forward_kernel<<<l.grid, l.block, 0, stream>>>(out, mean, rstd, inp, w, b, N, C);
  check_launch("layernorm_forward_kernel");
}

void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a, const float* b,
                                const float* w, const float* bias, size_t N, int C, cudaStream_t stream) {
  const Launch l = rows_launch(N);
  if (l.grid == 0) return;
  residual_layernorm_forward_kernel<<<l.grid, l.block, 0, stream>>>(residual, out, mean, rstd, a, b, w, bias, N, C);
  check_launch("residual_layernorm_forward_kernel");
}

void layernorm_backward(float* dinp, float* dw, float* db, float* scratch, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, size_t N, int C, cudaStream_t stream) {
  const Launch l = rows_launch(N);
  if (l.grid == 0) return;
  const LayernormBackwardPlan p = layernorm_backward_plan(N, C);
  layernorm_backward_dinp_kernel<<<l.grid, l.block, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  check_launch("layernorm_backward_dinp_kernel");
  const dim3 grid(p.partials.grid, p.partials_grid_y);
  layernorm_backward_partials_kernel<<<grid, p.partials.block, 0, stream>>>(scratch, dout, inp, mean, rstd, N, C);
  check_launch("layernorm_backward_partials_kernel");
  layernorm_backward_reduce_kernel<<<p.partials.grid, p.partials.block, 0, stream>>>(dw, db, scratch, p.chunks, C);
  check_launch("layernorm_backward_reduce_kernel");
}

void attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C, int NH, cudaStream_t stream) {
  const AttentionPlan p = attention_plan(B, Tn, C, NH);
  attention_forward_kernel<<<p.forward.grid, p.forward.block, p.forward.smem_bytes, stream>>>(
      out, lse, qkv, Tn, C, NH, p.head_size, p.row_blocks);
  check_launch("attention_forward_kernel");
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int Tn, int C, int NH, cudaStream_t stream) {
  const AttentionPlan p = attention_plan(B, Tn, C, NH);
  attention_backward_d_kernel<<<p.backward_d.grid, p.backward_d.block, 0, stream>>>(scratch, dout, out, Tn, C, NH,
                                                                                    p.head_size, p.lse_floats);
  check_launch("attention_backward_d_kernel");
  attention_backward_dq_kernel<<<p.backward_dq.grid, p.backward_dq.block, p.backward_dq.smem_bytes, stream>>>(
      dqkv, dout, qkv, lse, scratch, Tn, C, NH, p.head_size, p.row_blocks);
  check_launch("attention_backward_dq_kernel");
  attention_backward_dkv_kernel<<<p.backward_dkv.grid, p.backward_dkv.block, p.backward_dkv.smem_bytes, stream>>>(
      dqkv, dout, qkv, lse, scratch, Tn, C, NH, p.head_size, p.row_blocks);
  check_launch("attention_backward_dkv_kernel");
}

void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  gelu_forward_kernel<<<l.grid, l.block, 0, stream>>>(out, inp, n);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, cudaStream_t stream) {
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  gelu_backward_kernel<<<l.grid, l.block, 0, stream>>>(dinp, inp, dout, n);
  check_launch("gelu_backward_kernel");
}

void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  residual_forward_kernel<<<l.grid, l.block, 0, stream>>>(out, a, b, n);
  check_launch("residual_forward_kernel");
}

void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, size_t N, int V, int Vp,
                          cudaStream_t stream) {
  const Launch l = crossentropy_launch(N);
  if (l.grid == 0) return;
  // write_grad = false: the kernel only reads logits.
  crossentropy_kernel<<<l.grid, l.block, 0, stream>>>(losses, const_cast<float*>(logits), targets, V, Vp, 0.0f, false);
  check_launch("crossentropy_kernel (forward)");
}

void crossentropy_fused_backward(float* losses, float* logits, const int32_t* targets, size_t N, int V, int Vp,
                                 float dloss, cudaStream_t stream) {
  const Launch l = crossentropy_launch(N);
  if (l.grid == 0) return;
  crossentropy_kernel<<<l.grid, l.block, 0, stream>>>(losses, logits, targets, V, Vp, dloss, true);
  check_launch("crossentropy_kernel (fused backward)");
}

void bias_backward(float* dbias, const float* dout, size_t N, int OC, cudaStream_t stream) {
  const Launch l = column_sums_launch(static_cast<size_t>(OC));
  if (l.grid == 0 || N == 0) return;
  bias_backward_kernel<<<l.grid, l.block, 0, stream>>>(dbias, dout, N, OC);
  check_launch("bias_backward_kernel");
}

void to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  to_bf16_kernel<<<l.grid, l.block, 0, stream>>>(out, in, n);
  check_launch("to_bf16_kernel");
}

void adamw_update(float* params, bf16* params_bf16, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t, float grad_scale,
                  cudaStream_t stream) {
  const AdamWConstants k = adamw_constants(lr, beta1, beta2, weight_decay, t);
  const Launch l = elementwise_launch(n);
  if (l.grid == 0) return;
  adamw_kernel<<<l.grid, l.block, 0, stream>>>(params, params_bf16, grads, m, v, n, beta1, beta2, eps, k.step_size,
                                               k.bc2_sqrt, k.decay, grad_scale);
  check_launch("adamw_kernel");
}

void sum_squares_partials(double* partials, const float* x, size_t n, size_t chunk, cudaStream_t stream) {
  if (n == 0) return;
  const size_t chunks = ceil_div(n, chunk);
  sum_squares_kernel<<<static_cast<unsigned>(chunks), kSumSquaresBlock, 0, stream>>>(partials, x, n, chunk);
  check_launch("sum_squares_kernel");
}

}  // namespace railyard::worker::cuda
