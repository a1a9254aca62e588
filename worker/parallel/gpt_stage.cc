#include "worker/parallel/gpt_stage.h"

#include <chrono>
#include <cstring>
#include <string>

#include "common/error.h"
#include "worker/kernels/cpu/kernels.h"

namespace railyard::worker::parallel {

namespace {

// What GptStage allocates, in floats; the constructor carves its buffers out of exactly these sizes.
struct StageSizes {
  size_t layer = 0, att = 0, per_slot = 0, work = 0, work_layer = 0, work_att = 0, scratch = 0, tokens = 0, ring = 0;
};

// What differs by device (kernels.h sizes it): attention's saved state and scratch, layernorm_backward's scratch.
// Null: the CPU kernels' with `threads` threads.
struct DeviceSizes {
  size_t att_saved = 0, att_scratch = 0, ln_scratch = 0;
};

// A stage's layer: layernorm rows NL (N/tp with sequence parallelism), tensor-parallel widths Cl; with experts the
// MLP's rows live in the MoE part (stage_moe_activation_bytes), not here.
LayerActShape stage_layer_shape(const StageShape& sh, size_t N, size_t NL) {
  const size_t C = sh.config.channels, Cl = sh.local_channels();
  return {NL, N, C, Cl, sh.config.moe.experts > 0 ? 0 : N, 0};
}

// seq_len: the local sequence length (T / cp).

StageSizes stage_sizes(const StageShape& sh, int B, int seq_len, size_t threads, const RecomputeSpec& recompute,
                       bool sp, int cp, const DeviceSizes* dev = nullptr) {
  const size_t C = sh.config.channels, Cl = sh.local_channels(), NHl = sh.local_heads();
  const size_t Ls = sh.layers(), Vl = sh.local_vocab(), N = static_cast<size_t>(B) * seq_len;
  const size_t TT = static_cast<size_t>(seq_len) * seq_len;
  const bool first = sh.first(), last = sh.last();
  // NL: rows of the layernorm/residual regions (N, or N/tp with sequence parallelism).
  if (sp && (sh.tp_size < 2 || N % sh.tp_size != 0)) {
    throw ConfigError("sequence parallelism needs tp > 1 dividing B*T = " + std::to_string(N));
  }
  const size_t NL = sp ? N / sh.tp_size : N;
  StageSizes z;
  // One layer without its output res3 and without att (layer_acts.h's table); att (B,NHl,T,T).
  z.layer = stage_layer_shape(sh, N, NL).elements();
  z.att = cp > 1 ? B * NHl * static_cast<size_t>(seq_len) : B * NHl * TT;  // probabilities, or the ring's lse
  if (dev != nullptr && cp == 1) z.att = dev->att_saved;
  size_t stored = 0, stored_att = 0;
  for (size_t l = 0; l < Ls; ++l) {
    const int gl = sh.layer_begin + static_cast<int>(l);
    const bool full = recompute.full(gl), sel = recompute.selective(gl);
    stored += full ? 0 : 1;
    stored_att += full || sel ? 0 : 1;
    z.work_layer |= full ? 1 : 0;
    z.work_att |= full || sel ? 1 : 0;
  }
  // Per slot: input (NL,C); res3 (Ls,NL,C); the stored layers' shares; last stage: lnf (NL,C), lnf mean/rstd (NL),
  // logits (N,Vl), losses (N); stage > 0: dinput (NL,C). Once: the working set of a recomputed layer.
  z.per_slot = NL * C + Ls * NL * C + stored * z.layer + stored_att * z.att +
               (last ? NL * C + 2 * NL + N * Vl + N : 0) + (first ? 0 : NL * C);
  z.work = z.work_layer * z.layer + z.work_att * z.att;
  // dres (NL,C), dc (N,C); d4c (N,4Cl); dqkv (N,3Cl); attention scratch (threads,T,T); proj (N,C); ce max (N),
  // sums (2N); sequence parallelism: gath (N,C), rs (NL,C), the layernorm gradients (4 Ls + 2) C
  const size_t sp_scratch = sp ? N * C + NL * C + (4 * Ls + 2) * C : 0;
  // context parallel: the ring's key/value blocks and their gradients (4 B Tc 2 Cl), its (max, sum, D) rows
  z.ring = cp > 1 ? 4 * N * 2 * Cl + 3 * static_cast<size_t>(B) * NHl * seq_len : 0;
  z.scratch = NL * C + N * C + N * 4 * Cl + N * 3 * Cl + (dev != nullptr ? dev->att_scratch : threads * TT) + N * C +
              3 * N + sp_scratch + (dev != nullptr ? dev->ln_scratch : 0);
  z.tokens = first ? N : 0;
  return z;
}

}  // namespace

size_t stage_activation_bytes(const StageShape& shape, int B, int seq_len, int slots, size_t threads,
                              const RecomputeSpec& recompute, bool sequence_parallel, int cp) {
  if (cp < 1 || seq_len % cp != 0) throw ConfigError("context parallelism: cp must divide T");
  const StageSizes z = stage_sizes(shape, B, seq_len / cp, threads, recompute, sequence_parallel, cp);
  return (z.per_slot * slots + z.work + z.scratch + z.ring) * sizeof(float) +
         (z.tokens * slots + (cp > 1 ? 2 * z.tokens : 0)) * sizeof(int32_t) +
         stage_moe_activation_bytes(shape, B, seq_len / cp, slots, sequence_parallel);
}

GptStage::GptStage(const StageShape& shape, int B, int seq_len, int slots, ThreadPool& pool, comm::Communicator* tp,
                   const RecomputeSpec& recompute, bool sequence_parallel, comm::Communicator* cp,
                   Kernels<float>* device)
    : shape_(shape),
      recompute_(recompute),
      B_(B),
      T_(seq_len),
      slots_(slots),
      sp_(sequence_parallel),
      rows_(static_cast<size_t>(B) * seq_len),
      T_full_(seq_len),
      pool_(pool),
      own_dev_(device == nullptr ? std::make_unique<CpuKernels<float>>(pool) : nullptr),
      dev_(device != nullptr ? device : own_dev_.get()),
      tp_(tp) {
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
  if (cp != nullptr && cp->size() > 1) {
    cp_size_ = cp->size();
    cp_rank_ = cp->rank();
    if (seq_len % cp_size_ != 0) {
      throw ConfigError("--cp " + std::to_string(cp_size_) + " must divide the sequence length --seq " +
                        std::to_string(seq_len) + " (each rank holds seq/cp positions)");
    }
    if (sp_) {
      throw ConfigError(
          "--cp with --sequence-parallel is not implemented (each works alone, with tp): drop one of them");
    }
    T_ = seq_len / cp_size_;
    rows_ = static_cast<size_t>(B) * T_;
  }
  if (sp_) {
    if (shape_.tp_size < 2) {
      throw ConfigError(
          "--sequence-parallel needs tensor parallelism (--tp > 1): it splits the tp group's "
          "replicated layernorm regions; drop it or raise --tp");
    }
    if (rows_ % shape_.tp_size != 0) {
      throw ConfigError("--sequence-parallel: the micro-batch's B*T = " + std::to_string(rows_) +
                        " tokens must be divisible by tp " + std::to_string(shape_.tp_size) +
                        " (pick --seq or --batch accordingly)");
    }
    rows_ /= shape_.tp_size;
  }
  cpu::init_blas_single_threaded();
  map_ = make_shard_map(shape_);
  sizes_ = local_param_sizes(shape_);
  const size_t n = local_num_params(shape_);  // the 16 tensors, then the MoE router
  params_ = DeviceBuffer<float>(*dev_, n);
  // The device may keep a low-precision copy of the weights for its GEMMs (CUDA: bf16, instead of converting each
  // weight before every GEMM); AdamW and to_device keep it current, other writers call weights_changed().
  dev_->set_weights(params_.data(), n);
  grads_ = DeviceBuffer<float>(*dev_, n);

  const size_t C = shape_.config.channels, Cl = shape_.local_channels();
  const size_t Ls = shape_.layers(), Vl = shape_.local_vocab(), N = static_cast<size_t>(B) * T_;
  const bool first = shape_.first(), last = shape_.last();
  const size_t NL = rows_;
  const DeviceSizes ds{dev_->attention_saved_elems(B, T_, static_cast<int>(Cl), shape_.local_heads()),
                       dev_->attention_scratch_elems(B, T_, static_cast<int>(Cl), shape_.local_heads()),
                       dev_->layernorm_scratch_elems(rows_, static_cast<int>(C))};
  const StageSizes z = stage_sizes(shape_, B, T_, pool.size(), recompute_, sp_, cp_size_, &ds);
  const size_t per_slot = z.per_slot, work = z.work, att = z.att;
  const size_t work_layer = z.work_layer, work_att = z.work_att;
  acts_ = DeviceBuffer<float>(*dev_, per_slot * slots + work);
  tokens_ = DeviceBuffer<int32_t>(*dev_, first ? N * slots : 0);
  if (last && !dev_->host_accessible()) {
    targets_ = DeviceBuffer<int32_t>(*dev_, N);
    losses_.resize(N);
  }
  float* p = acts_.data();
  auto take = [&p](size_t k) {
    float* r = p;
    p += k;
    return r;
  };
  const LayerActShape layer_shape = stage_layer_shape(shape_, N, NL);
  auto take_layer = [&](LayerActs& la) { take_layer_acts(la, layer_shape, take); };
  LayerActs w{};
  if (work_layer) take_layer(w);
  if (work_att) w.att = take(att);
  slot_.resize(slots);
  for (int s = 0; s < slots; ++s) {
    Slot& a = slot_[s];
    a = Slot{};
    a.input = take(NL * C);
    a.res3 = take(Ls * NL * C);
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
      a.lnf = take(NL * C);
      a.lnf_mean = take(NL);
      a.lnf_rstd = take(NL);
      a.logits = take(N * Vl);
      a.losses = take(N);
    }
    if (!first) a.dinput = take(NL * C);
    a.tokens = first ? tokens_.data() + s * N : nullptr;
  }
  if (p != acts_.data() + acts_.size()) throw Error("GptStage: activation layout does not add up (a bug)");
  scratch_ = DeviceBuffer<float>(*dev_, z.scratch);
  p = scratch_.data();
  dres_ = take(NL * C);
  dc_ = take(N * C);
  d4c_ = take(N * 4 * Cl);
  dqkv_ = take(N * 3 * Cl);
  att_scratch_ = take(ds.att_scratch);
  proj_ = take(N * C);
  ce_max_ = take(N);
  ce_sums_ = take(2 * N);
  if (sp_) {
    gath_ = take(N * C);
    rs_ = take(NL * C);
    sp_ln_ = take((4 * Ls + 2) * C);
  }
  if (ds.ln_scratch > 0) ln_scratch_ = take(ds.ln_scratch);
  if (p != scratch_.data() + scratch_.size()) throw Error("GptStage: scratch layout does not add up (a bug)");
  if (cp_size_ > 1) {
    ring_ = std::make_unique<RingAttention>(cp, B, T_, static_cast<int>(Cl), shape_.local_heads(), *dev_);
    if (ring_->workspace_bytes() != z.ring * sizeof(float)) throw Error("GptStage: ring workspace mismatch (a bug)");
    cp_tokens_ = AlignedBuffer<int32_t>(2 * N);
  }
  if (shape_.config.moe.experts > 0) moe_init();
}

