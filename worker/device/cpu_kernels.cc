#include "worker/device/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "worker/kernels/cpu/adamw.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/kernels/cpu/moe.h"
#include "worker/kernels/cpu/vocab_parallel.h"

namespace railyard::worker {

namespace {
// global_norm's chunk: the partition (and so the summation order) does not depend on the thread count.
constexpr size_t kNormChunk = 1 << 16;
}  // namespace

template <typename T>
CpuKernels<T>::CpuKernels(ThreadPool& pool) : pool_(pool) {
  cpu::init_blas_single_threaded();
}

template <typename T>
void* CpuKernels<T>::alloc(size_t bytes) {
  // Whole cache lines / AVX-512 vectors, zero-filled (the layout Gpt's buffers always had).
  void* p = nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (bytes == 0) return nullptr;
  if (posix_memalign(&p, 64, rounded) != 0) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return p;
}

template <typename T>
void CpuKernels<T>::free(void* p) noexcept {
  std::free(p);
}

template <typename T>
void CpuKernels<T>::zero(void* p, size_t bytes) {
  std::memset(p, 0, bytes);
}

template <typename T>
void CpuKernels<T>::to_host(void* host_dst, const void* src, size_t bytes) {
  if (host_dst != src) std::memcpy(host_dst, src, bytes);
}

template <typename T>
void CpuKernels<T>::to_device(void* dst, const void* host_src, size_t bytes) {
  if (dst != host_src) std::memcpy(dst, host_src, bytes);
}

template <typename T>
size_t CpuKernels<T>::attention_saved_elems(int B, int Tn, int, int NH) const {
  return static_cast<size_t>(B) * NH * Tn * Tn;  // the softmax probabilities
}

template <typename T>
size_t CpuKernels<T>::attention_scratch_elems(int, int Tn, int, int) const {
  return static_cast<size_t>(pool_.size()) * Tn * Tn;
}

template <typename T>
void CpuKernels<T>::encoder_forward(T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn, int C) {
  cpu::encoder_forward(pool_, out, inp, wte, wpe, B, Tn, C);
}

template <typename T>
void CpuKernels<T>::encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int Tn, int C) {
  cpu::encoder_backward(pool_, dwte, dwpe, dout, inp, B, Tn, C);
}

template <typename T>
void CpuKernels<T>::layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, size_t N, int C) {
  cpu::layernorm_forward(pool_, out, mean, rstd, inp, w, b, N, C);
}

template <typename T>
void CpuKernels<T>::layernorm_backward(T* dinp, T* dw, T* db, T*, const T* dout, const T* inp, const T* w,
                                       const T* mean, const T* rstd, size_t N, int C) {
  cpu::layernorm_backward(pool_, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

template <typename T>
void CpuKernels<T>::matmul_forward(T* out, const T* inp, const T* w, const T* bias, size_t N, int IC, int OC) {
  cpu::matmul_forward(pool_, out, inp, w, bias, N, IC, OC);
}

template <typename T>
void CpuKernels<T>::matmul_backward(T* dinp, bool accumulate_dinp, T* dw, T* dbias, const T* dout, const T* inp,
                                    const T* w, size_t N, int IC, int OC, bool accumulate_dw) {
  cpu::matmul_backward(pool_, dinp, accumulate_dinp, dw, dbias, dout, inp, w, N, IC, OC, accumulate_dw);
}

template <typename T>
void CpuKernels<T>::attention_forward(T* out, T* saved, const T* qkv, int B, int Tn, int C, int NH) {
  cpu::attention_forward(pool_, out, saved, qkv, B, Tn, C, NH);
}

template <typename T>
void CpuKernels<T>::attention_backward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T*, const T* saved,
                                       int B, int Tn, int C, int NH) {
  cpu::attention_backward(pool_, dqkv, scratch, dout, qkv, saved, B, Tn, C, NH);
}

template <typename T>
void CpuKernels<T>::gelu_forward(T* out, const T* inp, size_t n) {
  cpu::gelu_forward(pool_, out, inp, n);
}

template <typename T>
void CpuKernels<T>::gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  cpu::gelu_backward(pool_, dinp, inp, dout, n);
}

template <typename T>
void CpuKernels<T>::residual_forward(T* out, const T* a, const T* b, size_t n) {
  cpu::residual_forward(pool_, out, a, b, n);
}

template <typename T>
void CpuKernels<T>::crossentropy_forward(T* losses, const T* logits, const int32_t* targets, size_t N, int V, int Vp) {
  cpu::crossentropy_forward(pool_, losses, logits, targets, N, V, Vp);
}

