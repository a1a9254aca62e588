// GEMMs through cuBLASLt: bf16 operands, fp32 accumulation and fp32 output, with cuBLASLt's bias and GELU+bias
// epilogues. Row-major like the CPU gemm (worker/kernels/cpu/kernels.h); the column-major mapping is internal.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "worker/kernels/cuda/kernels.h"

namespace railyard::worker::cuda {

// A cuBLASLt handle plus its workspace (launch.h's gemm_workspace_bytes for the current device). One per stream
// that runs GEMMs concurrently. Throws CudaError ("no CUDA device ...") on a machine without a usable GPU.
class BlasLt {
 public:
  BlasLt();
  ~BlasLt();
  BlasLt(const BlasLt&) = delete;
  BlasLt& operator=(const BlasLt&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

enum class Epilogue {
  kNone,
  kBias,         // C[m, n] += bias[n]  (bias over output columns)
  kGeluBias,     // C = gelu_tanh(op(A) op(B) + bias), the pre-activation is not kept
  kGeluAuxBias,  // as kGeluBias, and the pre-activation op(A) op(B) + bias goes to `aux` (fp32, same shape as C)
};

// Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C; lda/ldb/ldc are row strides as stored. With an
// epilogue, beta must be 0 and bias (N floats) non-null; aux (the pre-activation, laid out like C) only with
// kGeluAuxBias.
void gemm(BlasLt& lt, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream,
          Epilogue epilogue = Epilogue::kNone, const float* bias = nullptr, float* aux = nullptr);

// out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias (OC, may be null); gelu applies GELU after the bias (needs a bias),
// and then pre_gelu (N,OC, may be null) receives the pre-activation that gelu_backward needs.
void matmul_forward(BlasLt& lt, float* out, const bf16* inp, const bf16* w, const float* bias, size_t N, int IC, int OC,
                    bool gelu, cudaStream_t stream, float* pre_gelu = nullptr);
// dinp (N,IC) = (or += when accumulate_dinp) dout @ w; dw (OC,IC) += dout^T @ inp (= when !accumulate_dw);
// dbias (OC, may be null) += column sums of dout_f32 (the fp32 gradient the bf16 dout was made from).
void matmul_backward(BlasLt& lt, float* dinp, bool accumulate_dinp, float* dw, float* dbias, const bf16* dout,
                     const float* dout_f32, const bf16* inp, const bf16* w, size_t N, int IC, int OC,
                     bool accumulate_dw, cudaStream_t stream);

}  // namespace railyard::worker::cuda
