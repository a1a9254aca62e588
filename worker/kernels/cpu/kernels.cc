#include "worker/kernels/cpu/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

namespace railyard::worker::cpu {

namespace {
std::once_flag blas_once;
GemmThreading g_gemm_threading = GemmThreading::kPool;
}  // namespace

void init_blas_single_threaded() {
  std::call_once(blas_once, [] { openblas_set_num_threads(1); });
}

void set_gemm_threading(GemmThreading mode, int threads) {
  init_blas_single_threaded();
  g_gemm_threading = mode;
  openblas_set_num_threads(mode == GemmThreading::kOpenBlas ? threads : 1);
}

GemmThreading gemm_threading() { return g_gemm_threading; }

namespace {

template <typename T>
void gemm_serial(bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta, T* C,
                 int ldc) {
  if (M <= 0 || N <= 0) return;
  const CBLAS_TRANSPOSE a = ta ? CblasTrans : CblasNoTrans, b = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, a, b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, a, b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

// exp for float without a library call, so the loops around it vectorise (libm's expf is a scalar call, and the
// softmax, cross entropy and GELU spend most of their time in it). Range reduction x = n ln2 + r, |r| <= ln2/2, then
// Cephes' degree-5 minimax polynomial for e^r: max relative error ~2 ulp over the clamped range. Inputs are clamped
// to [-87.3, 88.3] (results below e^-87.3 ~ 1e-38 become that, harmless in the softmax). Double keeps std::exp:
// it is the precise reference of the gradient check.
inline float exp_approx(float x) {
  // Clamp with comparisons that are false for NaN, so a NaN stays NaN (std::min/max would turn it into a bound and
  // hide a diverged run from the NaN detector).
  x = x > 88.3f ? 88.3f : x;
  x = x < -87.3f ? -87.3f : x;
  // n = round(x / ln2) by the 1.5 * 2^23 trick: adding it leaves round-to-nearest(x / ln2) in the low mantissa
  // bits, which also give 2^n below without a float-to-int conversion (undefined for NaN) or a libm floor call
  // (which GCC does not inline here, and which would stop the loop from vectorising).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const int32_t k = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(12582912.0f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 split in a short high part and a low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return y * std::bit_cast<float>((k + 127) << 23);
}

template <typename T>
inline T exp_k(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp_approx(x);
  } else {
    return std::exp(x);
  }
}

// tanh(u) = 1 - 2 / (1 + e^{2u}), through exp_k so it vectorises; |u| is clamped at 10 where tanh is +-1 in float.
template <typename T>
inline T tanh_k(T u) {
  if constexpr (std::is_same_v<T, float>) {
    u = u > 10.0f ? 10.0f : u;  // NaN-preserving clamp, as in exp_approx
    u = u < -10.0f ? -10.0f : u;
    return 1.0f - 2.0f / (1.0f + exp_approx(2.0f * u));
  } else {
    return std::tanh(u);
  }
}

// Boundary i of `parts` chunks of [0, n), rounded to a multiple of 16 so each chunk keeps whole SIMD tiles.
int split_point(int n, int parts, int i) {
  if (i >= parts) return n;
  long p = static_cast<long>(n) * i / parts;
  p = (p + 8) / 16 * 16;
  return static_cast<int>(std::min<long>(p, n));
}

}  // namespace

template <typename T>
void gemm(ThreadPool& pool, bool ta, bool tb, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
          T beta, T* C, int ldc) {
  const int parts = pool.size();
  if (parts == 1 || g_gemm_threading == GemmThreading::kOpenBlas || (static_cast<long>(M) * N * K) < 32L * 32 * 32) {
    gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = M >= N;
  pool.run([&](int t) {
    if (split_rows) {
      int m0 = split_point(M, parts, t), m1 = split_point(M, parts, t + 1);
      if (m1 <= m0) return;
      const T* a = ta ? A + m0 : A + static_cast<size_t>(m0) * lda;  // rows of op(A)
      gemm_serial(ta, tb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta, C + static_cast<size_t>(m0) * ldc, ldc);
    } else {
      int n0 = split_point(N, parts, t), n1 = split_point(N, parts, t + 1);
      if (n1 <= n0) return;
      const T* b = tb ? B + static_cast<size_t>(n0) * ldb : B + n0;  // columns of op(B)
      gemm_serial(ta, tb, M, n1 - n0, K, alpha, A, lda, b, ldb, beta, C + n0, ldc);
    }
  });
}

// ----------------------------------------------------------------------------------------------------------------
// encoder

template <typename T>
void encoder_forward(ThreadPool& pool, T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn, int C) {
  pool.parallel_for(static_cast<size_t>(B) * Tn, [&](size_t begin, size_t end) {
    for (size_t bt = begin; bt < end; ++bt) {
      const size_t t = bt % Tn;
      T* o = out + bt * C;
      const T* e = wte + static_cast<size_t>(inp[bt]) * C;
      const T* p = wpe + t * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  });
}

template <typename T>
void encoder_backward(ThreadPool& pool, T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int Tn, int C) {
  // Split over channels: each thread owns columns [c0, c1) of every row, so two tokens hitting the same wte row
  // never race and the summation order is fixed (b, t ascending).
  pool.parallel_for(static_cast<size_t>(C), [&](size_t c0, size_t c1) {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tn; ++t) {
        const size_t bt = static_cast<size_t>(b) * Tn + t;
        const T* d = dout + bt * C;
        T* we = dwte + static_cast<size_t>(inp[bt]) * C;
        T* wp = dwpe + static_cast<size_t>(t) * C;
        for (size_t c = c0; c < c1; ++c) {
          we[c] += d[c];
          wp[c] += d[c];
        }
      }
    }
  });
}

// ----------------------------------------------------------------------------------------------------------------
// layernorm

template <typename T>
void layernorm_forward(ThreadPool& pool, T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, size_t N,
                       int C) {
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const T* x = inp + r * C;
      T sum = 0;
      for (int c = 0; c < C; ++c) sum += x[c];
      const T m = sum / C;
      T var = 0;
      for (int c = 0; c < C; ++c) {
        const T d = x[c] - m;
        var += d * d;
      }
      var /= C;
      const T s = T(1) / std::sqrt(var + T(1e-5));
      T* o = out + r * C;
      for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
      mean[r] = m;
      rstd[r] = s;
    }
  });
}