void GptStage::zero_grad() {
  if (!dev_->host_accessible()) {
    dev_->zero(grads_.data(), grads_.size() * sizeof(float));
    return;
  }
  pool_.parallel_for(grads_.size(),
                     [&](size_t b, size_t e) { std::memset(grads_.data() + b, 0, (e - b) * sizeof(float)); });
}

void GptStage::scatter_from_full(const float* full) {
  if (dev_->host_accessible()) {
    copy_full_to_local(map_, shape_.config, full, params_.data());
    return;
  }
  std::vector<float> host(params_.size());
  copy_full_to_local(map_, shape_.config, full, host.data());
  dev_->to_device(params_.data(), host.data(), host.size() * sizeof(float));
}

void GptStage::gather_into_full(const float* local, float* full) const {
  if (!dev_->host_accessible() && (local == params_.data() || local == grads_.data())) {
    std::vector<float> host(params_.size());
    dev_->to_host(host.data(), local, host.size() * sizeof(float));
    copy_local_to_full(map_, shape_.config, host.data(), full);
    return;
  }
  copy_local_to_full(map_, shape_.config, local, full);
}

float* GptStage::input(int slot) { return slot_.at(slot).input; }

const float* GptStage::output(int slot) const {
  const size_t C = shape_.config.channels;
  return slot_.at(slot).res3 + (shape_.layers() - 1) * rows_ * C;
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
  dev_->synchronize();  // the communicator's stream is not the kernels' (a no-op on the CPU)
  tp_->all_reduce(buf, n, comm::DType::kFloat32, op);
  tp_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GptStage::all_gather_rows(const float* local, float* full) {
  const auto t0 = std::chrono::steady_clock::now();
  dev_->synchronize();
  tp_->all_gather(local, full, rows_ * shape_.config.channels, comm::DType::kFloat32);
  tp_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GptStage::reduce_scatter_rows(const float* full, float* local) {
  const auto t0 = std::chrono::steady_clock::now();
  dev_->synchronize();
  tp_->reduce_scatter(full, local, rows_ * shape_.config.channels, comm::DType::kFloat32, comm::ReduceOp::kSum);
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

void GptStage::attention_fwd(const LayerActs& a) {
  if (ring_) {
    ring_->forward(a.qkv, a.atty, a.att);
  } else {
    dev_->attention_forward(a.atty, a.att, a.qkv, B_, T_, shape_.local_channels(), shape_.local_heads());
  }
}

void GptStage::attention_bwd(const LayerActs& a) {
  // d atty is in dc_; d qkv goes to dqkv_
  if (ring_) {
    ring_->backward(dc_, a.qkv, a.atty, a.att, dqkv_);
  } else {
    dev_->attention_backward(dqkv_, att_scratch_, dc_, a.qkv, a.atty, a.att, B_, T_, shape_.local_channels(),
                             shape_.local_heads());
  }
}

void GptStage::layer_forward(size_t l, const float* residual, const LayerActs& a, float* res3) {
  using comm::ReduceOp;
  Kernels<float>& k = *dev_;
  const int B = B_, Tn = T_, C = shape_.config.channels, Cl = shape_.local_channels();
  const size_t N = static_cast<size_t>(B) * Tn, NL = rows_, lc = l * C;
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
  // f before a column-parallel layer: the identity, or (sequence parallel) the all-gather of the local rows
  auto f = [&](const float* local) -> const float* {
    if (!sp_) return local;
    all_gather_rows(local, gath_);
    return gath_;
  };
  // g after a row-parallel layer: the all-reduce of the (N,C) partial sums, or (sequence parallel) their
  // reduce-scatter to this rank's rows
  auto g = [&]() -> const float* {
    if (!sp_) {
      all_reduce(proj_, N * C, ReduceOp::kSum);
      return proj_;
    }
    reduce_scatter_rows(proj_, rs_);
    return rs_;
  };
  // attention block
  k.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, ln1w + lc, ln1b + lc, NL, C);
  k.matmul_forward(a.qkv, f(a.ln1), qkvw + l * 3 * Cl * C, qkvb + l * 3 * Cl, N, C, 3 * Cl);  // (B,T,3Cl)
  attention_fwd(a);  // (B,T,Cl), (B,NHl,T,T): this rank's heads
  k.matmul_forward(proj_, a.atty, attprojw + l * C * Cl, lead ? attprojb + lc : nullptr, N, Cl,
                   C);  // (B,T,C) partial sum over heads
  k.residual_forward(a.res2, residual, g(), NL * C);
  // MLP block
  k.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, ln2w + lc, ln2b + lc, NL, C);
  if (moe_) {
    moe_forward(l, a, proj_);  // (rows_,C) whole: the experts are not tensor-sharded, no g
    k.residual_forward(res3, a.res2, proj_, NL * C);
    return;
  }
  k.matmul_forward(a.fch, f(a.ln2), fcw + l * 4 * Cl * C, fcb + l * 4 * Cl, N, C, 4 * Cl);  // (B,T,4Cl)
  k.gelu_forward(a.fch_gelu, a.fch, N * 4 * Cl);
  k.matmul_forward(proj_, a.fch_gelu, fcprojw + l * C * 4 * Cl, lead ? fcprojb + lc : nullptr, N, 4 * Cl,
                   C);  // (B,T,C) partial
  k.residual_forward(res3, a.res2, g(), NL * C);
}

double GptStage::forward(int slot, const int32_t* inputs, const int32_t* targets, float dloss) {
  using comm::ReduceOp;
  Kernels<float>& k = *dev_;
  Slot& a = slot_.at(slot);
  cur_slot_ = slot;
  moe_aux_ = 0;
  dloss_ = dloss;
  const int B = B_, Tn = T_, C = shape_.config.channels;
  const int Vl = shape_.local_vocab(), Vr = shape_.valid_local_vocab(), v0 = shape_.vocab_begin();
  const size_t Ls = shape_.layers(), N = static_cast<size_t>(B) * Tn, NL = rows_;
  auto w = std::array<float*, kNumParamTensors>{};
  {
    float* q = params_.data();
    for (int i = 0; i < kNumParamTensors; ++i) {
      w[i] = q;
      q += sizes_[i];
    }
  }
  float *wte = w[0], *wpe = w[1], *lnfw = w[14], *lnfb = w[15];
  if (cp_size_ > 1) {
    // context parallel: keep positions [r T_, (r+1) T_) of each sequence; wpe is indexed from r T_ on
    const size_t t0 = static_cast<size_t>(cp_rank_) * Tn;
    for (int b = 0; b < B; ++b) {
      const size_t from = static_cast<size_t>(b) * T_full_ + t0, to = static_cast<size_t>(b) * Tn;
      if (inputs != nullptr) std::memcpy(cp_tokens_.data() + to, inputs + from, Tn * sizeof(int32_t));
      if (targets != nullptr) std::memcpy(cp_tokens_.data() + N + to, targets + from, Tn * sizeof(int32_t));
    }
    inputs = inputs != nullptr ? cp_tokens_.data() : nullptr;
    targets = targets != nullptr ? cp_tokens_.data() + N : nullptr;
    wpe += t0 * C;
  }

  if (shape_.first()) {
    check_tokens(inputs, N, shape_.config.vocab_size, "input");
    k.to_device(a.tokens, inputs, N * sizeof(int32_t));  // the host's ids, kept for backward
    // vocab-parallel embedding: each rank looks up the rows it holds, the all-reduce (sequence parallel: the
    // reduce-scatter) completes every row
    if (sp_) {
      k.vocab_embedding_forward(proj_, a.tokens, wte, v0, Vl, N, C);  // (B,T,C) partial
      reduce_scatter_rows(proj_, a.input);
      k.add_positions_rows(a.input, wpe, shape_.tp_rank * NL, NL, Tn, C);
    } else {
      k.vocab_embedding_forward(a.input, a.tokens, wte, v0, Vl, N, C);  // (B,T,C) partial
      all_reduce(a.input, N * C, ReduceOp::kSum);
      k.add_positions_rows(a.input, wpe, 0, N, Tn, C);
    }
  }
  for (size_t l = 0; l < Ls; ++l) {
    layer_forward(l, l == 0 ? a.input : a.res3 + (l - 1) * NL * C, a.layer[l], a.res3 + l * NL * C);
  }
  // With experts every stage returns its layers' load-balancing loss (ParallelModel sums the stages).
  if (!shape_.last()) return moe_aux_;

  check_tokens(targets, N, shape_.config.vocab_size, "target");
  if (targets_.size() > 0) {
    k.to_device(targets_.data(), targets, N * sizeof(int32_t));
    targets = targets_.data();
  }
  k.layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, a.res3 + (Ls - 1) * NL * C, lnfw, lnfb, NL, C);
  const float* lnf = a.lnf;
  if (sp_) {
    all_gather_rows(a.lnf, gath_);
    lnf = gath_;
  }
  // tied LM head, column-parallel over the vocabulary: (B,T,Vl) logits of rows [v0, v0+Vl)
  k.matmul_forward(a.logits, lnf, wte, static_cast<const float*>(nullptr), N, C, Vl);
  // vocab-parallel cross entropy: global row max, then global sum of exp and the target's logit
  k.vocab_ce_local_max(ce_max_, a.logits, N, Vl, Vr);
  all_reduce(ce_max_, N, ReduceOp::kMax);
  k.vocab_ce_local_sums(ce_sums_, a.logits, ce_max_, targets, v0, N, Vl, Vr);
  all_reduce(ce_sums_, 2 * N, ReduceOp::kSum);
  k.vocab_ce_finish(a.losses, a.logits, ce_sums_, ce_max_, targets, v0, N, Vl, Vr,
                    dloss / static_cast<float>(N));  // logits now hold dlogits
  const float* losses = a.losses;
  if (!losses_.empty()) {
    k.to_host(losses_.data(), a.losses, N * sizeof(float));
    losses = losses_.data();
  }
  double sum = 0;
  for (size_t i = 0; i < N; ++i) sum += losses[i];
  return sum / static_cast<double>(N) + moe_aux_;
}