template <typename T>
void CpuKernels<T>::crossentropy_fused_backward(T* losses, T* logits, const int32_t* targets, size_t N, int V, int Vp,
                                                T dloss) {
  cpu::crossentropy_fused_backward(pool_, losses, logits, targets, N, V, Vp, dloss);
}

template <typename T>
void CpuKernels<T>::adamw_update(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1, float b2,
                                 float eps, float weight_decay, int64_t t, float grad_scale) {
  cpu::adamw_update(pool_, p, g, m, v, n, cpu::adamw_step(lr, b1, b2, eps, t), 1.0f - lr * weight_decay, grad_scale);
}

template <typename T>
double CpuKernels<T>::global_norm(const float* g, size_t n) {
  const size_t chunks = (n + kNormChunk - 1) / kNormChunk;
  if (partials_.size() < chunks) partials_.resize(chunks);
  double* partials = partials_.data();
  pool_.parallel_for(chunks, [&](size_t c0, size_t c1) {
    for (size_t c = c0; c < c1; ++c) {
      const size_t b = c * kNormChunk, e = std::min(n, b + kNormChunk);
      // 8 independent lanes in a fixed order (GCC's vector extension, so it compiles to packed double adds and
      // FMAs whatever the cost model thinks); nothing is reassociated, so the result is the same on every machine.
      typedef double Lanes __attribute__((vector_size(64)));
      typedef float Floats __attribute__((vector_size(32)));
      Lanes acc = {0, 0, 0, 0, 0, 0, 0, 0};
      size_t i = b;
      for (; i + 8 <= e; i += 8) {
        Floats f;
        std::memcpy(&f, g + i, sizeof(f));
        const Lanes d = __builtin_convertvector(f, Lanes);
        acc += d * d;
      }
      double s = 0;
      for (int k = 0; k < 8; ++k) s += acc[k];
      for (; i < e; ++i) s += static_cast<double>(g[i]) * g[i];
      partials[c] = s;
    }
  });
  double total = 0;
  for (size_t c = 0; c < chunks; ++c) total += partials[c];
  return std::sqrt(total);
}

// The tensor/pipeline-parallel stage's kernels: worker/kernels/cpu/vocab_parallel.cc (float: the stage trains in fp32;
// the double reference model has no vocab-parallel stage).
namespace {
[[noreturn]] void float_only(const char* what) {
  throw Error(std::string("CpuKernels<double>::") + what + ": the tensor/pipeline-parallel stage runs in float only");
}
}  // namespace

template <typename T>
void CpuKernels<T>::vocab_embedding_forward(T* out, const int32_t* inp, const T* wte_local, int v0, int Vl, size_t N,
                                            int C) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::vocab_embedding_forward(pool_, out, inp, wte_local, v0, Vl, N, C);
  } else {
    float_only("vocab_embedding_forward");
  }
}

template <typename T>
void CpuKernels<T>::add_positions_rows(T* out, const T* wpe, size_t row0, size_t rows, int Tn, int C) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::add_positions_rows(pool_, out, wpe, row0, rows, Tn, C);
  } else {
    float_only("add_positions_rows");
  }
}

template <typename T>
void CpuKernels<T>::vocab_embedding_backward(T* dwte_local, T* dwpe, const T* dout, const int32_t* inp, int v0, int Vl,
                                             int B, int Tn, int C) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::vocab_embedding_backward(pool_, dwte_local, dwpe, dout, inp, v0, Vl, B, Tn, C);
  } else {
    float_only("vocab_embedding_backward");
  }
}

template <typename T>
void CpuKernels<T>::vocab_ce_local_max(T* mx, const T* logits, size_t N, int Vl, int Vr) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::vocab_ce_local_max(pool_, mx, logits, N, Vl, Vr);
  } else {
    float_only("vocab_ce_local_max");
  }
}

template <typename T>
void CpuKernels<T>::vocab_ce_local_sums(T* sums, T* logits, const T* mx, const int32_t* targets, int v0, size_t N,
                                        int Vl, int Vr) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::vocab_ce_local_sums(pool_, sums, logits, mx, targets, v0, N, Vl, Vr);
  } else {
    float_only("vocab_ce_local_sums");
  }
}

template <typename T>
void CpuKernels<T>::vocab_ce_finish(T* losses, T* logits, const T* sums, const T* mx, const int32_t* targets, int v0,
                                    size_t N, int Vl, int Vr, T scale) {
  if constexpr (std::is_same_v<T, float>) {
    cpu::vocab_ce_finish(pool_, losses, logits, sums, mx, targets, v0, N, Vl, Vr, scale);
  } else {
    float_only("vocab_ce_finish");
  }
}

