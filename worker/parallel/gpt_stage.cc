#include "worker/parallel/gpt_stage.h"

#include <chrono>
#include <cstring>
#include <string>

#include "common/error.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/parallel/vocab_parallel.h"

namespace railyard::worker::parallel {

GptStage::GptStage(const StageShape& shape, int B, int seq_len, int slots, ThreadPool& pool, comm::Communicator* tp,
                   const RecomputeSpec& recompute)
    : shape_(shape), recompute_(recompute), B_(B), T_(seq_len), slots_(slots), pool_(pool), tp_(tp) {
  validate(shape_.config);
  if (B <= 0) throw ConfigError("batch (B) must be positive, got " + std::to_string(B));
  if (seq_len <= 0 || seq_len > shape_.config.max_seq_len) {
    throw ConfigError("sequence length T=" + std::to_string(seq_len) + " must be in 1.." +
                      std::to_string(shape_.config.max_seq_len) + " (the model's maxT)");
  }
  if (slots <= 0) throw ConfigError("a pipeline stage needs at least one activation slot");
  if (shape_.tp_size > 1 && (tp_ == nullptr || tp_->size() != shape_.tp_size || tp_->rank() != shape_.tp_rank)) {
    throw ConfigError("tensor-parallel group does not match the layout: expected rank " +
                      std::to_string(shape_.tp_rank) + " of " + std::to_string(shape_.tp_size));
  }
  cpu::init_blas_single_threaded();
  map_ = make_shard_map(shape_);
  sizes_ = local_param_sizes(shape_);
  size_t n = 0;
  for (size_t s : sizes_) n += s;
  params_ = AlignedBuffer<float>(n);
  grads_ = AlignedBuffer<float>(n);

  const size_t C = shape_.config.channels, Cl = shape_.local_channels(), NHl = shape_.local_heads();
  const size_t Ls = shape_.layers(), Vl = shape_.local_vocab(), N = static_cast<size_t>(B) * seq_len;
  const size_t TT = static_cast<size_t>(seq_len) * seq_len;
  const bool first = shape_.first(), last = shape_.last();
  // One layer without its output res3 and without att: ln1 (N,C), ln1 mean/rstd (N), qkv (N,3Cl), atty (N,Cl),
  // res2 (N,C), ln2 (N,C), ln2 mean/rstd (N), fch and fch_gelu (N,4Cl); att (B,NHl,T,T).
  const size_t layer = N * C + 2 * N + N * 3 * Cl + N * Cl + N * C + N * C + 2 * N + 2 * N * 4 * Cl;
  const size_t att = B * NHl * TT;
  size_t stored = 0, stored_att = 0, work_layer = 0, work_att = 0;
  for (size_t l = 0; l < Ls; ++l) {
    const int gl = shape_.layer_begin + static_cast<int>(l);
    const bool full = recompute_.full(gl), sel = recompute_.selective(gl);
    stored += full ? 0 : 1;
    stored_att += full || sel ? 0 : 1;
    work_layer |= full ? 1 : 0;
    work_att |= full || sel ? 1 : 0;
  }
  // Per slot: input (N,C); res3 (Ls,N,C); the stored layers' shares; last stage: lnf (N,C), lnf mean/rstd (N),
  // logits (N,Vl), losses (N); stage > 0: dinput (N,C). Once: the working set of a recomputed layer.
  const size_t per_slot = N * C + Ls * N * C + stored * layer + stored_att * att +
                          (last ? N * C + 2 * N + N * Vl + N : 0) + (first ? 0 : N * C);
  const size_t work = work_layer * layer + work_att * att;
  acts_ = AlignedBuffer<float>(per_slot * slots + work);
  tokens_ = AlignedBuffer<int32_t>(first ? N * slots : 0);
  float* p = acts_.data();
  auto take = [&p](size_t k) {
    float* r = p;
    p += k;
    return r;
  };
  auto take_layer = [&](LayerActs& la) {
    la.ln1 = take(N * C);
    la.ln1_mean = take(N);
    la.ln1_rstd = take(N);
    la.qkv = take(N * 3 * Cl);
    la.atty = take(N * Cl);
    la.res2 = take(N * C);
    la.ln2 = take(N * C);
    la.ln2_mean = take(N);
    la.ln2_rstd = take(N);
    la.fch = take(N * 4 * Cl);
    la.fch_gelu = take(N * 4 * Cl);
  };
  LayerActs w{};
  if (work_layer) take_layer(w);
  if (work_att) w.att = take(att);
  slot_.resize(slots);
  for (int s = 0; s < slots; ++s) {
    Slot& a = slot_[s];
    a = Slot{};
    a.input = take(N * C);
    a.res3 = take(Ls * N * C);
    a.layer.resize(Ls);
    for (size_t l = 0; l < Ls; ++l) {
      const int gl = shape_.layer_begin + static_cast<int>(l);
      if (recompute_.full(gl)) {
        a.layer[l] = w;
      } else {
        take_layer(a.layer[l]);
        a.layer[l].att = recompute_.selective(gl) ? w.att : take(att);
      }
    }
    if (last) {
      a.lnf = take(N * C);
      a.lnf_mean = take(N);
      a.lnf_rstd = take(N);
      a.logits = take(N * Vl);
      a.losses = take(N);
    }
    if (!first) a.dinput = take(N * C);
    a.tokens = first ? tokens_.data() + s * N : nullptr;
  }
  if (p != acts_.data() + acts_.size()) throw Error("GptStage: activation layout does not add up (a bug)");
  // dres, dc (N,C); d4c (N,4Cl); dqkv (N,3Cl); attention scratch (threads,T,T); proj (N,C); ce max (N), sums (2N)
  scratch_ = AlignedBuffer<float>(2 * N * C + N * 4 * Cl + N * 3 * Cl + pool.size() * TT + N * C + 3 * N);
  p = scratch_.data();
  dres_ = take(N * C);
  dc_ = take(N * C);
  d4c_ = take(N * 4 * Cl);
  dqkv_ = take(N * 3 * Cl);
  att_scratch_ = take(pool.size() * TT);
  proj_ = take(N * C);
  ce_max_ = take(N);
  ce_sums_ = take(2 * N);
}

void GptStage::zero_grad() {
  pool_.parallel_for(grads_.size(),
                     [&](size_t b, size_t e) { std::memset(grads_.data() + b, 0, (e - b) * sizeof(float)); });
}

void GptStage::scatter_from_full(const float* full) { copy_full_to_local(map_, shape_.config, full, params_.data()); }

void GptStage::gather_into_full(const float* local, float* full) const {
  copy_local_to_full(map_, shape_.config, local, full);
}

float* GptStage::input(int slot) { return slot_.at(slot).input; }

const float* GptStage::output(int slot) const {
  const size_t N = static_cast<size_t>(B_) * T_, C = shape_.config.channels;
  return slot_.at(slot).res3 + (shape_.layers() - 1) * N * C;
}

const float* GptStage::grad_input(int slot) const { return slot_.at(slot).dinput; }

double GptStage::take_tp_comm_seconds() {
  const double s = tp_seconds_;
  tp_seconds_ = 0;
  return s;
}

void GptStage::all_reduce(float* buf, size_t n, comm::ReduceOp op) {
  if (shape_.tp_size == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  tp_->all_reduce(buf, n, comm::DType::kFloat32, op);
  tp_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

void check_tokens(const int32_t* ids, size_t n, int V, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V) {
      throw Error(std::string("forward: ") + what + " token " + std::to_string(ids[i]) + " at position " +
                  std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) +
                  "): the data was tokenized for another vocabulary");
    }
  }
}

}  // namespace

