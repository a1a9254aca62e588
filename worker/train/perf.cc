#include "worker/train/perf.h"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "worker/kernels/cpu/kernels.h"
#include "worker/model/gpt.h"

namespace railyard::worker {

double flops_per_token(const GptConfig& shard, int T) {
  const GptConfig c = global_config(shard);  // per token the same work whichever experts this rank stores
  double n = static_cast<double>(num_parameters(c)) - static_cast<double>(c.max_seq_len) * c.channels;
  if (c.moe.experts > 0) {
    // a token runs through top_k of the E experts: the others' MLP weights do no work for it
    const double C = c.channels, expert = 8 * C * C + 5 * C;
    n -= static_cast<double>(c.num_layers) * (c.moe.experts - c.moe.top_k) * expert;
  }
  return 6.0 * n + 12.0 * c.num_layers * static_cast<double>(c.channels) * T;
}

MemoryBudget memory_budget(const GptConfig& c, int B, int T, int threads, const RecomputeSpec& recompute) {
  MemoryBudget m;
  m.params = num_parameters(c) * sizeof(float);
  m.grads = m.params;
  m.adam = 2 * m.params;
  m.activations = activation_bytes(c, B, T, threads, recompute);
  return m;
}

std::string MemoryBudget::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "params=%zu grads=%zu adam_m_v=%zu activations=%zu total=%zu (%.1f MiB)", params,
                grads, adam, activations, total(), total() / 1048576.0);
  return buf;
}

double measure_gemm_rate(ThreadPool& pool, const GptConfig& c, int B, int T, int reps, float* scratch,
                         size_t scratch_len, double* per_cpu_second) {
  cpu::init_blas_single_threaded();
  const int N = B * T, C = c.channels, Vp = c.padded_vocab_size;
  struct Shape {
    int ic, oc;
  };
  const Shape shapes[] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, Vp}};
  size_t max_w = 0, max_io = 0;
  for (auto s : shapes) {
    max_w = std::max(max_w, static_cast<size_t>(s.ic) * s.oc);
    max_io = std::max(max_io, static_cast<size_t>(N) * std::max(s.ic, s.oc));
  }
  // Small random-ish values: denormals or NaNs would distort the timing.
  const size_t need = 2 * max_w + 3 * max_io;
  std::vector<float> owned;
  if (scratch == nullptr || scratch_len < need) {
    owned.resize(need);
    scratch = owned.data();
  }
  float *w = scratch, *dw = w + max_w, *x = dw + max_w, *y = x + max_io, *dx = y + max_io;
  for (size_t i = 0; i < max_w; ++i) w[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-4f;
  for (size_t i = 0; i < max_io; ++i) x[i] = y[i] = static_cast<float>((i * 40503u) % 1000) * 1e-4f;
  double flops = 0;
  for (auto s : shapes) flops += 3 * 2.0 * N * s.ic * s.oc;
  double best = 0, best_cpu = 0;
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
  };
  for (int r = 0; r <= reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    for (auto s : shapes) {
      // forward: y = x @ w^T; backward: dx = y @ w; dw = y^T @ x  (the same calls the model makes)
      cpu::gemm<float>(pool, false, true, N, s.oc, s.ic, 1.0f, x, s.ic, w, s.ic, 0.0f, y, s.oc);
      cpu::gemm<float>(pool, false, false, N, s.ic, s.oc, 1.0f, y, s.oc, w, s.ic, 0.0f, dx, s.ic);
      cpu::gemm<float>(pool, true, false, s.oc, s.ic, N, 1.0f, y, s.oc, x, s.ic, 0.0f, dw, s.ic);
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_now() - c0;
    if (r > 0) {  // r == 0 warms caches and OpenBLAS's buffers
      best = std::max(best, flops / sec);
      best_cpu = std::max(best_cpu, flops / cpu);
    }
  }
  if (per_cpu_second != nullptr) *per_cpu_second = best_cpu;
  return best;
}

}  // namespace railyard::worker