template <typename T>
void layernorm_backward(ThreadPool& pool, T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                        const T* rstd, size_t N, int C) {
  // Rows for dinp (each row is independent) ...
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const T* x = inp + r * C;
      const T* d = dout + r * C;
      const T m = mean[r], s = rstd[r];
      T dnorm_mean = 0, dnorm_norm_mean = 0;
      for (int c = 0; c < C; ++c) {
        const T dn = w[c] * d[c];
        dnorm_mean += dn;
        dnorm_norm_mean += dn * (x[c] - m) * s;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      T* di = dinp + r * C;
      for (int c = 0; c < C; ++c) {
        const T norm = (x[c] - m) * s;
        di[c] += (w[c] * d[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  });
  // ... then channels for dw/db (a reduction over rows, owned per column).
  pool.parallel_for(static_cast<size_t>(C), [&](size_t c0, size_t c1) {
    for (size_t r = 0; r < N; ++r) {
      const T* x = inp + r * C;
      const T* d = dout + r * C;
      const T m = mean[r], s = rstd[r];
      for (size_t c = c0; c < c1; ++c) {
        dw[c] += d[c] * (x[c] - m) * s;
        db[c] += d[c];
      }
    }
  });
}

// ----------------------------------------------------------------------------------------------------------------
// matmul (nn.Linear)

template <typename T>
void matmul_forward(ThreadPool& pool, T* out, const T* inp, const T* w, const T* bias, size_t N, int IC, int OC) {
  // out = inp @ w^T: w stays (OC, IC) and is read transposed by BLAS.
  T beta = 0;
  if (bias != nullptr) {
    pool.parallel_for(N, [&](size_t begin, size_t end) {
      for (size_t r = begin; r < end; ++r) std::copy(bias, bias + OC, out + r * OC);
    });
    beta = 1;
  }
  gemm<T>(pool, false, true, static_cast<int>(N), OC, IC, T(1), inp, IC, w, IC, beta, out, OC);
}

template <typename T>
void matmul_backward(ThreadPool& pool, T* dinp, bool accumulate_dinp, T* dw, T* dbias, const T* dout, const T* inp,
                     const T* w, size_t N, int IC, int OC, bool accumulate_dw) {
  const int n = static_cast<int>(N);
  // dinp (N,IC) = dout (N,OC) @ w (OC,IC)
  gemm<T>(pool, false, false, n, IC, OC, T(1), dout, OC, w, IC, accumulate_dinp ? T(1) : T(0), dinp, IC);
  // dw (OC,IC) += dout^T (OC,N) @ inp (N,IC)
  gemm<T>(pool, true, false, OC, IC, n, T(1), dout, OC, inp, IC, accumulate_dw ? T(1) : T(0), dw, IC);
  if (dbias != nullptr) {
    pool.parallel_for(static_cast<size_t>(OC), [&](size_t o0, size_t o1) {
      for (size_t r = 0; r < N; ++r) {
        const T* d = dout + r * OC;
        for (size_t o = o0; o < o1; ++o) dbias[o] += d[o];
      }
    });
  }
}

// ----------------------------------------------------------------------------------------------------------------
// attention

template <typename T>
void attention_forward(ThreadPool& pool, T* out, T* att, const T* qkv, int B, int Tn, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  pool.parallel_for(static_cast<size_t>(B) * NH, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      const T* q = qkv + b * Tn * C3 + h * hs;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* a = att + bh * Tn * Tn;
      // a (T,T) = scale * q (T,hs) @ k^T (hs,T); the upper triangle is computed and then masked.
      gemm_serial<T>(false, true, Tn, Tn, hs, scale, q, C3, k, C3, T(0), a, Tn);
      for (int t = 0; t < Tn; ++t) {
        T* row = a + static_cast<size_t>(t) * Tn;
        T mx = row[0];
        for (int s = 1; s <= t; ++s) mx = std::max(mx, row[s]);
        T sum = 0;
        for (int s = 0; s <= t; ++s) {
          row[s] = exp_k(row[s] - mx);
          sum += row[s];
        }
        const T inv = T(1) / sum;
        for (int s = 0; s <= t; ++s) row[s] *= inv;
        for (int s = t + 1; s < Tn; ++s) row[s] = 0;
      }
      // out (T,hs) = a (T,T) @ v (T,hs)
      gemm_serial<T>(false, false, Tn, hs, Tn, T(1), a, Tn, v, C3, T(0), out + b * Tn * C + h * hs, C);
    }
  });
}

