// The CPU kernels of a mixture-of-experts layer (docs/worker.md "Mixture of experts"): router softmax and top-k,
// dispatch under capacity, combine, the load-balancing statistics and the router's backward from a per-expert
// load-balancing gradient. The device interface's CPU kernels (worker/device/cpu_kernels.cc) run them, and so do the
// model (worker/model/gpt.cc) and the pipeline stage (worker/parallel/gpt_stage_moe.cc) through
// worker/model/moe_math.h, which adds what depends on the model's MoeConfig. No communication here: a caller whose
// tokens are split over ranks (sequence parallelism) exchanges the per-expert counts itself and passes the global
// numbers in.
//
// Every loop has a fixed order and each output element one owner: deterministic, and a recomputation reproduces it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/kernels/cpu/thread_pool.h"

namespace railyard::worker::moe {

// probs (N,E): the router logits x @ routerw^T in, their softmax out (in place); choice (N,k): the k largest
// probabilities of each token, ties to the lower expert index.
template <typename T>
void route(ThreadPool& pool, T* probs, int32_t* choice, size_t N, size_t E, size_t k);

// How many of the N*k choices of each round j (the j-th choice of every token) went to each expert: counts (k,E).
void round_counts(const int32_t* choice, size_t N, size_t k, size_t E, int32_t* counts);

// Dispatch with capacity `cap` (GShard's priority: all first choices in token order, then all second choices, ...).
// A choice's position in its expert's queue is base[j*E+e] (choices of e ahead of this rank's round-j choices: the
// earlier rounds of every rank and this round of the ranks before this one) plus its index among this rank's round-j
// choices of e; it is kept when the position is below cap. base = nullptr: this rank holds every token (the base is
// then the earlier rounds' counts). Writes row[t*k+j] = e*cap + i (the expert's i-th kept row here) or -1, count[e]
// (kept rows here), token[e*cap+i]; returns the dropped choices of these tokens.
size_t dispatch(const int32_t* choice, size_t N, size_t k, size_t E, size_t cap, const int32_t* base, int32_t* row,
                int32_t* count, int32_t* token);
// The base of `dispatch` for tp rank `rank` from every rank's round_counts (all_counts: ranks x (k,E)).
void dispatch_base(const int32_t* all_counts, int ranks, int rank, size_t k, size_t E, int32_t* base);

// out (N,C) = sum over the token's kept choices (choice order) of probs[t,e] * y[row]; 0 when all were dropped.
template <typename T>
void combine(ThreadPool& pool, T* out, const T* probs, const int32_t* choice, const int32_t* row, const T* y, size_t N,
             size_t E, size_t k, size_t C);

// Tokens whose k choices were all dropped.
size_t tokens_dropped(const int32_t* row, size_t N, size_t k);

// The load-balancing statistics of a layer: picked[e] = choices of e (before capacity) and psum[e] = sum over tokens
// of probs[t,e] (token order, double), over `tokens` tokens. Sums of partial Balances (ranks holding disjoint tokens)
// give the layer's.
struct Balance {
  std::vector<double> picked, psum;
  double tokens = 0;
};
template <typename T>
Balance balance(const T* probs, const int32_t* choice, size_t N, size_t E, size_t k);
// f_e: the share of the choices that picked e (what the loss's gradient needs).
std::vector<double> choice_shares(const Balance& b, size_t k);
// choice_shares of these N tokens' Balance from their choices alone (the shares do not read probs), for a device
// whose probabilities are not on the host.
std::vector<double> choice_shares(const int32_t* choice, size_t N, size_t k, size_t E);

// Router backward for the N tokens held here, with the load-balancing term given per expert (aux: alpha E f_e /
// tokens, see worker/model/moe_math.h aux_grads). dprobs (N,E) out: d objective / d router logits, from the gates
// (dout[t] . y[row] for kept choices) and aux times dloss, through the softmax. The device kernels' CPU twin.
template <typename T>
void router_backward(ThreadPool& pool, T* dprobs, const T* probs, const int32_t* choice, const int32_t* row, const T* y,
                     const T* dout, const T* aux, T dloss, size_t N, size_t E, size_t k, size_t C);

// dst (n,C): row i = src[idx[i]]; gate_rows: row i = probs[idx[i], e] * src[idx[i]].
template <typename T>
void gather_rows(ThreadPool& pool, T* dst, const T* src, const int32_t* idx, size_t n, size_t C);
template <typename T>
void gate_rows(ThreadPool& pool, T* dst, const T* src, const T* probs, const int32_t* idx, size_t e, size_t E, size_t n,
               size_t C);

// dx (N,C) = sum over the token's kept choices (choice order) of the expert input gradients dxe[row] (overwritten).
template <typename T>
void combine_input_grads(ThreadPool& pool, T* dx, const int32_t* row, const T* dxe, size_t N, size_t k, size_t C);

}  // namespace railyard::worker::moe
