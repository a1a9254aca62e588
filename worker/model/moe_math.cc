#include "worker/model/moe_math.h"

#include <algorithm>
#include <cmath>

namespace railyard::worker {

size_t moe_capacity(const MoeConfig& m, size_t N) {
  if (m.experts <= 0) return 0;
  if (m.capacity_factor <= 0) return N;
  const double want = std::ceil(m.capacity_factor * m.top_k * static_cast<double>(N) / m.experts);
  return std::min(N, std::max<size_t>(1, static_cast<size_t>(want)));
}

}  // namespace railyard::worker

namespace railyard::worker::moe {

double aux_loss(const Balance& b, const MoeConfig& m) {
  if (b.tokens <= 0) return 0;
  double aux = 0;
  for (size_t e = 0; e < b.picked.size(); ++e) {
    aux += b.picked[e] / (b.tokens * m.top_k) * (b.psum[e] / b.tokens);
  }
  return m.aux_loss_coef * static_cast<double>(m.experts) * aux;
}

template <typename T>
std::vector<T> aux_grads(const std::vector<double>& f, double tokens, const MoeConfig& m) {
  std::vector<T> aux(f.size());
  for (size_t e = 0; e < f.size(); ++e) {
    aux[e] = static_cast<T>(m.aux_loss_coef * static_cast<double>(m.experts) * f[e] / tokens);
  }
  return aux;
}

template <typename T>
void router_backward(ThreadPool& pool, T* dprobs, const T* probs, const int32_t* choice, const int32_t* row, const T* y,
                     const T* dout, const std::vector<double>& f, double tokens, const MoeConfig& m, T dloss, size_t N,
                     size_t C) {
  const std::vector<T> aux = aux_grads<T>(f, tokens, m);
  router_backward(pool, dprobs, probs, choice, row, y, dout, aux.data(), dloss, N, static_cast<size_t>(m.experts),
                  static_cast<size_t>(m.top_k), C);
}

#define RAILYARD_MOE_MODEL(T)                                                                                  \
  template std::vector<T> aux_grads(const std::vector<double>&, double, const MoeConfig&);                     \
  template void router_backward(ThreadPool&, T*, const T*, const int32_t*, const int32_t*, const T*, const T*, \
                                const std::vector<double>&, double, const MoeConfig&, T, size_t, size_t);
RAILYARD_MOE_MODEL(float)
RAILYARD_MOE_MODEL(double)
#undef RAILYARD_MOE_MODEL

}  // namespace railyard::worker::moe
