// Shared by the whole-model parity tests (test_device_parity.cc, test_moe_parity.cc): one Gpt<float> on the CPU and
// the same model on CUDA (CudaKernels), from the same init_weights(seed).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/kernels/cpu/thread_pool.h"
#include "worker/kernels/cuda/cuda_device.h"
#include "worker/model/gpt.h"

namespace railyard::worker::testing {

struct GptOnBoth {
  GptOnBoth(const GptConfig& c, int B, int T, uint64_t seed)
      : cfg(c), on_cpu(cfg, B, T, pool), on_gpu(cfg, B, T, pool, {}, &g) {
    on_cpu.init_weights(seed);
    on_gpu.init_weights(seed);
  }
  // The CUDA model's gradients, copied to the host.
  std::vector<float> gpu_grads() {
    std::vector<float> out(on_gpu.num_params());
    g.to_host(out.data(), on_gpu.grads(), out.size() * sizeof(float));
    return out;
  }

  ThreadPool pool{2};
  cuda::CudaKernels g;
  const GptConfig cfg;
  Gpt<float> on_cpu, on_gpu;
};

}  // namespace railyard::worker::testing
