// Calling into the CUDA path without a usable GPU (this machine, CI): every entry point fails with one CudaError that
// names the call and says "no CUDA device". On a GPU host these checks are skipped (the parity test covers it).
#include <doctest/doctest.h>

#include <string>

#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/cuda_device.h"
#include "worker/kernels/cuda/gemm.h"
#include "worker/kernels/cuda/kernels.h"
#include "worker/kernels/cuda/launch.h"

using namespace railyard::worker::cuda;

TEST_CASE("device_count never throws and agrees with require_device") {
  const int n = device_count();
  CHECK(n >= 0);
  if (n > 0) {
    CHECK_NOTHROW(require_device("test"));
    return;
  }
  CHECK_THROWS_WITH_AS(require_device("railyard-worker"), doctest::Contains("railyard-worker: no CUDA device"),
                       CudaError);
  CHECK_THROWS_WITH_AS(require_device("x"), doctest::Contains("spec.device: cpu"), CudaError);
}

TEST_CASE("without a GPU: BlasLt and kernel launches throw CudaError naming the call") {
  if (device_count() > 0) return;  // GPU host: worker_cuda_parity runs the kernels for real
  CHECK_THROWS_WITH_AS(BlasLt(), doctest::Contains("cuBLASLt (BlasLt): no CUDA device"), CudaError);
  // Launches fail (no device) and say which kernel and why; the arguments are never dereferenced on the host.
  float* p = nullptr;
  CHECK_THROWS_WITH_AS(gelu_forward(p, p, 1024, nullptr), doctest::Contains("launch of gelu_forward_kernel"),
                       CudaError);
  CHECK_THROWS_WITH_AS(residual_forward(p, p, p, 10, nullptr), doctest::Contains("no CUDA device"), CudaError);
  CHECK_THROWS_WITH_AS(attention_forward(p, p, p, 1, 16, 64, 2, nullptr),
                       doctest::Contains("launch of attention_forward_kernel"), CudaError);
  // Shape errors come first, before any CUDA call.
  CHECK_THROWS_WITH_AS(attention_forward(p, p, p, 1, 16, 65, 2, nullptr), doctest::Contains("not a multiple of NH"),
                       std::invalid_argument);
  // Zero-sized work is a no-op, not an error.
  CHECK_NOTHROW(gelu_forward(p, p, 0, nullptr));
}

TEST_CASE("without a GPU: the device interface's CUDA implementation refuses to start, naming spec.device") {
  if (device_count() > 0) return;  // GPU host: worker_cuda_parity trains through it
  CHECK_THROWS_WITH_AS(CudaKernels(), doctest::Contains("CudaKernels (spec.device: cuda): no CUDA device"), CudaError);
  // The sizes it would allocate are host arithmetic from launch.h, usable anywhere: lse and D are (B,NH,T), not the
  // CPU's (B,NH,T,T) probabilities.
  const AttentionPlan plan = attention_plan(2, 45, 96, 3);
  CHECK(plan.lse_floats == 2u * 3 * 45);
  CHECK(plan.scratch_floats == 2u * 3 * 45);
}

TEST_CASE("check_cuda and check_cublas messages name the call and the status") {
  CHECK_NOTHROW(check_cuda(cudaSuccess, "ok"));
  CHECK_THROWS_WITH_AS(check_cuda(cudaErrorMemoryAllocation, "cudaMalloc(&p, 1)"),
                       doctest::Contains("cudaMalloc(&p, 1): cudaErrorMemoryAllocation"), CudaError);
  CHECK_THROWS_WITH_AS(check_cuda(cudaErrorInsufficientDriver, "cudaSetDevice(0)"), doctest::Contains("no CUDA device"),
                       CudaError);
  CHECK_THROWS_WITH_AS(check_cublas(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtCreate"),
                       doctest::Contains("cublasLtCreate: CUBLAS_STATUS_NOT_INITIALIZED"), CudaError);
}
