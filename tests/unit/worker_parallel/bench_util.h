// Shared by the worker_parallel benchmarks (bench_tp_pp.cc, bench_sp_cp.cc): the shape they run, from the environment.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>

#include "common/error.h"
#include "worker/model/gpt_config.h"

namespace railyard::worker::testing {

// The integer in environment variable `name`, or `fallback` when it is unset or empty.
inline int bench_env_int(const char* name, int fallback) {
  const std::string v = railyard::env_or(name, "");
  return v.empty() ? fallback : std::stoi(v);
}

// RAILYARD_BENCH_MODEL (default "tiny"), RAILYARD_BENCH_B (4), RAILYARD_BENCH_T, RAILYARD_BENCH_M and
// RAILYARD_BENCH_STEPS (3), the defaults of T and M each benchmark's own.
struct BenchShape {
  GptConfig cfg;
  int B, T, M, steps;
};

// The shape from the environment, printed as the run's first line.
inline BenchShape bench_shape(int default_T, int default_M) {
  BenchShape s{model_preset(railyard::env_or("RAILYARD_BENCH_MODEL", "tiny")), bench_env_int("RAILYARD_BENCH_B", 4),
               bench_env_int("RAILYARD_BENCH_T", default_T), bench_env_int("RAILYARD_BENCH_M", default_M),
               bench_env_int("RAILYARD_BENCH_STEPS", 3)};
  std::printf("model %s, B=%d T=%d M=%d, %d timed steps after 1 warm-up\n", describe(s.cfg).c_str(), s.B, s.T, s.M,
              s.steps);
  return s;
}

// forward_backward's next_micro_batch for a benchmark: n random inputs and targets in [0, vocab) a call, from an
// mt19937 seeded with `seed`.
inline std::function<void(int32_t*, int32_t*)> random_micro_batches(int vocab, int n, uint32_t seed) {
  return [rng = std::mt19937(seed), vocab, n](int32_t* in, int32_t* tgt) mutable {
    for (int i = 0; i < n; ++i) {
      in[i] = static_cast<int32_t>(rng() % vocab);
      tgt[i] = static_cast<int32_t>(rng() % vocab);
    }
  };
}

}  // namespace railyard::worker::testing
