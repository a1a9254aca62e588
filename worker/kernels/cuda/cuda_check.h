// Error handling of the CUDA path: every CUDA runtime / cuBLASLt call and every kernel launch is checked, and a failure
// becomes a CudaError whose message names the call (and, when the cause is a missing GPU or driver, says so and what
// to do instead).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace railyard::worker::cuda {

class CudaError : public railyard::Error {
 public:
  using railyard::Error::Error;
};

// Throws CudaError("<call>: <error name>: <description>") unless status is cudaSuccess. When the status means that no
// GPU or driver is usable, the message says "no CUDA device" and points to spec.device: cpu.
void check_cuda(cudaError_t status, const char* call);
void check_cublas(cublasStatus_t status, const char* call);
// After a kernel launch: picks up launch errors (bad configuration, no device) and names the kernel.
void check_launch(const char* kernel);

// Number of usable CUDA devices; 0 (never an exception) when there is no driver or no GPU.
int device_count();
// Throws CudaError("no CUDA device ...") when device_count() is 0; the message names `what` (the caller).
void require_device(const char* what);

}  // namespace railyard::worker::cuda

#define RAILYARD_CUDA_CHECK(call) ::railyard::worker::cuda::check_cuda((call), #call)
#define RAILYARD_CUBLAS_CHECK(call) ::railyard::worker::cuda::check_cublas((call), #call)
