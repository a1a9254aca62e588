// CUDA twins of worker/kernels/cpu/kernels.h: the same math, shapes and accumulation rules (+= into parameter
// gradients), fp32 activations and gradients, plus the bf16 conversion the cuBLASLt GEMMs (gemm.h) take as input and
// AdamW with fp32 master weights. Every function enqueues on `stream` and returns; errors (a bad launch, no device)
// throw CudaError naming the kernel. Scratch buffers are sized by launch.h's plans; no kernel allocates.
// Shapes: B batch, T time, C channels, NH heads, hs = C/NH, V real vocab, Vp padded vocab, N = B*T rows.
//
// Differences from the CPU twins, by design:
//  - attention keeps no (B,NH,T,T) probability matrix: forward saves the row log-sum-exp `lse` (B,NH,T) and backward
//    recomputes the probabilities tile by tile (flash-attention style, one warp per row, K/V or Q/dO tiles in shared
//    memory; CUDA cores, not tensor-core MMA).
//  - layernorm_backward and attention_backward take a scratch buffer (launch.h gives its size) so dw/db and the
//    softmax-backward row sums are reduced in a fixed order: results are bitwise reproducible run to run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace railyard::worker::cuda {

using bf16 = __nv_bfloat16;

// out (B,T,C) = wte[inp[b,t]] + wpe[t]
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int Tn, int C,
                     cudaStream_t stream);
// dwte (Vp,C) += scatter of dout by token; dwpe (maxT,C) += sum over b. No atomics: the rows grouped by token
// (launch.h token_rows, built on the host; rows, tokens, starts are its arrays in device memory, `distinct` tokens),
// one thread per (token, channel) adding that token's rows in row order (the CPU twin's order: the same bits).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* rows, const int32_t* tokens,
                      const int32_t* starts, size_t distinct, int B, int Tn, int C, cudaStream_t stream);
// The dwte part alone (also the stage's vocab-parallel embedding): dw (V,C) rows tokens[u] += the dout rows
// rows[starts[u] .. starts[u+1]) in that order, for the `distinct` groups of token_rows.
void token_rows_backward(float* dw, const float* dout, const int32_t* rows, const int32_t* tokens,
                         const int32_t* starts, size_t distinct, int C, cudaStream_t stream);

// out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved. eps 1e-5, biased variance.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, size_t N,
                       int C, cudaStream_t stream);
// dinp (N,C) +=, dw (C) +=, db (C) +=. scratch: layernorm_backward_plan(N, C).scratch_floats.
void layernorm_backward(float* dinp, float* dw, float* db, float* scratch, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, size_t N, int C, cudaStream_t stream);

// Fused residual + layernorm (the CPU runs residual_forward then layernorm_forward): residual (N,C) = a + b, then
// out = layernorm(residual) with mean/rstd saved as layernorm_forward does. One read of a and b, no second pass over
// the residual from global memory for the statistics' input.
void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* a, const float* b,
                                const float* w, const float* bias, size_t N, int C, cudaStream_t stream);

// Causal self-attention. qkv (B,T,3C) holds q|k|v per token; out (B,T,C); lse (B,NH,T) = log sum_s exp(score[t,s]).
void attention_forward(float* out, float* lse, const float* qkv, int B, int Tn, int C, int NH, cudaStream_t stream);
// dqkv (B,T,3C) = (overwritten). scratch: attention_plan(...).scratch_floats.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int Tn, int C, int NH, cudaStream_t stream);

// tanh-approximated GELU; dinp may alias dout.
void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, cudaStream_t stream);

// out = a + b
void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);

// losses (N) = cross entropy of softmax(logits[:, :V]) against targets; logits (N,Vp) untouched.
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, size_t N, int V, int Vp,
                          cudaStream_t stream);
// The same losses, and logits overwritten by dloss * (softmax - onehot); columns V..Vp get 0.
void crossentropy_fused_backward(float* losses, float* logits, const int32_t* targets, size_t N, int V, int Vp,
                                 float dloss, cudaStream_t stream);

// dbias (OC) += column sums of dout (N,OC): the bias part of the CPU matmul_backward.
void bias_backward(float* dbias, const float* dout, size_t N, int OC, cudaStream_t stream);

// out = bf16(in), round to nearest even: GEMM operands.
void to_bf16(bf16* out, const float* in, size_t n, cudaStream_t stream);

// One AdamW update of one tensor (worker/optim/adamw.h's arithmetic; weight_decay 0 for tensors that do not decay),
// on fp32 master params; params_bf16 (may be null) receives the bf16 copy the next forward's GEMMs read.
void adamw_update(float* params, bf16* params_bf16, const float* grads, float* m, float* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t, float grad_scale,
                  cudaStream_t stream);

// partials[c] (double) = sum of x[i]^2 over chunk c = [c * chunk, min(n, (c + 1) * chunk)), ceil(n / chunk) chunks:
// the global gradient norm is sqrt of their in-order sum on the host (CudaKernels::global_norm).
void sum_squares_partials(double* partials, const float* x, size_t n, size_t chunk, cudaStream_t stream);

}  // namespace railyard::worker::cuda
