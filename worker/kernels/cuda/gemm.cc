#include "worker/kernels/cuda/gemm.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/launch.h"

namespace railyard::worker::cuda {
namespace {

// Owns the cuBLASLt descriptors of one call, so an exception in the middle leaks nothing.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

int checked_int(size_t v, const char* name) {
  if (v > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw std::invalid_argument(std::string("matmul: ") + name + "=" + std::to_string(v) +
                                " exceeds INT_MAX: split it");
  }
  return static_cast<int>(v);
}

}  // namespace

BlasLt::BlasLt() {
  require_device("cuBLASLt (BlasLt)");
  int device = 0, major = 0;
  RAILYARD_CUDA_CHECK(cudaGetDevice(&device));
  RAILYARD_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  workspace_bytes_ = gemm_workspace_bytes(major);
  RAILYARD_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  const cublasStatus_t st = cublasLtCreate(&handle_);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaFree(workspace_);
    workspace_ = nullptr;
    check_cublas(st, "cublasLtCreate");
  }
}

BlasLt::~BlasLt() {
  if (handle_) cublasLtDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

void gemm(BlasLt& lt, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream, Epilogue epilogue,
          const float* bias, float* aux) {
  if (M <= 0 || N <= 0 || K <= 0) {
    throw std::invalid_argument("gemm: M, N, K must be positive, got " + std::to_string(M) + ", " + std::to_string(N) +
                                ", " + std::to_string(K));
  }
  if (epilogue != Epilogue::kNone && (bias == nullptr || beta != 0.0f)) {
    throw std::invalid_argument("gemm: a bias/GELU epilogue needs a bias pointer and beta = 0");
  }
  if ((epilogue == Epilogue::kGeluAuxBias) != (aux != nullptr)) {
    throw std::invalid_argument("gemm: the aux pointer is required with Epilogue::kGeluAuxBias and only there");
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep each one's transpose.
  const int m = N, n = M, k = K;
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // the first column-major operand is B
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  Descs d;
  RAILYARD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  RAILYARD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  RAILYARD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (epilogue != Epilogue::kNone) {
    const cublasLtEpilogue_t epi = epilogue == Epilogue::kBias       ? CUBLASLT_EPILOGUE_BIAS
                                   : epilogue == Epilogue::kGeluBias ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                                     : CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    const cudaDataType_t bias_type = CUDA_R_32F;
    RAILYARD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    RAILYARD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    RAILYARD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  if (aux != nullptr) {
    // The aux matrix has D's column-major shape (m x n); ld = ldc keeps it laid out exactly like C.
    // The aux type defaults to C's (fp32). cuBLASLt wants the GELU aux leading dimension divisible by 8.
    const int64_t aux_ld = ldc;
    if (aux_ld % 8 != 0) {
      throw std::invalid_argument("gemm: Epilogue::kGeluAuxBias needs ldc divisible by 8 (cuBLASLt aux layout), got " +
                                  std::to_string(ldc) + ": pad the output features");
    }
    RAILYARD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    RAILYARD_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  // Column-major shapes as stored: B is (K,N) or (N,K) row-major, i.e. (N,K) / (K,N) column-major with ld = ldb.
  RAILYARD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, trans_b ? k : m, trans_b ? m : k, ldb));
  RAILYARD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, trans_a ? n : k, trans_a ? k : n, lda));
  RAILYARD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, m, n, ldc));
  RAILYARD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const size_t ws = lt.workspace_bytes();
  RAILYARD_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  RAILYARD_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(lt.handle(), d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found));
  if (found == 0) {
    throw CudaError("cublasLtMatmulAlgoGetHeuristic: no algorithm for M=" + std::to_string(M) +
                    " N=" + std::to_string(N) + " K=" + std::to_string(K) + " (bf16 in, fp32 out)");
  }
  RAILYARD_CUBLAS_CHECK(cublasLtMatmul(lt.handle(), d.op, &alpha, B, d.a, A, d.b, &beta, C, d.c, C, d.c,
                                       &heuristic.algo, lt.workspace(), ws, stream));
}

void matmul_forward(BlasLt& lt, float* out, const bf16* inp, const bf16* w, const float* bias, size_t N, int IC, int OC,
                    bool gelu, cudaStream_t stream, float* pre_gelu) {
  if (gelu && bias == nullptr) throw std::invalid_argument("matmul_forward: gelu needs a bias (GELU_BIAS epilogue)");
  if (pre_gelu != nullptr && !gelu) throw std::invalid_argument("matmul_forward: pre_gelu is only written with gelu");
  const Epilogue epi = bias == nullptr ? Epilogue::kNone
                       : !gelu         ? Epilogue::kBias
                       : pre_gelu      ? Epilogue::kGeluAuxBias
                                       : Epilogue::kGeluBias;
  gemm(lt, false, true, checked_int(N, "N"), OC, IC, 1.0f, inp, IC, w, IC, 0.0f, out, OC, stream, epi, bias, pre_gelu);
}

void matmul_backward(BlasLt& lt, float* dinp, bool accumulate_dinp, float* dw, float* dbias, const bf16* dout,
                     const float* dout_f32, const bf16* inp, const bf16* w, size_t N, int IC, int OC,
                     bool accumulate_dw, cudaStream_t stream) {
  const int n = checked_int(N, "N");
  // dinp (N,IC) = dout (N,OC) @ w (OC,IC)
  gemm(lt, false, false, n, IC, OC, 1.0f, dout, OC, w, IC, accumulate_dinp ? 1.0f : 0.0f, dinp, IC, stream);
  // dw (OC,IC) = dout^T (OC,N) @ inp (N,IC)
  gemm(lt, true, false, OC, IC, n, 1.0f, dout, OC, inp, IC, accumulate_dw ? 1.0f : 0.0f, dw, IC, stream);
  if (dbias != nullptr) {
    if (dout_f32 == nullptr) throw std::invalid_argument("matmul_backward: dbias needs dout_f32");
    bias_backward(dbias, dout_f32, N, OC, stream);
  }
}

}  // namespace railyard::worker::cuda
