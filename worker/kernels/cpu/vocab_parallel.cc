#include "worker/kernels/cpu/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace railyard::worker::cpu {

void vocab_embedding_forward(ThreadPool& pool, float* out, const int32_t* inp, const float* wte_local, int v0, int Vl,
                             size_t N, int C) {
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t bt = begin; bt < end; ++bt) {
      float* o = out + bt * C;
      const int row = inp[bt] - v0;
      if (row >= 0 && row < Vl) {
        const float* e = wte_local + static_cast<size_t>(row) * C;
        for (int c = 0; c < C; ++c) o[c] = e[c];
      } else {
        for (int c = 0; c < C; ++c) o[c] = 0;
      }
    }
  });
}

void add_positions(ThreadPool& pool, float* out, const float* wpe, int B, int Tn, int C) {
  pool.parallel_for(static_cast<size_t>(B) * Tn, [&](size_t begin, size_t end) {
    for (size_t bt = begin; bt < end; ++bt) {
      float* o = out + bt * C;
      const float* p = wpe + (bt % Tn) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  });
}

void add_positions_rows(ThreadPool& pool, float* out, const float* wpe, size_t row0, size_t rows, int Tn, int C) {
  pool.parallel_for(rows, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float* o = out + i * C;
      const float* p = wpe + ((row0 + i) % Tn) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  });
}

void vocab_embedding_backward(ThreadPool& pool, float* dwte_local, float* dwpe, const float* dout, const int32_t* inp,
                              int v0, int Vl, int B, int Tn, int C) {
  pool.parallel_for(static_cast<size_t>(C), [&](size_t c0, size_t c1) {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tn; ++t) {
        const size_t bt = static_cast<size_t>(b) * Tn + t;
        const float* d = dout + bt * C;
        const int row = inp[bt] - v0;
        if (row >= 0 && row < Vl) {
          float* we = dwte_local + static_cast<size_t>(row) * C;
          for (size_t c = c0; c < c1; ++c) we[c] += d[c];
        }
        if (dwpe != nullptr) {
          float* wp = dwpe + static_cast<size_t>(t) * C;
          for (size_t c = c0; c < c1; ++c) wp[c] += d[c];
        }
      }
    }
  });
}

void vocab_ce_local_max(ThreadPool& pool, float* mx, const float* logits, size_t N, int Vl, int Vr) {
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const float* z = logits + r * Vl;
      float m = -std::numeric_limits<float>::infinity();
      for (int v = 0; v < Vr; ++v) m = std::max(m, z[v]);
      mx[r] = m;
    }
  });
}

void vocab_ce_local_sums(ThreadPool& pool, float* sums, float* logits, const float* mx, const int32_t* targets, int v0,
                         size_t N, int Vl, int Vr) {
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      float* z = logits + r * Vl;
      const int t = targets[r] - v0;
      sums[N + r] = t >= 0 && t < Vr ? z[t] : 0.0f;
      const float m = mx[r];
      float s = 0;
      for (int v = 0; v < Vr; ++v) {
        z[v] = std::exp(z[v] - m);
        s += z[v];
      }
      sums[r] = s;
    }
  });
}

void vocab_ce_finish(ThreadPool& pool, float* losses, float* logits, const float* sums, const float* mx,
                     const int32_t* targets, int v0, size_t N, int Vl, int Vr, float scale) {
  pool.parallel_for(N, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      float* z = logits + r * Vl;
      const float S = sums[r];
      losses[r] = std::log(S) + mx[r] - sums[N + r];
      const float k = scale / S;
      for (int v = 0; v < Vr; ++v) z[v] *= k;
      for (int v = Vr; v < Vl; ++v) z[v] = 0;
      const int t = targets[r] - v0;
      if (t >= 0 && t < Vr) z[t] -= scale;
    }
  });
}

}  // namespace railyard::worker::cpu
