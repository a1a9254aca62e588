// CPU kernels of the GPT forward and backward passes, each forward beside its backward (the llm.c way).
//
// Templated on the float type: float is the training path, double exists so the gradient check can compare
// against finite differences without fp32 noise. GEMMs go to OpenBLAS (cblas_sgemm / cblas_dgemm) with the
// transposes chosen so no operand is ever copied; everything else is our own loops on the ThreadPool.
// Shapes: B batch, T time, C channels, NH heads, hs = C/NH, V real vocab, Vp padded vocab, N = B*T rows.
// Backward kernels accumulate (+=) into parameter gradients; activation gradients are noted per kernel.
// Every reduction runs in a fixed order owned by one thread, so results are bitwise reproducible for a given
// thread count. No kernel allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/kernels/cpu/thread_pool.h"

namespace railyard::worker::cpu {

// Makes OpenBLAS single-threaded: its GEMMs run inside our pool's regions (see thread_pool.h). Idempotent.
void init_blas_single_threaded();

// Who parallelises the large GEMMs: kPool (default) splits each GEMM's output across our pool, each thread calling
// single-threaded OpenBLAS; kOpenBlas hands whole GEMMs to OpenBLAS with `threads` of its own threads while our
// pool sleeps (OpenBLAS's threads then spin between GEMMs and compete with our loops; kept to measure that
// choice, see docs/worker.md). Process-wide; set it before training starts.
enum class GemmThreading { kPool, kOpenBlas };
void set_gemm_threading(GemmThreading mode, int threads);
GemmThreading gemm_threading();

// Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, with the output split across the pool along its
// larger dimension. lda/ldb/ldc are row strides of the matrices as stored.
template <typename T>
void gemm(ThreadPool& pool, bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);

// out (B,T,C) = wte[inp[b,t]] + wpe[t]
template <typename T>
void encoder_forward(ThreadPool& pool, T* out, const int32_t* inp, const T* wte, const T* wpe, int B, int Tn, int C);
// dwte (Vp,C) += scatter of dout by token; dwpe (maxT,C) += sum over b. Split over channels (no atomics).
template <typename T>
void encoder_backward(ThreadPool& pool, T* dwte, T* dwpe, const T* dout, const int32_t* inp, int B, int Tn, int C);

// out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved for backward. eps 1e-5, biased variance.
template <typename T>
void layernorm_forward(ThreadPool& pool, T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, size_t N,
                       int C);
// dinp (N,C) +=, dw (C) +=, db (C) +=.
template <typename T>
void layernorm_backward(ThreadPool& pool, T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                        const T* rstd, size_t N, int C);

// out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias (OC, may be null).
template <typename T>
void matmul_forward(ThreadPool& pool, T* out, const T* inp, const T* w, const T* bias, size_t N, int IC, int OC);
// dinp (N,IC) = (or += when accumulate_dinp) dout @ w; dw (OC,IC) += dout^T @ inp (= when !accumulate_dw, which
// saves reading and zeroing dw on a step's first micro-batch); dbias (OC) += column sums.
template <typename T>
void matmul_backward(ThreadPool& pool, T* dinp, bool accumulate_dinp, T* dw, T* dbias, const T* dout, const T* inp,
                     const T* w, size_t N, int IC, int OC, bool accumulate_dw = true);

// Causal self-attention. qkv (B,T,3C) holds q|k|v per token; att (B,NH,T,T) receives the softmax probabilities
// (zero above the diagonal); out (B,T,C) the heads' outputs side by side.
template <typename T>
void attention_forward(ThreadPool& pool, T* out, T* att, const T* qkv, int B, int Tn, int C, int NH);
// Incremental decoding: the attention of one new token at position t over the key/value cache of positions 0..t
// (the new token's own k and v already written at t). q (C); kv (maxT, 2C) holds k|v per position; out (C). The same
// arithmetic as one row of attention_forward (scale, max-subtracted softmax, weighted sum), without the T x T matrix.
template <typename T>
void attention_decode_forward(ThreadPool& pool, T* out, const T* q, const T* kv, int t, int C, int NH);
// dqkv (B,T,3C) = (overwritten). scratch: pool.size() * T * T elements.
template <typename T>
void attention_backward(ThreadPool& pool, T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B, int Tn,
                        int C, int NH);

// tanh-approximated GELU, as GPT-2 and torch's gelu(approximate="tanh").
template <typename T>
void gelu_forward(ThreadPool& pool, T* out, const T* inp, size_t n);
// dinp = gelu'(inp) * dout; dinp may alias dout.
template <typename T>
void gelu_backward(ThreadPool& pool, T* dinp, const T* inp, const T* dout, size_t n);

// out = a + b (the residual stream).
template <typename T>
void residual_forward(ThreadPool& pool, T* out, const T* a, const T* b, size_t n);

// losses (N) = cross entropy of softmax(logits[:, :V]) against targets; logits (N,Vp) untouched (evaluation).
template <typename T>
void crossentropy_forward(ThreadPool& pool, T* losses, const T* logits, const int32_t* targets, size_t N, int V,
                          int Vp);
// Training: the same losses, and logits are overwritten in place by dloss * (softmax - onehot), the gradient the
// LM head's backward needs (padded columns V..Vp get 0). One exp per logit; the probabilities are never stored.
template <typename T>
void crossentropy_fused_backward(ThreadPool& pool, T* losses, T* logits, const int32_t* targets, size_t N, int V,
                                 int Vp, T dloss);

}  // namespace railyard::worker::cpu
