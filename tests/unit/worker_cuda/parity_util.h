// Shared by the CUDA parity tests (worker_cuda_parity): the skip without a GPU, random inputs, one array on both
// devices, and the comparisons. Tolerances are each test's; the rules here are how an error is measured.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "worker/comm/bf16.h"
#include "worker/device/kernels.h"
#include "worker/kernels/cuda/cuda_check.h"

namespace railyard::worker::testing {

// Without a usable GPU the binary exits 77: CTest reports the test as Skipped, never as passed.
inline void skip_without_gpu() {
  if (cuda::device_count() > 0) return;
  std::fprintf(stderr,
               "worker_cuda_parity: SKIPPED: no usable CUDA device on this host (run tests/gpu/run.sh on a GPU "
               "machine)\n");
  std::exit(77);
}

// n uniform values in [-1, 1); bf16: already rounded to bf16 (a GEMM operand CUDA would round itself).
inline std::vector<float> rnd(size_t n, uint32_t seed, bool bf16 = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16 ? comm::bf16_to_float(comm::float_to_bf16(d(rng))) : d(rng);
  return v;
}

// n token ids in [0, V).
inline std::vector<int32_t> tokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// One array on both devices with the same initial bytes: the CPU's buffer is host memory.
template <typename U>
struct Both {
  Both(Kernels<float>& c, Kernels<float>& g, const std::vector<U>& init)
      : gd(g), cpu(c, init.size()), gpu(g, init.size()) {
    c.to_device(cpu.data(), init.data(), init.size() * sizeof(U));
    g.to_device(gpu.data(), init.data(), init.size() * sizeof(U));
  }
  std::vector<U> gpu_host() {
    std::vector<U> h(gpu.size());
    gd.to_host(h.data(), gpu.data(), h.size() * sizeof(U));
    return h;
  }
  std::vector<U> cpu_host() const { return std::vector<U>(cpu.data(), cpu.data() + cpu.size()); }
  Kernels<float>& gd;
  DeviceBuffer<U> cpu, gpu;
};

// Elementwise: |got - want| <= tol * (|want| + mean |want|) everywhere (tol 0: bitwise equal values).
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (float w : want) scale += std::fabs(w);
  scale = want.empty() ? 0 : scale / static_cast<double>(want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(want[i]) + scale + 1e-30);
    if (!(err <= tol)) ++bad;
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements beyond tolerance " << tol);
  CHECK(bad == 0);
}

// ||got - want|| / ||want|| over n values.
inline double rel_l2(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / (den + 1e-300));
}
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  return rel_l2(got.data(), want.data(), want.size());
}

}  // namespace railyard::worker::testing