template <typename T>
void CpuKernels<T>::accumulate(T* out, const T* in, size_t n) {
  // Element-wise, so the split over threads does not change a bit.
  pool_.parallel_for(n, [=](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) out[i] += in[i];
  });
}

template <typename T>
void CpuKernels<T>::copy(T* dst, const T* src, size_t n) {
  if (dst != src && n > 0) std::memcpy(dst, src, n * sizeof(T));
}

// Ring attention (context parallelism): the loops RingAttention ran on host memory before issue #11, moved. Work is
// split over (b, head) pairs, each pair's rows and keys in order, so the thread count does not change a bit.
template <typename T>
void CpuKernels<T>::ring_forward_begin(T* kv, T* out, T* m, T* l, const T* qkv, int B, int Tc, int C, int NH) {
  const size_t Cs = C, rows = static_cast<size_t>(B) * NH * Tc;
  for (size_t bt = 0; bt < static_cast<size_t>(B) * Tc; ++bt)
    std::memcpy(kv + bt * 2 * Cs, qkv + bt * 3 * Cs + Cs, 2 * Cs * sizeof(T));
  std::fill(m, m + rows, -std::numeric_limits<T>::infinity());
  std::fill(l, l + rows, T(0));
  std::memset(out, 0, static_cast<size_t>(B) * Tc * Cs * sizeof(T));
}

template <typename T>
void CpuKernels<T>::ring_forward_block(T* out, T* m_, T* l_, const T* qkv, const T* kv, int B, int Tc, int C, int NH,
                                       bool diagonal) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  pool_.parallel_for(static_cast<size_t>(B) * NH, [&](size_t begin, size_t end) {
    std::vector<T> sc(Tc);
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      for (int i = 0; i < Tc; ++i) {
        const T* q = qkv + (b * Tc + i) * 3 * C + h * hs;
        const int visible = diagonal ? i + 1 : Tc;  // causal: an earlier block fully, the diagonal block up to i
        T bm = -std::numeric_limits<T>::infinity();
        for (int t = 0; t < visible; ++t) {
          const T* k = kv + (b * Tc + t) * 2 * C + h * hs;
          T dot = 0;
          for (int c = 0; c < hs; ++c) dot += q[c] * k[c];
          sc[t] = dot * scale;
          bm = std::max(bm, sc[t]);
        }
        const size_t row = bh * Tc + i;
        const T mnew = std::max(m_[row], bm);
        const T a = std::exp(m_[row] - mnew);  // 0 on the first visible block (m = -inf)
        T* o = out + (b * Tc + i) * C + h * hs;
        T l = l_[row] * a;
        for (int c = 0; c < hs; ++c) o[c] *= a;
        for (int t = 0; t < visible; ++t) {
          const T p = std::exp(sc[t] - mnew);
          const T* v = kv + (b * Tc + t) * 2 * C + C + h * hs;
          l += p;
          for (int c = 0; c < hs; ++c) o[c] += p * v[c];
        }
        m_[row] = mnew;
        l_[row] = l;
      }
    }
  });
}

template <typename T>
void CpuKernels<T>::ring_forward_end(T* out, T* lse, const T* m_, const T* l_, int B, int Tc, int C, int NH) {
  const int hs = C / NH;
  pool_.parallel_for(static_cast<size_t>(B) * NH, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      for (int i = 0; i < Tc; ++i) {
        const size_t row = bh * Tc + i;
        const T inv = T(1) / l_[row];
        T* o = out + (b * Tc + i) * C + h * hs;
        for (int c = 0; c < hs; ++c) o[c] *= inv;
        lse[row] = m_[row] + std::log(l_[row]);
      }
    }
  });
}

