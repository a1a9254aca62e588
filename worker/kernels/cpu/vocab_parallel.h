// Kernels of the vocab-parallel embedding and cross entropy (Megatron): wte is split by vocabulary rows, rank r
// holding rows [v0, v0 + Vl), of which the first Vr are real tokens (the rest padding). No kernel communicates: the
// caller all-reduces between the phases. Shapes: N = B*T rows, C channels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/kernels/cpu/thread_pool.h"

namespace railyard::worker::cpu {

// out (B,T,C) = wte_local[inp - v0] for tokens held here, 0 for the others (the all-reduce over tp completes it).
void vocab_embedding_forward(ThreadPool& pool, float* out, const int32_t* inp, const float* wte_local, int v0, int Vl,
                             size_t N, int C);
// out (B,T,C) += wpe[t], after the all-reduce so that the position table is added once.
void add_positions(ThreadPool& pool, float* out, const float* wpe, int B, int Tn, int C);
// out (rows,C) += wpe[position] for the token rows [row0, row0 + rows) of the (B,T) row-major micro-batch (a
// sequence-parallel rank's shard): the position of row i is i mod Tn.
void add_positions_rows(ThreadPool& pool, float* out, const float* wpe, size_t row0, size_t rows, int Tn, int C);
// dwte_local (Vl,C) += dout rows of the tokens held here; dwpe (maxT,C) += sum over b when dwpe is not null.
// Split over channels, so no two threads touch one element and the summation order is fixed.
void vocab_embedding_backward(ThreadPool& pool, float* dwte_local, float* dwpe, const float* dout, const int32_t* inp,
                              int v0, int Vl, int B, int Tn, int C);

// Phase 1: mx (N) = max over the Vr real local logits of each row (-inf when Vr = 0). All-reduce max follows.
void vocab_ce_local_max(ThreadPool& pool, float* mx, const float* logits, size_t N, int Vl, int Vr);
// Phase 2: logits (N,Vl) <- exp(logits - mx) for the real columns; sums (2N) = [sum of those (N) | the target's raw
// logit when the target is held here, else 0 (N)]. All-reduce sum follows.
void vocab_ce_local_sums(ThreadPool& pool, float* sums, float* logits, const float* mx, const int32_t* targets, int v0,
                         size_t N, int Vl, int Vr);
// Phase 3: losses (N) = log(S) + mx - z_target; logits (N,Vl) <- scale * (softmax - onehot), padding columns 0:
// the gradient the LM head's backward needs. scale = d(objective)/d(loss of one row).
void vocab_ce_finish(ThreadPool& pool, float* losses, float* logits, const float* sums, const float* mx,
                     const int32_t* targets, int v0, size_t N, int Vl, int Vr, float scale);

}  // namespace railyard::worker::cpu