template <typename T>
void attention_decode_forward(ThreadPool& pool, T* out, const T* q, const T* kv, int t, int C, int NH) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  pool.parallel_for(static_cast<size_t>(NH), [&](size_t begin, size_t end) {
    std::vector<T> a(static_cast<size_t>(t) + 1);
    for (size_t h = begin; h < end; ++h) {
      const T* qh = q + h * hs;
      T mx = -std::numeric_limits<T>::infinity();
      for (int s = 0; s <= t; ++s) {  // a[s] = scale * q . k_s
        const T* k = kv + static_cast<size_t>(s) * 2 * C + h * hs;
        T dot = 0;
        for (int i = 0; i < hs; ++i) dot += qh[i] * k[i];
        a[s] = scale * dot;
        mx = std::max(mx, a[s]);
      }
      T sum = 0;
      for (int s = 0; s <= t; ++s) {
        a[s] = exp_k(a[s] - mx);
        sum += a[s];
      }
      const T inv = T(1) / sum;
      T* o = out + h * hs;
      for (int i = 0; i < hs; ++i) o[i] = 0;
      for (int s = 0; s <= t; ++s) {  // out_h = sum_s softmax(a)_s v_s
        const T* v = kv + static_cast<size_t>(s) * 2 * C + C + h * hs;
        const T p = a[s] * inv;
        for (int i = 0; i < hs; ++i) o[i] += p * v[i];
      }
    }
  });
}

template <typename T>
void attention_backward(ThreadPool& pool, T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B, int Tn,
                        int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  pool.parallel_for_indexed(static_cast<size_t>(B) * NH, [&, scale](size_t begin, size_t end, int thread) {
    T* datt = scratch + static_cast<size_t>(thread) * Tn * Tn;
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      const T* q = qkv + b * Tn * C3 + h * hs;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* dq = dqkv + b * Tn * C3 + h * hs;
      T* dk = dq + C;
      T* dv = dq + 2 * C;
      const T* a = att + bh * Tn * Tn;
      const T* d = dout + b * Tn * C + h * hs;
      // datt (T,T) = dout (T,hs) @ v^T;  dv (T,hs) = a^T (T,T) @ dout (T,hs)
      gemm_serial<T>(false, true, Tn, Tn, hs, T(1), d, C, v, C3, T(0), datt, Tn);
      gemm_serial<T>(true, false, Tn, hs, Tn, T(1), a, Tn, d, C, T(0), dv, C3);
      // softmax backward, in place: dpre[t,s] = a[t,s] * (datt[t,s] - sum_u a[t,u] datt[t,u]), times the scale.
      for (int t = 0; t < Tn; ++t) {
        const T* ar = a + static_cast<size_t>(t) * Tn;
        T* dr = datt + static_cast<size_t>(t) * Tn;
        T dot = 0;
        for (int s = 0; s <= t; ++s) dot += ar[s] * dr[s];
        for (int s = 0; s <= t; ++s) dr[s] = ar[s] * (dr[s] - dot) * scale;
        for (int s = t + 1; s < Tn; ++s) dr[s] = 0;
      }
      // dq (T,hs) = dpre (T,T) @ k (T,hs);  dk (T,hs) = dpre^T (T,T) @ q (T,hs)
      gemm_serial<T>(false, false, Tn, hs, Tn, T(1), datt, Tn, k, C3, T(0), dq, C3);
      gemm_serial<T>(true, false, Tn, hs, Tn, T(1), datt, Tn, q, C3, T(0), dk, C3);
    }
  });
}

