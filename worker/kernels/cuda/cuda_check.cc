#include "worker/kernels/cuda/cuda_check.h"

namespace railyard::worker::cuda {
namespace {

bool means_no_device(cudaError_t status) {
  return status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver || status == cudaErrorInitializationError;
}

constexpr const char* kNoDeviceHint =
    "no CUDA device is usable on this host (no GPU or no NVIDIA driver): run on a GPU node or set spec.device: cpu";

}  // namespace

void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  std::string msg = std::string(call) + ": " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status);
  if (means_no_device(status)) msg += " (" + std::string(kNoDeviceHint) + ")";
  throw CudaError(msg);
}

void check_cublas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(std::string(call) + ": " + cublasLtGetStatusName(status) + ": " + cublasLtGetStatusString(status));
}

void check_launch(const char* kernel) {
  // cudaGetLastError also resets a non-sticky launch error, so the next launch reports only its own.
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  check_cuda(status, (std::string("launch of ") + kernel).c_str());
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // the failed query must not surface as the next launch's error
    return 0;
  }
  return n;
}

void require_device(const char* what) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(std::string(what) + ": " + kNoDeviceHint + "; cudaGetDeviceCount: " + cudaGetErrorName(status) +
                    ": " + cudaGetErrorString(status));
  }
  if (n == 0) throw CudaError(std::string(what) + ": " + kNoDeviceHint + "; cudaGetDeviceCount returned 0");
}

}  // namespace railyard::worker::cuda
