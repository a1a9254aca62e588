#include "worker/kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace railyard::worker::moe {

template <typename T>
void route(ThreadPool& pool, T* probs, int32_t* choice, size_t N, size_t E, size_t k) {
  pool.parallel_for(N, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      T* p = probs + t * E;
      T mx = p[0];
      for (size_t e = 1; e < E; ++e) mx = std::max(mx, p[e]);
      T sum = 0;
      for (size_t e = 0; e < E; ++e) {
        p[e] = std::exp(p[e] - mx);
        sum += p[e];
      }
      for (size_t e = 0; e < E; ++e) p[e] /= sum;
      for (size_t j = 0; j < k; ++j) {
        int32_t best = -1;
        for (size_t e = 0; e < E; ++e) {
          bool taken = false;
          for (size_t i = 0; i < j; ++i) taken |= choice[t * k + i] == static_cast<int32_t>(e);
          if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
        }
        choice[t * k + j] = best;
      }
    }
  });
}

void round_counts(const int32_t* choice, size_t N, size_t k, size_t E, int32_t* counts) {
  std::fill(counts, counts + k * E, 0);
  for (size_t t = 0; t < N; ++t) {
    for (size_t j = 0; j < k; ++j) ++counts[j * E + choice[t * k + j]];
  }
}

void dispatch_base(const int32_t* all, int ranks, int rank, size_t k, size_t E, int32_t* base) {
  for (size_t j = 0; j < k; ++j) {
    for (size_t e = 0; e < E; ++e) {
      int32_t b = 0;
      for (int q = 0; q < ranks; ++q) {
        for (size_t jj = 0; jj < j; ++jj) b += all[q * k * E + jj * E + e];  // earlier rounds, every rank
        if (q < rank) b += all[q * k * E + j * E + e];                       // this round, ranks before this one
      }
      base[j * E + e] = b;
    }
  }
}

size_t dispatch(const int32_t* choice, size_t N, size_t k, size_t E, size_t cap, const int32_t* base, int32_t* row,
                int32_t* count, int32_t* token) {
  std::fill(count, count + E, 0);
  std::vector<int32_t> pos(E, 0);  // this round's position of the next choice of e
  size_t dropped = 0;
  for (size_t j = 0; j < k; ++j) {
    // One rank holding every token: the choices ahead are the earlier rounds' (kept or not; once an expert is full
    // it stays full, so this equals counting kept rows).
    for (size_t e = 0; e < E; ++e) pos[e] = base != nullptr ? base[j * E + e] : (j == 0 ? 0 : pos[e]);
    for (size_t t = 0; t < N; ++t) {
      const int32_t e = choice[t * k + j];
      if (static_cast<size_t>(pos[e]++) < cap) {
        const size_t r = e * cap + count[e]++;
        row[t * k + j] = static_cast<int32_t>(r);
        token[r] = static_cast<int32_t>(t);
      } else {
        row[t * k + j] = -1;
        ++dropped;
      }
    }
  }
  return dropped;
}

template <typename T>
void combine(ThreadPool& pool, T* out, const T* probs, const int32_t* choice, const int32_t* row, const T* y, size_t N,
             size_t E, size_t k, size_t C) {
  pool.parallel_for(N, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      T* o = out + t * C;
      std::fill(o, o + C, T(0));
      for (size_t j = 0; j < k; ++j) {
        const int32_t r = row[t * k + j];
        if (r < 0) continue;
        const T gate = probs[t * E + choice[t * k + j]];
        const T* yr = y + static_cast<size_t>(r) * C;
        for (size_t c = 0; c < C; ++c) o[c] += gate * yr[c];
      }
    }
  });
}

size_t tokens_dropped(const int32_t* row, size_t N, size_t k) {
  size_t lost = 0;
  for (size_t t = 0; t < N; ++t) {
    bool any = false;
    for (size_t j = 0; j < k; ++j) any |= row[t * k + j] >= 0;
    lost += any ? 0 : 1;
  }
  return lost;
}

template <typename T>
Balance balance(const T* probs, const int32_t* choice, size_t N, size_t E, size_t k) {
  Balance b;
  b.picked.assign(E, 0.0);
  b.psum.assign(E, 0.0);
  b.tokens = static_cast<double>(N);
  for (size_t i = 0; i < N * k; ++i) b.picked[choice[i]] += 1;
  for (size_t e = 0; e < E; ++e) {
    double P = 0;
    for (size_t t = 0; t < N; ++t) P += static_cast<double>(probs[t * E + e]);
    b.psum[e] = P;
  }
  return b;
}

