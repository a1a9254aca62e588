// The model side of a mixture-of-experts layer (docs/worker.md "Mixture of experts"): what depends on the model's
// MoeConfig (capacity, the load-balancing loss and its gradient), on top of the CPU kernels in
// worker/kernels/cpu/moe.h. Shared by the single-process / data-parallel model (worker/model/gpt.cc) and the
// tensor/pipeline stage (worker/parallel/gpt_stage_moe.cc), so both compute the same layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/kernels/cpu/moe.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt_config.h"

namespace railyard::worker {

// Tokens each expert takes per micro-batch of N tokens: ceil(cf * k * N / E) in 1..N, or N without a limit (cf <= 0).
size_t moe_capacity(const MoeConfig& m, size_t N);

}  // namespace railyard::worker

namespace railyard::worker::moe {

// alpha * E * sum_e f_e P_e with f_e = picked_e / (tokens k), P_e = psum_e / tokens (Switch/GShard).
double aux_loss(const Balance& b, const MoeConfig& m);

// aux (E): the load-balancing loss's gradient per router probability, alpha E f_e / tokens, rounded to T (the
// router backward multiplies it by dloss). f: choice_shares of the whole layer, tokens: its token count.
template <typename T>
std::vector<T> aux_grads(const std::vector<double>& f, double tokens, const MoeConfig& m);

// Router backward for the N tokens held here. dprobs (N,E) out: d objective / d router logits, from the gates
// (dout[t] . y[row] for kept choices) and the load-balancing loss (alpha E f_e / tokens, times dloss), through the
// softmax. f: choice_shares of the whole layer, tokens: its token count (both global when tokens are split).
template <typename T>
void router_backward(ThreadPool& pool, T* dprobs, const T* probs, const int32_t* choice, const int32_t* row, const T* y,
                     const T* dout, const std::vector<double>& f, double tokens, const MoeConfig& m, T dloss, size_t N,
                     size_t C);

}  // namespace railyard::worker::moe
