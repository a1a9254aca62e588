// The entry points of librailyard_cuda.so, the CUDA device loaded by railyard-worker with dlopen only when it trains
// on CUDA (worker/device/cuda_module.h). Exceptions do not cross the C boundary: create reports them as a message.
#include <cstdio>
#include <exception>

#include "worker/device/cuda_module.h"
#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/cuda_device.h"

extern "C" {

__attribute__((visibility("default"))) int railyard_cuda_module_abi() { return railyard::worker::kCudaModuleAbi; }

__attribute__((visibility("default"))) int railyard_cuda_device_count() {
  return railyard::worker::cuda::device_count();
}

__attribute__((visibility("default"))) railyard::worker::Kernels<float>* railyard_cuda_create_kernels(char* err,
                                                                                                      size_t err_len) {
  try {
    return new railyard::worker::cuda::CudaKernels();
  } catch (const std::exception& e) {
    if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "%s", e.what());
  } catch (...) {
    if (err != nullptr && err_len > 0) std::snprintf(err, err_len, "CudaKernels: unknown exception");
  }
  return nullptr;
}

}  // extern "C"