std::vector<double> choice_shares(const Balance& b, size_t k) {
  std::vector<double> f(b.picked.size(), 0.0);
  for (size_t e = 0; e < f.size(); ++e) f[e] = b.tokens > 0 ? b.picked[e] / (b.tokens * static_cast<double>(k)) : 0;
  return f;
}

std::vector<double> choice_shares(const int32_t* choice, size_t N, size_t k, size_t E) {
  Balance b;
  b.picked.assign(E, 0.0);
  b.tokens = static_cast<double>(N);
  for (size_t i = 0; i < N * k; ++i) b.picked[choice[i]] += 1;
  return choice_shares(b, k);
}

template <typename T>
void router_backward(ThreadPool& pool, T* dprobs, const T* probs, const int32_t* choice, const int32_t* row, const T* y,
                     const T* dout, const T* aux, T dloss, size_t N, size_t E, size_t k, size_t C) {
  pool.parallel_for(N, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      T* dp = dprobs + t * E;
      // the load-balancing loss (f_e is piecewise constant): d aux / d probs[t, e] = alpha E f_e / tokens
      for (size_t e = 0; e < E; ++e) dp[e] = aux[e] * dloss;
      // the gates: dp[t, e] += dout[t] . y[row] for kept choices
      for (size_t j = 0; j < k; ++j) {
        const int32_t r = row[t * k + j];
        if (r < 0) continue;
        const T* yr = y + static_cast<size_t>(r) * C;
        const T* d = dout + t * C;
        T dot = 0;
        for (size_t c = 0; c < C; ++c) dot += d[c] * yr[c];
        dp[choice[t * k + j]] += dot;
      }
      // softmax backward in place: dz = p * (dp - sum_e p dp)
      const T* p = probs + t * E;
      T s = 0;
      for (size_t e = 0; e < E; ++e) s += p[e] * dp[e];
      for (size_t e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - s);
    }
  });
}

template <typename T>
void gather_rows(ThreadPool& pool, T* dst, const T* src, const int32_t* idx, size_t n, size_t C) {
  pool.parallel_for(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) std::memcpy(dst + i * C, src + static_cast<size_t>(idx[i]) * C, C * sizeof(T));
  });
}

template <typename T>
void gate_rows(ThreadPool& pool, T* dst, const T* src, const T* probs, const int32_t* idx, size_t e, size_t E, size_t n,
               size_t C) {
  pool.parallel_for(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const size_t t = static_cast<size_t>(idx[i]);
      const T gate = probs[t * E + e];
      for (size_t c = 0; c < C; ++c) dst[i * C + c] = gate * src[t * C + c];
    }
  });
}

template <typename T>
void combine_input_grads(ThreadPool& pool, T* dx, const int32_t* row, const T* dxe, size_t N, size_t k, size_t C) {
  pool.parallel_for(N, [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      T* o = dx + t * C;
      std::fill(o, o + C, T(0));
      for (size_t j = 0; j < k; ++j) {
        const int32_t r = row[t * k + j];
        if (r < 0) continue;
        const T* d = dxe + static_cast<size_t>(r) * C;
        for (size_t c = 0; c < C; ++c) o[c] += d[c];
      }
    }
  });
}

#define RAILYARD_MOE_KERNELS(T)                                                                                      \
  template void route(ThreadPool&, T*, int32_t*, size_t, size_t, size_t);                                            \
  template void combine(ThreadPool&, T*, const T*, const int32_t*, const int32_t*, const T*, size_t, size_t, size_t, \
                        size_t);                                                                                     \
  template Balance balance(const T*, const int32_t*, size_t, size_t, size_t);                                        \
  template void combine_input_grads(ThreadPool&, T*, const int32_t*, const T*, size_t, size_t, size_t);              \
  template void router_backward(ThreadPool&, T*, const T*, const int32_t*, const int32_t*, const T*, const T*,       \
                                const T*, T, size_t, size_t, size_t, size_t);                                        \
  template void gather_rows(ThreadPool&, T*, const T*, const int32_t*, size_t, size_t);                              \
  template void gate_rows(ThreadPool&, T*, const T*, const T*, const int32_t*, size_t, size_t, size_t, size_t);
RAILYARD_MOE_KERNELS(float)
RAILYARD_MOE_KERNELS(double)
#undef RAILYARD_MOE_KERNELS

}  // namespace railyard::worker::moe