void GptStage::layer_forward(size_t l, const float* residual, const LayerActs& a, float* res3) {
  using namespace cpu;
  using comm::ReduceOp;
  const int B = B_, Tn = T_, C = shape_.config.channels, Cl = shape_.local_channels(), NHl = shape_.local_heads();
  const size_t N = static_cast<size_t>(B) * Tn, lc = l * C;
  const bool lead = shape_.tp_rank == 0;  // adds the row-parallel biases, once
  std::array<float*, kNumParamTensors> w{};
  {
    float* q = params_.data();
    for (int i = 0; i < kNumParamTensors; ++i) {
      w[i] = q;
      q += sizes_[i];
    }
  }
  float *ln1w = w[2], *ln1b = w[3], *qkvw = w[4], *qkvb = w[5], *attprojw = w[6], *attprojb = w[7], *ln2w = w[8],
        *ln2b = w[9], *fcw = w[10], *fcb = w[11], *fcprojw = w[12], *fcprojb = w[13];
  // attention block; f (identity) before the column-parallel QKV, g (all-reduce) after the row-parallel out
  layernorm_forward(pool_, a.ln1, a.ln1_mean, a.ln1_rstd, residual, ln1w + lc, ln1b + lc, N, C);
  matmul_forward(pool_, a.qkv, a.ln1, qkvw + l * 3 * Cl * C, qkvb + l * 3 * Cl, N, C, 3 * Cl);  // (B,T,3Cl)
  attention_forward(pool_, a.atty, a.att, a.qkv, B, Tn, Cl, NHl);  // (B,T,Cl), (B,NHl,T,T): this rank's heads
  matmul_forward(pool_, proj_, a.atty, attprojw + l * C * Cl, lead ? attprojb + lc : nullptr, N, Cl,
                 C);                         // (B,T,C) partial sum over heads
  all_reduce(proj_, N * C, ReduceOp::kSum);  // g
  residual_forward(pool_, a.res2, residual, proj_, N * C);
  // MLP block; f before fc (column-parallel), g after fcproj (row-parallel)
  layernorm_forward(pool_, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, ln2w + lc, ln2b + lc, N, C);
  matmul_forward(pool_, a.fch, a.ln2, fcw + l * 4 * Cl * C, fcb + l * 4 * Cl, N, C, 4 * Cl);  // (B,T,4Cl)
  gelu_forward(pool_, a.fch_gelu, a.fch, N * 4 * Cl);
  matmul_forward(pool_, proj_, a.fch_gelu, fcprojw + l * C * 4 * Cl, lead ? fcprojb + lc : nullptr, N, 4 * Cl,
                 C);                         // (B,T,C) partial
  all_reduce(proj_, N * C, ReduceOp::kSum);  // g
  residual_forward(pool_, res3, a.res2, proj_, N * C);
}

