#include "worker/train/perf.h"

#include <time.h>

#include <algorithm>
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

namespace {
struct GemmShape {
  int ic, oc;
};
// One layer's four linear layers and the LM head.
std::vector<GemmShape> step_gemm_shapes(const GptConfig& c) {
  const int C = c.channels;
  return {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, c.padded_vocab_size}};
}

// The largest weight and the widest input and output among those shapes: what the operands must hold.
struct GemmExtent {
  size_t w = 0, ic = 0, oc = 0;
};
GemmExtent gemm_extent(const std::vector<GemmShape>& shapes) {
  GemmExtent e;
  for (auto s : shapes) {
    e.w = std::max(e.w, static_cast<size_t>(s.ic) * s.oc);
    e.ic = std::max(e.ic, static_cast<size_t>(s.ic));
    e.oc = std::max(e.oc, static_cast<size_t>(s.oc));
  }
  return e;
}
}  // namespace

size_t gemm_rate_scratch(const GptConfig& c, size_t rows) {
  const GemmExtent e = gemm_extent(step_gemm_shapes(c));
  return 2 * e.w + rows * (2 * e.ic + e.oc);  // w, dw; x and dx (rows x ic), y (rows x oc)
}

size_t gemm_rate_rows(const GptConfig& c, size_t rows, size_t scratch_len) {
  while (rows > 0 && gemm_rate_scratch(c, rows) > scratch_len) rows = rows == 1 ? 0 : (rows + 1) / 2;
  return rows;
}

double measure_gemm_rate(ThreadPool& pool, const GptConfig& c, int B, int T, int reps, float* scratch,
                         size_t scratch_len, double* per_cpu_second) {
  cpu::init_blas_single_threaded();
  const int N = B * T;
  const std::vector<GemmShape> shapes = step_gemm_shapes(c);
  const GemmExtent e = gemm_extent(shapes);
  const size_t max_w = e.w, max_ic = e.ic, max_oc = e.oc;
  // Rows per GEMM call: all N in the borrowed buffer when they fit, else blocks of fewer rows (the same FLOPs);
  // memory of its own only without a buffer, or when not one row fits (tiny models, whose operands are small).
  int rows = static_cast<int>(gemm_rate_rows(c, static_cast<size_t>(N), scratch != nullptr ? scratch_len : 0));
  std::vector<float> owned;
  if (rows == 0) {
    rows = N;
    owned.resize(gemm_rate_scratch(c, static_cast<size_t>(N)));
    scratch = owned.data();
  }
  float *w = scratch, *dw = w + max_w, *x = dw + max_w, *y = x + static_cast<size_t>(rows) * max_ic,
        *dx = y + static_cast<size_t>(rows) * max_oc;
  // Small random-ish values: denormals or NaNs would distort the timing.
  for (size_t i = 0; i < max_w; ++i) w[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-4f;
  for (size_t i = 0; i < static_cast<size_t>(rows) * max_ic; ++i)
    x[i] = static_cast<float>((i * 40503u) % 1000) * 1e-4f;
  for (size_t i = 0; i < static_cast<size_t>(rows) * max_oc; ++i)
    y[i] = static_cast<float>((i * 40503u) % 1000) * 1e-4f;
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
      for (int r0 = 0; r0 < N; r0 += rows) {
        const int m = std::min(rows, N - r0);
        // forward: y = x @ w^T; backward: dx = y @ w; dw = y^T @ x  (the same calls the model makes)
        cpu::gemm<float>(pool, false, true, m, s.oc, s.ic, 1.0f, x, s.ic, w, s.ic, 0.0f, y, s.oc);
        cpu::gemm<float>(pool, false, false, m, s.ic, s.oc, 1.0f, y, s.oc, w, s.ic, 0.0f, dx, s.ic);
        cpu::gemm<float>(pool, true, false, s.oc, s.ic, m, 1.0f, y, s.oc, x, s.ic, r0 == 0 ? 0.0f : 1.0f, dw, s.ic);
      }
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
