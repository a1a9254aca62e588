// Expert parallelism inside Gpt<T> (docs/parallel.md "Expert parallelism"): the experts' part of moe_forward and
// moe_backward when the E experts of every MoE layer are split over an expert-parallel group of P ranks.
//
// Buffers (all E * cap rows of C, the same sizes as without expert parallelism):
// - routing order: row e * cap + i = the i-th token this rank sends to expert e (moe_x_ after the gather). Chunk s
//   of it (experts [s E/P, (s+1) E/P)) is what rank s receives, so one all_to_all of E/P * cap rows per rank
//   dispatches, and the reverse one brings the outputs back into routing order (a.moe_y, moe_dx_), which the
//   unchanged combine code reads.
// - received order: row (s * E/P + j) * cap + i = the i-th row source rank s sent to local expert j; a.fch and
//   a.fch_gelu keep the hidden rows of this rank's experts in that order.
// Rows past a count are never read: the capacity padding only makes the buffers fixed-size.
// Parameters: with expert-parallel storage (GptConfig::moe.expert_shards = P) the buffers hold only this rank's E/P
// experts per layer, local expert j of layer l at l * E/P + j; otherwise all E, at l * E + rank * E/P + j.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/model/gpt.h"

namespace railyard::worker {

template <typename T>
void Gpt<T>::set_expert_exchange(ExpertExchange x) {
  const int E = config_.moe.experts;
  if (x.size < 1 || x.rank < 0 || x.rank >= x.size) {
    throw ConfigError("expert parallelism: rank " + std::to_string(x.rank) + " of " + std::to_string(x.size) +
                      " is not a valid group position");
  }
  if (x.size > 1 && (E <= 0 || E % x.size != 0)) {
    throw ConfigError("--ep " + std::to_string(x.size) + " needs --moe-experts divisible by it (the model has " +
                      std::to_string(E) + " experts per layer)");
  }
  if (x.size > 1 && !x.all_to_all) throw ConfigError("expert parallelism: no all_to_all given");
  if (x.size > 1 && !dev_->host_accessible()) {
    // The exchange and the experts' loops below read the dispatched rows on the host.
    throw ConfigError(
        std::string("--ep ") + std::to_string(x.size) + " with spec.device / --device " + device_name(dev_->kind()) +
        ": expert parallelism runs on the CPU only so far: use --device cpu, or --ep 1 (mixture-of-experts "
        "layers themselves run on the device)");
  }
  const int shards = config_.moe.expert_shards;
  if (shards > 1 && (x.size != shards || x.rank != config_.moe.expert_shard)) {
    throw ConfigError("expert parallelism: the model holds experts of shard " +
                      std::to_string(config_.moe.expert_shard) + " of " + std::to_string(shards) +
                      " but the group position is " + std::to_string(x.rank) + " of " + std::to_string(x.size));
  }
  if (shards > 1 && x.return_expert_grads) {
    throw ConfigError(
        "--deterministic with expert-parallel storage: the gradient return needs every expert's "
        "gradient buffer on every rank (build the model with the global layout)");
  }
  ep_ = std::move(x);
  ep_count_.assign(ep_.size > 1 ? static_cast<size_t>(config_.num_layers) * E : 0, 0);
  const size_t C = config_.channels, per_expert = 8 * C * C + 5 * C;  // fcw, fcb, fcprojw, fcprojb of one expert
  const size_t n = ep_.size > 1 && ep_.return_expert_grads ? static_cast<size_t>(E) * per_expert : 0;
  ep_grad_send_.assign(n, T(0));
  ep_grad_recv_.assign(n, T(0));
}

namespace {
// Where local expert j of layer l sits in the expert tensors (in units of one expert).
struct ExpertSlot {
  size_t E, El, rank;
  bool sharded;
  size_t operator()(size_t l, size_t j) const { return sharded ? l * El + j : l * E + rank * El + j; }
};
}  // namespace

template <typename T>
void Gpt<T>::moe_experts_forward_ep(size_t l, const LayerActs& a) {
  using namespace cpu;
  const size_t C = config_.channels, E = config_.moe.experts, cap = moe_cap_, H = 4 * C;
  const size_t P = ep_.size, El = E / P;
  const ExpertSlot expert_slot{E, El, static_cast<size_t>(ep_.rank), config_.moe.expert_shards > 1};
  const Routing& r = routing_[l];
  auto w = split_tensors(params_.data(), config_);
  int32_t* cnt = ep_count_.data() + l * E;
  ep_.all_to_all(r.count, cnt, El * sizeof(int32_t));
  ep_.all_to_all(moe_x_, moe_dx_, El * cap * C * sizeof(T));  // dispatch: moe_dx_ in received order
  for (size_t s = 0; s < P; ++s) {
    for (size_t j = 0; j < El; ++j) {
      const size_t n = cnt[s * El + j], base = (s * El + j) * cap, le = expert_slot(l, j);
      if (n == 0) continue;
      matmul_forward(pool_, a.fch + base * H, moe_dx_ + base * C, w[10] + le * H * C, w[11] + le * H, n,
                     static_cast<int>(C), static_cast<int>(H));
      gelu_forward(pool_, a.fch_gelu + base * H, a.fch + base * H, n * H);
      matmul_forward(pool_, moe_dy_ + base * C, a.fch_gelu + base * H, w[12] + le * C * H, w[13] + le * C, n,
                     static_cast<int>(H), static_cast<int>(C));
    }
  }
  ep_.all_to_all(moe_dy_, a.moe_y, El * cap * C * sizeof(T));  // combine: outputs back in routing order
}

template <typename T>
void Gpt<T>::moe_experts_backward_ep(size_t l, const LayerActs& a, const T* dout) {
  using namespace cpu;
  const size_t C = config_.channels, E = config_.moe.experts, cap = moe_cap_, H = 4 * C;
  const size_t P = ep_.size, El = E / P;
  const ExpertSlot expert_slot{E, El, static_cast<size_t>(ep_.rank), config_.moe.expert_shards > 1};
  const Routing& r = routing_[l];
  auto w = split_tensors(params_.data(), config_);
  auto g = split_tensors(grads_.data(), config_);
  const int32_t* cnt = ep_count_.data() + l * E;
  const size_t bytes = El * cap * C * sizeof(T);
  // The experts' inputs again (not kept per layer: one more all_to_all instead of E cap C floats per layer), then
  // dy[row] = gate * dout[token], both in routing order, dispatched like the forward's rows.
  for (size_t pass = 0; pass < 2; ++pass) {
    for (size_t e = 0; e < E; ++e) {
      const size_t n = r.count[e];
      pool_.parallel_for(n, [&](size_t i0, size_t i1) {
        for (size_t i = i0; i < i1; ++i) {
          const size_t t = r.token[e * cap + i];
          T* row = moe_x_ + (e * cap + i) * C;
          if (pass == 0) {
            std::memcpy(row, a.ln2 + t * C, C * sizeof(T));
          } else {
            const T gate = a.probs[t * E + e];
            for (size_t c = 0; c < C; ++c) row[c] = gate * dout[t * C + c];
          }
        }
      });
    }
    ep_.all_to_all(moe_x_, pass == 0 ? moe_dx_ : moe_dy_, bytes);
  }
  // moe_dx_ = inputs, moe_dy_ = output gradients (received order); input gradients into moe_x_ (received order).
  // Weight gradients: accumulated into this rank's experts, or (return_expert_grads) per (source, expert) block into
  // ep_grad_send_, laid out [source][local expert][fcw, fcb, fcprojw, fcprojb] so chunk s goes back to source s.
  const bool ret = ep_.return_expert_grads;
  const size_t X = 2 * H * C + H + C;
  if (ret) std::fill(ep_grad_send_.begin(), ep_grad_send_.end(), T(0));
  for (size_t s = 0; s < P; ++s) {
    for (size_t j = 0; j < El; ++j) {
      const size_t n = cnt[s * El + j], base = (s * El + j) * cap, le = expert_slot(l, j);
      if (n == 0) continue;
      T* blk = ret ? ep_grad_send_.data() + (s * El + j) * X : nullptr;
      T* dfcw = ret ? blk : g[10] + le * H * C;
      T* dfcb = ret ? blk + H * C : g[11] + le * H;
      T* dprojw = ret ? blk + H * C + H : g[12] + le * C * H;
      T* dprojb = ret ? blk + 2 * H * C + H : g[13] + le * C;
      T* dh = moe_dh_ + base * H;
      matmul_backward(pool_, dh, false, dprojw, dprojb, moe_dy_ + base * C, a.fch_gelu + base * H, w[12] + le * C * H,
                      n, static_cast<int>(H), static_cast<int>(C));
      gelu_backward(pool_, dh, a.fch + base * H, dh, n * H);
      matmul_backward(pool_, moe_x_ + base * C, false, dfcw, dfcb, dh, moe_dx_ + base * C, w[10] + le * H * C, n,
                      static_cast<int>(C), static_cast<int>(H));
    }
  }
  ep_.all_to_all(moe_x_, moe_dx_, bytes);  // input gradients back in routing order
  if (!ret) return;
  // Received chunk j = owner j's blocks of this rank's tokens for experts [j E/P, (j+1) E/P): global expert order.
  // Each block is what this rank's own GEMMs compute without expert parallelism (same rows, same order), so added
  // to the gradient zeroed by backward(accumulate = false) it is that result, bit for bit.
  ep_.all_to_all(ep_grad_send_.data(), ep_grad_recv_.data(), El * X * sizeof(T));
  const auto add = [](T* dst, const T* src, size_t m) {
    for (size_t i = 0; i < m; ++i) dst[i] += src[i];
  };
  for (size_t e = 0; e < E; ++e) {
    if (r.count[e] == 0) continue;  // no rows: the single-rank loop skips the expert too
    const T* blk = ep_grad_recv_.data() + e * X;
    const size_t le = l * E + e;
    add(g[10] + le * H * C, blk, H * C);
    add(g[11] + le * H, blk + H * C, H);
    add(g[12] + le * C * H, blk + H * C + H, C * H);
    add(g[13] + le * C, blk + 2 * H * C + H, C);
  }
}

#define RAILYARD_GPT_EP(T)                                                \
  template void Gpt<T>::set_expert_exchange(ExpertExchange);              \
  template void Gpt<T>::moe_experts_forward_ep(size_t, const LayerActs&); \
  template void Gpt<T>::moe_experts_backward_ep(size_t, const LayerActs&, const T*);
RAILYARD_GPT_EP(float)
RAILYARD_GPT_EP(double)
#undef RAILYARD_GPT_EP

}  // namespace railyard::worker