double GptStage::forward(int slot, const int32_t* inputs, const int32_t* targets, float dloss) {
  using namespace cpu;
  using comm::ReduceOp;
  Slot& a = slot_.at(slot);
  const int B = B_, Tn = T_, C = shape_.config.channels;
  const int Vl = shape_.local_vocab(), Vr = shape_.valid_local_vocab(), v0 = shape_.vocab_begin();
  const size_t Ls = shape_.layers(), N = static_cast<size_t>(B) * Tn;
  auto w = std::array<float*, kNumParamTensors>{};
  {
    float* q = params_.data();
    for (int i = 0; i < kNumParamTensors; ++i) {
      w[i] = q;
      q += sizes_[i];
    }
  }
  float *wte = w[0], *wpe = w[1], *lnfw = w[14], *lnfb = w[15];

  if (shape_.first()) {
    check_tokens(inputs, N, shape_.config.vocab_size, "input");
    std::memcpy(a.tokens, inputs, N * sizeof(int32_t));
    // vocab-parallel embedding: each rank looks up the rows it holds, the all-reduce completes every row
    vocab_embedding_forward(pool_, a.input, inputs, wte, v0, Vl, N, C);  // (B,T,C) partial
    all_reduce(a.input, N * C, ReduceOp::kSum);
    add_positions(pool_, a.input, wpe, B, Tn, C);
  }
  for (size_t l = 0; l < Ls; ++l) {
    layer_forward(l, l == 0 ? a.input : a.res3 + (l - 1) * N * C, a.layer[l], a.res3 + l * N * C);
  }
  if (!shape_.last()) return 0;

  check_tokens(targets, N, shape_.config.vocab_size, "target");
  layernorm_forward(pool_, a.lnf, a.lnf_mean, a.lnf_rstd, a.res3 + (Ls - 1) * N * C, lnfw, lnfb, N, C);
  // tied LM head, column-parallel over the vocabulary: (B,T,Vl) logits of rows [v0, v0+Vl)
  matmul_forward(pool_, a.logits, a.lnf, wte, static_cast<const float*>(nullptr), N, C, Vl);
  // vocab-parallel cross entropy: global row max, then global sum of exp and the target's logit
  vocab_ce_local_max(pool_, ce_max_, a.logits, N, Vl, Vr);
  all_reduce(ce_max_, N, ReduceOp::kMax);
  vocab_ce_local_sums(pool_, ce_sums_, a.logits, ce_max_, targets, v0, N, Vl, Vr);
  all_reduce(ce_sums_, 2 * N, ReduceOp::kSum);
  vocab_ce_finish(pool_, a.losses, a.logits, ce_sums_, ce_max_, targets, v0, N, Vl, Vr,
                  dloss / static_cast<float>(N));  // logits now hold dlogits
  double sum = 0;
  for (size_t i = 0; i < N; ++i) sum += a.losses[i];
  return sum / static_cast<double>(N);
}