// ----------------------------------------------------------------------------------------------------------------
// GELU (tanh approximation). Built without -ffast-math: tanh must stay exact (llm.c issue 168).

namespace {
template <typename T>
constexpr T kGeluScale = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)
}

template <typename T>
void gelu_forward(ThreadPool& pool, T* out, const T* inp, size_t n) {
  pool.parallel_for(n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const T x = inp[i];
      const T cube = T(0.044715) * x * x * x;
      out[i] = T(0.5) * x * (T(1) + tanh_k(kGeluScale<T> * (x + cube)));
    }
  });
}

template <typename T>
void gelu_backward(ThreadPool& pool, T* dinp, const T* inp, const T* dout, size_t n) {
  pool.parallel_for(n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const T x = inp[i];
      const T u = kGeluScale<T> * (x + T(0.044715) * x * x * x);
      const T th = tanh_k(u);
      const T du = kGeluScale<T> * (T(1) + T(3 * 0.044715) * x * x);
      const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * du;
      dinp[i] = grad * dout[i];
    }
  });
}

template <typename T>
void residual_forward(ThreadPool& pool, T* out, const T* a, const T* b, size_t n) {
  pool.parallel_for(n, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

// ----------------------------------------------------------------------------------------------------------------
// cross entropy (+ the LM head's dlogits)

template <typename T>
void crossentropy_forward(ThreadPool& pool, T* losses, const T* logits, const int32_t* targets, size_t N, int V,
                          int Vp) {
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const T* z = logits + r * Vp;
      T mx = z[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
      T sum = 0;
      for (int v = 0; v < V; ++v) sum += exp_k(z[v] - mx);
      losses[r] = std::log(sum) + mx - z[targets[r]];
    }
  });
}

template <typename T>
void crossentropy_fused_backward(ThreadPool& pool, T* losses, T* logits, const int32_t* targets, size_t N, int V,
                                 int Vp, T dloss) {
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      T* z = logits + r * Vp;
      const int target = targets[r];
      T mx = z[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
      const T z_target = z[target];
      T sum = 0;
      for (int v = 0; v < V; ++v) {
        z[v] = exp_k(z[v] - mx);
        sum += z[v];
      }
      losses[r] = std::log(sum) + mx - z_target;
      const T scale = dloss / sum;
      for (int v = 0; v < V; ++v) z[v] *= scale;
      z[target] -= dloss;
      for (int v = V; v < Vp; ++v) z[v] = 0;
    }
  });
}

// ----------------------------------------------------------------------------------------------------------------

#define RAILYARD_INSTANTIATE(T)                                                                                   \
  template void gemm<T>(ThreadPool&, bool, bool, int, int, int, T, const T*, int, const T*, int, T, T*, int);     \
  template void encoder_forward<T>(ThreadPool&, T*, const int32_t*, const T*, const T*, int, int, int);           \
  template void encoder_backward<T>(ThreadPool&, T*, T*, const T*, const int32_t*, int, int, int);                \
  template void layernorm_forward<T>(ThreadPool&, T*, T*, T*, const T*, const T*, const T*, size_t, int);         \
  template void layernorm_backward<T>(ThreadPool&, T*, T*, T*, const T*, const T*, const T*, const T*, const T*,  \
                                      size_t, int);                                                               \
  template void matmul_forward<T>(ThreadPool&, T*, const T*, const T*, const T*, size_t, int, int);               \
  template void matmul_backward<T>(ThreadPool&, T*, bool, T*, T*, const T*, const T*, const T*, size_t, int, int, \
                                   bool);                                                                         \
  template void attention_forward<T>(ThreadPool&, T*, T*, const T*, int, int, int, int);                          \
  template void attention_decode_forward<T>(ThreadPool&, T*, const T*, const T*, int, int, int);                  \
  template void attention_backward<T>(ThreadPool&, T*, T*, const T*, const T*, const T*, int, int, int, int);     \
  template void gelu_forward<T>(ThreadPool&, T*, const T*, size_t);                                               \
  template void gelu_backward<T>(ThreadPool&, T*, const T*, const T*, size_t);                                    \
  template void residual_forward<T>(ThreadPool&, T*, const T*, const T*, size_t);                                 \
  template void crossentropy_forward<T>(ThreadPool&, T*, const T*, const int32_t*, size_t, int, int);             \
  template void crossentropy_fused_backward<T>(ThreadPool&, T*, T*, const int32_t*, size_t, int, int, T);

RAILYARD_INSTANTIATE(float)
RAILYARD_INSTANTIATE(double)

}  // namespace railyard::worker::cpu