template <typename T>
void CpuKernels<T>::ring_backward_begin(T* kv, T* dkv, T* dqkv, T* d_, const T* dout, const T* qkv, const T* out, int B,
                                        int Tc, int C, int NH) {
  const size_t Cs = C;
  const int hs = C / NH;
  for (size_t bt = 0; bt < static_cast<size_t>(B) * Tc; ++bt)
    std::memcpy(kv + bt * 2 * Cs, qkv + bt * 3 * Cs + Cs, 2 * Cs * sizeof(T));
  std::fill(dkv, dkv + static_cast<size_t>(B) * Tc * 2 * Cs, T(0));
  std::memset(dqkv, 0, static_cast<size_t>(B) * Tc * 3 * Cs * sizeof(T));
  // D (b,h,i) = dout_i . out_i over the head's channels (the softmax backward's row term)
  pool_.parallel_for(static_cast<size_t>(B) * NH, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      for (int i = 0; i < Tc; ++i) {
        const T *o = out + (b * Tc + i) * C + h * hs, *d = dout + (b * Tc + i) * C + h * hs;
        T sum = 0;
        for (int c = 0; c < hs; ++c) sum += o[c] * d[c];
        d_[bh * Tc + i] = sum;
      }
    }
  });
}

template <typename T>
void CpuKernels<T>::ring_backward_block(T* dqkv, T* dkv, const T* dout, const T* qkv, const T* kv, const T* lse,
                                        const T* d_, int B, int Tc, int C, int NH, bool diagonal) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  pool_.parallel_for(static_cast<size_t>(B) * NH, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      for (int i = 0; i < Tc; ++i) {
        const T* q = qkv + (b * Tc + i) * 3 * C + h * hs;
        const T* d = dout + (b * Tc + i) * C + h * hs;
        T* dq = dqkv + (b * Tc + i) * 3 * C + h * hs;
        const size_t row = bh * Tc + i;
        const int visible = diagonal ? i + 1 : Tc;
        for (int t = 0; t < visible; ++t) {
          const T* k = kv + (b * Tc + t) * 2 * C + h * hs;
          const T* v = k + C;
          T* dk = dkv + (b * Tc + t) * 2 * C + h * hs;
          T* dv = dk + C;
          T dot = 0, dp = 0;
          for (int c = 0; c < hs; ++c) {
            dot += q[c] * k[c];
            dp += d[c] * v[c];
          }
          const T p = std::exp(dot * scale - lse[row]);
          const T ds = p * (dp - d_[row]) * scale;
          for (int c = 0; c < hs; ++c) {
            dv[c] += p * d[c];
            dq[c] += ds * k[c];
            dk[c] += ds * q[c];
          }
        }
      }
    }
  });
}

template <typename T>
void CpuKernels<T>::ring_backward_end(T* dqkv, const T* dkv, int B, int Tc, int C) {
  for (size_t bt = 0; bt < static_cast<size_t>(B) * Tc; ++bt) {
    T* dst = dqkv + bt * 3 * C + C;
    const T* src = dkv + bt * 2 * C;
    for (int c = 0; c < 2 * C; ++c) dst[c] = src[c];
  }
}

template <typename T>
void CpuKernels<T>::moe_route(T* probs, int32_t* choice, size_t N, size_t E, size_t k) {
  moe::route(pool_, probs, choice, N, E, k);
}

template <typename T>
void CpuKernels<T>::moe_gather_rows(T* dst, const T* src, const int32_t* idx, size_t n, size_t C) {
  moe::gather_rows(pool_, dst, src, idx, n, C);
}

template <typename T>
void CpuKernels<T>::moe_gate_rows(T* dst, const T* src, const T* probs, const int32_t* idx, size_t e, size_t E,
                                  size_t n, size_t C) {
  moe::gate_rows(pool_, dst, src, probs, idx, e, E, n, C);
}

template <typename T>
void CpuKernels<T>::moe_combine(T* out, const T* probs, const int32_t* choice, const int32_t* row, const T* y, size_t N,
                                size_t E, size_t k, size_t C) {
  moe::combine(pool_, out, probs, choice, row, y, N, E, k, C);
}

template <typename T>
void CpuKernels<T>::moe_router_backward(T* dprobs, const T* probs, const int32_t* choice, const int32_t* row,
                                        const T* y, const T* dout, const T* aux, T dloss, size_t N, size_t E, size_t k,
                                        size_t C) {
  moe::router_backward(pool_, dprobs, probs, choice, row, y, dout, aux, dloss, N, E, k, C);
}

template <typename T>
void CpuKernels<T>::moe_combine_input_grads(T* dx, const int32_t* row, const T* dxe, size_t N, size_t k, size_t C) {
  moe::combine_input_grads(pool_, dx, row, dxe, N, k, C);
}

template <typename T>
void CpuKernels<T>::divide(T* x, T divisor, size_t n) {
  // Element-wise, so the split over threads does not change a bit.
  pool_.parallel_for(n, [=](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) x[i] = x[i] / divisor;
  });
}

template class CpuKernels<float>;
template class CpuKernels<double>;

}  // namespace railyard::worker