void GptStage::backward(int slot, const GradReadyHook* ready) {
  using namespace cpu;
  using comm::ReduceOp;
  Slot& a = slot_.at(slot);
  const int B = B_, Tn = T_, C = shape_.config.channels, Cl = shape_.local_channels(), NHl = shape_.local_heads();
  const int Vl = shape_.local_vocab(), v0 = shape_.vocab_begin();
  const size_t Ls = shape_.layers(), N = static_cast<size_t>(B) * Tn;
  std::array<float*, kNumParamTensors> w{}, g{};
  {
    float *q = params_.data(), *d = grads_.data();
    for (int i = 0; i < kNumParamTensors; ++i) {
      w[i] = q;
      g[i] = d;
      q += sizes_[i];
      d += sizes_[i];
    }
  }
  auto report = [&](int i, size_t begin, size_t count) {
    if (ready != nullptr && count > 0) (*ready)(static_cast<size_t>(g[i] - grads_.data()) + begin, count);
  };
  if (shape_.last()) {
    // LM head: dlnf (B,T,C) = dlogits (B,T,Vl) @ wte_local (Vl,C), summed over tp (f backward); dwte_local +=
    // dlogits^T @ lnf
    matmul_backward(pool_, dc_, false, g[0], static_cast<float*>(nullptr), a.logits, a.lnf, w[0], N, C, Vl);
    all_reduce(dc_, N * C, ReduceOp::kSum);
    std::memset(dres_, 0, N * C * sizeof(float));
    layernorm_backward(pool_, dres_, g[14], g[15], dc_, a.res3 + (Ls - 1) * N * C, w[14], a.lnf_mean, a.lnf_rstd, N, C);
    report(14, 0, C);
    report(15, 0, C);
  }
  // dres_ holds d(loss)/d(residual stream), identical on every tp rank, and flows down through the layers.
  for (size_t l = Ls; l-- > 0;) {
    const float* residual = l == 0 ? a.input : a.res3 + (l - 1) * N * C;
    const LayerActs& la = a.layer[l];
    const size_t lc = l * C;
    const int gl = shape_.layer_begin + static_cast<int>(l);
    if (recompute_.full(gl)) {
      // Same kernels, inputs, weights and (deterministic) all-reduces as the forward: the working set gets its bits.
      layer_forward(l, residual, la, proj_);  // res3 is kept; proj_ takes the throwaway copy
    } else if (recompute_.selective(gl)) {
      attention_forward(pool_, la.atty, la.att, la.qkv, B, Tn, Cl, NHl);  // atty rewritten with identical values
    }
    // MLP block: g's backward is the identity, so fcproj sees dres_ directly
    matmul_backward(pool_, d4c_, false, g[12] + l * C * 4 * Cl, g[13] + lc, dres_, la.fch_gelu, w[12] + l * C * 4 * Cl,
                    N, 4 * Cl, C);                         // d fch_gelu (B,T,4Cl)
    gelu_backward(pool_, d4c_, la.fch, d4c_, N * 4 * Cl);  // d fch (B,T,4Cl)
    matmul_backward(pool_, dc_, false, g[10] + l * 4 * Cl * C, g[11] + l * 4 * Cl, d4c_, la.ln2, w[10] + l * 4 * Cl * C,
                    N, C, 4 * Cl);           // d ln2 (B,T,C) partial
    all_reduce(dc_, N * C, ReduceOp::kSum);  // f backward
    layernorm_backward(pool_, dres_, g[8] + lc, g[9] + lc, dc_, la.res2, w[8] + lc, la.ln2_mean, la.ln2_rstd, N,
                       C);  // += d res2
    // attention block
    matmul_backward(pool_, dc_, false, g[6] + l * C * Cl, g[7] + lc, dres_, la.atty, w[6] + l * C * Cl, N, Cl,
                    C);                                                                   // d atty (B,T,Cl)
    attention_backward(pool_, dqkv_, att_scratch_, dc_, la.qkv, la.att, B, Tn, Cl, NHl);  // d qkv (B,T,3Cl)
    matmul_backward(pool_, dc_, false, g[4] + l * 3 * Cl * C, g[5] + l * 3 * Cl, dqkv_, la.ln1, w[4] + l * 3 * Cl * C,
                    N, C, 3 * Cl);           // d ln1 (B,T,C) partial
    all_reduce(dc_, N * C, ReduceOp::kSum);  // f backward
    layernorm_backward(pool_, dres_, g[2] + lc, g[3] + lc, dc_, residual, w[2] + lc, la.ln1_mean, la.ln1_rstd, N,
                       C);                                                         // += d residual
    for (int i = 2; i < 14; ++i) report(i, l * (sizes_[i] / Ls), sizes_[i] / Ls);  // layer l's slices are final
  }
  if (shape_.first()) {
    // the embedding's all-reduce is g-like: its backward is the identity, each rank scatters into its own rows
    vocab_embedding_backward(pool_, g[0], g[1], dres_, a.tokens, v0, Vl, B, Tn, C);
    report(1, 0, sizes_[1]);
    if (shape_.last()) report(0, 0, sizes_[0]);  // pp == 1: both uses of wte are done
  } else {
    std::memcpy(a.dinput, dres_, N * C * sizeof(float));
  }
}

}  // namespace railyard::worker::parallel