void GptStage::backward(int slot, const GradReadyHook* ready) {
  using comm::ReduceOp;
  Kernels<float>& k = *dev_;
  Slot& a = slot_.at(slot);
  cur_slot_ = slot;
  const int B = B_, Tn = T_, C = shape_.config.channels, Cl = shape_.local_channels();
  const int Vl = shape_.local_vocab(), v0 = shape_.vocab_begin();
  const size_t Ls = shape_.layers(), N = static_cast<size_t>(B) * Tn, NL = rows_;
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
  // Sequence parallelism: what f's forward gathered (a layernorm output, for a weight gradient) is gathered again
  // rather than stored, and d(residual) is gathered for the row-parallel layers (g's backward); the partial
  // d(layernorm output) of a column-parallel layer is reduce-scattered (f's backward). Without it: the identity and
  // the all-reduce.
  auto gather = [&](const float* local) -> const float* {
    if (!sp_) return local;
    all_gather_rows(local, gath_);
    return gath_;
  };
  auto f_backward = [&]() -> const float* {
    if (!sp_) {
      all_reduce(dc_, N * C, ReduceOp::kSum);
      return dc_;
    }
    reduce_scatter_rows(dc_, rs_);
    return rs_;
  };
  // Layernorm weight gradients of local rows go to sp_ln_ first (summed over tp below), else straight to grads().
  if (sp_) k.zero(sp_ln_, (4 * Ls + 2) * C * sizeof(float));
  auto ln_grad = [&](int i, size_t l) -> float* {
    if (!sp_) return g[i] + (i >= 14 ? 0 : l * C);
    if (i >= 14) return sp_ln_ + 4 * Ls * C + (i - 14) * C;
    return sp_ln_ + l * 4 * C + (i == 2 ? 0 : i == 3 ? 1 : i == 8 ? 2 : 3) * C;
  };
  if (shape_.last()) {
    // LM head: dlnf (B,T,C) = dlogits (B,T,Vl) @ wte_local (Vl,C), summed over tp (f backward); dwte_local +=
    // dlogits^T @ lnf
    k.matmul_backward(dc_, false, g[0], static_cast<float*>(nullptr), a.logits, gather(a.lnf), w[0], N, C, Vl, true);
    const float* dlnf = f_backward();
    k.zero(dres_, NL * C * sizeof(float));
    k.layernorm_backward(dres_, ln_grad(14, 0), ln_grad(15, 0), ln_scratch_, dlnf, a.res3 + (Ls - 1) * NL * C, w[14],
                         a.lnf_mean, a.lnf_rstd, NL, C);
    if (!sp_) {
      report(14, 0, C);
      report(15, 0, C);
    }
  }
  // dres_ holds d(loss)/d(residual stream) (this rank's rows with sequence parallelism; identical on every tp rank
  // without) and flows down through the layers.
  for (size_t l = Ls; l-- > 0;) {
    const float* residual = l == 0 ? a.input : a.res3 + (l - 1) * NL * C;
    const LayerActs& la = a.layer[l];
    const size_t lc = l * C;
    const int gl = shape_.layer_begin + static_cast<int>(l);
    if (recompute_.full(gl)) {
      // Same kernels, inputs, weights and (deterministic) collectives as the forward: the working set gets its bits.
      recomputing_ = true;
      layer_forward(l, residual, la, proj_);  // res3 is kept; proj_ takes the throwaway copy
      recomputing_ = false;
    } else if (recompute_.selective(gl)) {
      attention_fwd(la);  // atty rewritten with identical values
    }
    const float* dln2 = dc_;
    if (moe_) {
      moe_backward(l, la, dres_, dc_, ready);  // d ln2 (rows_,C), whole: the experts are not tensor-sharded
    } else {
      // MLP block: g's backward is the identity (sequence parallel: the all-gather), fcproj sees d(res3)
      k.matmul_backward(d4c_, false, g[12] + l * C * 4 * Cl, g[13] + lc, gather(dres_), la.fch_gelu,
                        w[12] + l * C * 4 * Cl, N, 4 * Cl, C, true);  // d fch_gelu (B,T,4Cl)
      k.gelu_backward(d4c_, la.fch, d4c_, N * 4 * Cl);                // d fch (B,T,4Cl)
      k.matmul_backward(dc_, false, g[10] + l * 4 * Cl * C, g[11] + l * 4 * Cl, d4c_, gather(la.ln2),
                        w[10] + l * 4 * Cl * C, N, C, 4 * Cl, true);  // d ln2 (B,T,C) partial
      dln2 = f_backward();
    }
    k.layernorm_backward(dres_, ln_grad(8, l), ln_grad(9, l), ln_scratch_, dln2, la.res2, w[8] + lc, la.ln2_mean,
                         la.ln2_rstd, NL, C);  // += d res2
    // attention block
    k.matmul_backward(dc_, false, g[6] + l * C * Cl, g[7] + lc, gather(dres_), la.atty, w[6] + l * C * Cl, N, Cl, C,
                      true);  // d atty (B,T,Cl)
    attention_bwd(la);        // d qkv (B,T,3Cl)
    k.matmul_backward(dc_, false, g[4] + l * 3 * Cl * C, g[5] + l * 3 * Cl, dqkv_, gather(la.ln1),
                      w[4] + l * 3 * Cl * C, N, C, 3 * Cl, true);  // d ln1 (B,T,C) partial
    const float* dln1 = f_backward();
    k.layernorm_backward(dres_, ln_grad(2, l), ln_grad(3, l), ln_scratch_, dln1, residual, w[2] + lc, la.ln1_mean,
                         la.ln1_rstd, NL, C);  // += d residual
    for (int i = 2; i < 14; ++i) {
      const bool layernorm = i == 2 || i == 3 || i == 8 || i == 9;
      const bool expert = moe_ && i >= 10;  // sequence parallel: partial until finish_moe_grads
      if (!(sp_ && (layernorm || expert))) report(i, l * (sizes_[i] / Ls), sizes_[i] / Ls);  // layer l's slices
    }
  }
  if (sp_) {
    // The layernorm weights are replicated over tp but each rank saw only its rows: sum the partial gradients (one
    // all-reduce for the stage), then they are final.
    all_reduce(sp_ln_, (4 * Ls + 2) * C, ReduceOp::kSum);
    for (size_t l = 0; l < Ls; ++l) {
      for (int i : {2, 3, 8, 9}) {
        k.accumulate(g[i] + l * C, ln_grad(i, l), C);
        report(i, l * C, C);
      }
    }
    if (shape_.last()) {
      for (int i : {14, 15}) {
        k.accumulate(g[i], ln_grad(i, 0), C);
        report(i, 0, C);
      }
    }
  }
  if (shape_.first()) {
    // the embedding's all-reduce is g-like: its backward is the identity (sequence parallel: the all-gather), each
    // rank scatters into its own rows
    // context parallel: this rank's positions start at r T_ in wpe
    k.vocab_embedding_backward(g[0], g[1] + static_cast<size_t>(cp_rank_) * Tn * C, gather(dres_), a.tokens, v0, Vl, B,
                               Tn, C);
    report(1, 0, sizes_[1]);
    if (shape_.last()) report(0, 0, sizes_[0]);  // pp == 1: both uses of wte are done
  } else {
    k.copy(a.dinput, dres_, NL * C);
  }
}

}  // namespace railyard::worker::parallel
