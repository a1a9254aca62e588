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
#include "common/error.h"
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
  // Off the host the counts travel through device memory too (the group's communicator takes only that: NCCL).
  ep_count_dev_ = ep_.size > 1 && !dev_->host_accessible() ? DeviceBuffer<int32_t>(*dev_, 2 * static_cast<size_t>(E))
                                                           : DeviceBuffer<int32_t>();
  const size_t C = config_.channels, per_expert = 8 * C * C + 5 * C;  // fcw, fcb, fcprojw, fcprojb of one expert
  const size_t n = ep_.size > 1 && ep_.return_expert_grads ? static_cast<size_t>(E) * per_expert : 0;
  ep_grad_send_ = n > 0 ? DeviceBuffer<T>(*dev_, n) : DeviceBuffer<T>();
  ep_grad_recv_ = n > 0 ? DeviceBuffer<T>(*dev_, n) : DeviceBuffer<T>();
}

template <typename T>
void Gpt<T>::ep_exchange(const void* in, void* out, size_t bytes_per_rank) {
  // The communicator's stream does not order against the device's (CUDA + NCCL): the rows must be written before it
  // reads them. It has finished with `out` when it returns, so the kernels after it see the received rows.
  dev_->synchronize();
  ep_.all_to_all(in, out, bytes_per_rank);
}

template <typename T>
void Gpt<T>::ep_exchange_counts(const int32_t* mine, int32_t* theirs) {
  const size_t E = config_.moe.experts, bytes = E / ep_.size * sizeof(int32_t);
  if (dev_->host_accessible()) {
    ep_.all_to_all(mine, theirs, bytes);
    return;
  }
  // E int32 each way through the small device buffer (copy in, wait, exchange, copy out).
  int32_t* in = ep_count_dev_.data();
  int32_t* out = in + E;
  dev_->to_device(in, mine, E * sizeof(int32_t));
  dev_->synchronize();
  ep_.all_to_all(in, out, bytes);
  dev_->to_host(theirs, out, E * sizeof(int32_t));
}

namespace {
// Where local expert j of layer l sits in the expert tensors (in units of one expert).
struct ExpertSlot {
  size_t E, El, rank;
  bool sharded;
  size_t operator()(size_t l, size_t j) const { return sharded ? l * El + j : l * E + rank * El + j; }
};
}  // namespace

// Every kernel below runs on the device (the CPU's are the loops this file ran before, bit for bit); the host holds
// only the counts (routing_[l].count and ep_count_), which size the GEMMs.
template <typename T>
void Gpt<T>::moe_experts_forward_ep(size_t l, const LayerActs& a) {
  Kernels<T>& d = *dev_;
  const size_t C = config_.channels, E = config_.moe.experts, cap = moe_cap_, H = 4 * C;
  const size_t P = ep_.size, El = E / P;
  const ExpertSlot expert_slot{E, El, static_cast<size_t>(ep_.rank), config_.moe.expert_shards > 1};
  const Routing& r = routing_[l];
  auto w = split_tensors(params_.data(), config_);
  int32_t* cnt = ep_count_.data() + l * E;
  ep_exchange_counts(r.count, cnt);
  ep_exchange(moe_x_, moe_dx_, El * cap * C * sizeof(T));  // dispatch: moe_dx_ in received order
  for (size_t s = 0; s < P; ++s) {
    for (size_t j = 0; j < El; ++j) {
      const size_t n = cnt[s * El + j], base = (s * El + j) * cap, le = expert_slot(l, j);
      if (n == 0) continue;
      d.matmul_gelu_forward(a.fch_gelu + base * H, a.fch + base * H, moe_dx_ + base * C, w[10] + le * H * C,
                            w[11] + le * H, n, static_cast<int>(C), static_cast<int>(H));
      d.matmul_forward(moe_dy_ + base * C, a.fch_gelu + base * H, w[12] + le * C * H, w[13] + le * C, n,
                       static_cast<int>(H), static_cast<int>(C));
    }
  }
  ep_exchange(moe_dy_, a.moe_y, El * cap * C * sizeof(T));  // combine: outputs back in routing order
}

template <typename T>
void Gpt<T>::moe_experts_backward_ep(size_t l, const LayerActs& a, const T* dout) {
  Kernels<T>& d = *dev_;
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
  for (size_t e = 0; e < E; ++e) {
    if (r.count[e] > 0) d.moe_gather_rows(moe_x_ + e * cap * C, a.ln2, r.d_token + e * cap, r.count[e], C);
  }
  ep_exchange(moe_x_, moe_dx_, bytes);
  for (size_t e = 0; e < E; ++e) {
    if (r.count[e] > 0) d.moe_gate_rows(moe_x_ + e * cap * C, dout, a.probs, r.d_token + e * cap, e, E, r.count[e], C);
  }
  ep_exchange(moe_x_, moe_dy_, bytes);
  // moe_dx_ = inputs, moe_dy_ = output gradients (received order); input gradients into moe_x_ (received order).
  // Weight gradients: accumulated into this rank's experts, or (return_expert_grads) per (source, expert) block into
  // ep_grad_send_, laid out [source][local expert][fcw, fcb, fcprojw, fcprojb] so chunk s goes back to source s.
  const bool ret = ep_.return_expert_grads;
  const size_t X = 2 * H * C + H + C;
  if (ret) d.zero(ep_grad_send_.data(), ep_grad_send_.size() * sizeof(T));
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
      d.matmul_backward(dh, false, dprojw, dprojb, moe_dy_ + base * C, a.fch_gelu + base * H, w[12] + le * C * H, n,
                        static_cast<int>(H), static_cast<int>(C), true);
      d.gelu_backward(dh, a.fch + base * H, dh, n * H);
      d.matmul_backward(moe_x_ + base * C, false, dfcw, dfcb, dh, moe_dx_ + base * C, w[10] + le * H * C, n,
                        static_cast<int>(C), static_cast<int>(H), true);
    }
  }
  ep_exchange(moe_x_, moe_dx_, bytes);  // input gradients back in routing order
  if (!ret) return;
  // Received chunk j = owner j's blocks of this rank's tokens for experts [j E/P, (j+1) E/P): global expert order.
  // Each block is what this rank's own GEMMs compute without expert parallelism (same rows, same order), so added
  // to the gradient zeroed by backward(accumulate = false) it is that result, bit for bit.
  ep_exchange(ep_grad_send_.data(), ep_grad_recv_.data(), El * X * sizeof(T));
  for (size_t e = 0; e < E; ++e) {
    if (r.count[e] == 0) continue;  // no rows: the single-rank loop skips the expert too
    const T* blk = ep_grad_recv_.data() + e * X;
    const size_t le = l * E + e;
    d.accumulate(g[10] + le * H * C, blk, H * C);
    d.accumulate(g[11] + le * H, blk + H * C, H);
    d.accumulate(g[12] + le * C * H, blk + H * C + H, C * H);
    d.accumulate(g[13] + le * C, blk + 2 * H * C + H, C);
  }
}

#define RAILYARD_GPT_EP(T)                                                \
  template void Gpt<T>::set_expert_exchange(ExpertExchange);              \
  template void Gpt<T>::ep_exchange(const void*, void*, size_t);          \
  template void Gpt<T>::ep_exchange_counts(const int32_t*, int32_t*);     \
  template void Gpt<T>::moe_experts_forward_ep(size_t, const LayerActs&); \
  template void Gpt<T>::moe_experts_backward_ep(size_t, const LayerActs&, const T*);
RAILYARD_GPT_EP(float)
RAILYARD_GPT_EP(double)
#undef RAILYARD_GPT_EP

}  // namespace railyard::worker
