// GPT-2: one flat buffer for the parameters (llm.c order, gpt_config.h), one for their gradients and one for the
// activations of a fixed micro-batch shape (B, T). Explicit forward and backward, layer by layer. The buffers live on a
// device and every kernel runs through it (worker/device/kernels.h): the CPU by default, CUDA when given one
// (Gpt<float> only), mixture-of-experts layers and expert parallelism included.
//
// Templated on the float type: Gpt<float> trains; Gpt<double> is the finite-difference reference of the gradient
// check. The AdamW moments live in the optimizer (worker/optim), in buffers of the same layout.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/device/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt_config.h"
#include "worker/model/layer_acts.h"
#include "worker/model/moe_math.h"

namespace railyard::worker {

// A zero-filled, 64-byte aligned array (whole cache lines / AVX-512 vectors). Allocated once, never resized.
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n);
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  struct Free {
    void operator()(T* p) const;
  };
  std::unique_ptr<T[], Free> data_;
  size_t size_ = 0;
};

// What the MoE layers did in the last forward (all layers summed).
struct MoeStats {
  double aux_loss = 0;     // sum over layers of alpha * E * sum_e f_e P_e (part of forward()'s return value)
  size_t assignments = 0;  // (token, choice) pairs routed: L * N * k
  size_t dropped = 0;      // of those, over an expert's capacity (contribute nothing)
  size_t tokens_dropped =
      0;  // (layer, token) pairs with all k choices dropped: the MLP output is 0, the residual passes
};

// Pointers to the 16 tensors inside one flat buffer (params, grads, or AdamW m/v).
template <typename T>
std::array<T*, kNumParamTensors> split_tensors(T* flat, const GptConfig& c);

// Bytes of the activation buffer plus backward scratch that Gpt allocates for (B, T) and a pool of `threads`, with
// the given recomputation (the activations a recomputed layer drops are not allocated; one layer's working set is).
size_t activation_bytes(const GptConfig& c, int B, int T, int threads, const RecomputeSpec& recompute = {});

// GPT-2 initialisation: weights N(0, 0.02), the two residual projections (attprojw, fcprojw) N(0, 0.02/sqrt(2L)),
// biases 0, LayerNorm weights 1; wte rows >= V (padding) are 0. Deterministic in seed: each tensor is drawn in
// chunks of 64 Ki elements, chunk k of tensor i from mt19937_64 seeded by a hash of (seed, i, k) through our own
// Box-Muller, so the values do not depend on the platform or on whether a pool fills the chunks in parallel.
template <typename T>
void init_gpt2_weights(T* params, const GptConfig& c, uint64_t seed, ThreadPool* pool = nullptr);

template <typename T>
class Gpt {
 public:
  enum class Mode {
    kEval,   // keeps the logits; loss only
    kTrain,  // fused cross entropy: the logits buffer ends up holding dlogits for backward()
  };

  // B sequences of T tokens per forward (T <= maxT). Allocates everything here; forward/backward never allocate.
  // recompute: which layers drop activations after forward and recompute them in backward (bitwise the same).
  // device: where the buffers live and the kernels run; null = the CPU on `pool` (the pool also runs the CPU-only
  // mixture-of-experts dispatch).
  Gpt(const GptConfig& config, int B, int seq_len, ThreadPool& pool, const RecomputeSpec& recompute = {},
      Kernels<T>* device = nullptr);

  const GptConfig& config() const { return config_; }
  const RecomputeSpec& recompute() const { return recompute_; }
  int batch() const { return B_; }
  int seq_len() const { return T_; }
  size_t num_params() const { return params_.size(); }
  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  size_t activation_bytes() const;
  // params(), grads(), logits() and losses() point into device memory (host memory on the CPU).
  Kernels<T>& device() { return *dev_; }

  void init_weights(uint64_t seed);
  // The parameters to or from a host array of num_params() (a copy on the CPU too).
  void copy_params_to_host(T* host) const;
  void copy_params_from_host(const T* host);

  // inputs, targets: (B, T) token ids in [0, V). Returns the mean loss over the B*T positions (with experts, plus
  // the load-balancing loss moe_stats().aux_loss: the objective whose gradient backward() computes). In kTrain mode
  // dloss is d(objective)/d(mean loss) (1 / micro-steps under gradient accumulation) and backward() may follow.
  T forward(const int32_t* inputs, const int32_t* targets, Mode mode, T dloss = T(1));
  // Accumulates (+=) this micro-batch's gradients into grads(); call zero_grad() at the start of a step. With
  // accumulate = false the gradients are overwritten instead (no zero_grad() needed): the big weight gradients are
  // written by their GEMMs with beta = 0 and only the small vectors are zeroed, which saves a pass over grads().
  void backward(bool accumulate = true);
  void zero_grad();

  // Optional: backward() reports each flat range of grads() as soon as it holds its final value for this backward
  // (per layer: its 12 slices of the stacked tensors; wte and wpe last), so a data-parallel reducer can start on
  // finished buckets while the lower layers are still computing (worker/parallel/data_parallel.h). Every element is
  // reported exactly once per backward().
  using GradReadyHook = std::function<void(size_t offset, size_t count)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }

  // Optional: forward() calls this before it reads each parameter group (0: wte + wpe, 1 + l: layer l, L + 1: lnfw,
  // lnfb), so an optimizer still writing the parameters in the background (worker/optim/offload.h) can hold the
  // forward back just until the group it needs is written.
  using ParamsNeededHook = std::function<void(int group)>;
  void set_params_needed_hook(ParamsNeededHook hook) { params_needed_ = std::move(hook); }

  const MoeStats& moe_stats() const { return moe_stats_; }

  // Expert parallelism (worker/parallel/expert_parallel.h, docs/parallel.md "Expert parallelism"): this rank runs
  // experts [rank * E/size, (rank + 1) * E/size) of every MoE layer for the tokens of all `size` ranks of its
  // expert-parallel group. Routing, capacity and drops stay per rank (its own micro-batch), so the dispatched rows
  // are those the rank would compute alone; all_to_all moves them (chunk j of `in`, bytes_per_rank bytes, to rank j)
  // to their expert's rank and the outputs back. Every forward/backward of an MoE model is then collective over the
  // group. The parameter buffer keeps all E experts; a rank's gradients of the other ranks' experts stay 0 (the
  // data-parallel sum over the ranks adds the owners' contributions).
  // Off the host, `in` and `out` are device memory (the dispatched rows, and the per-expert counts through a small
  // device buffer), so the all_to_all must take the device's memory (NCCL on CUDA); the model synchronises the
  // device before every exchange.
  struct ExpertExchange {
    int size = 1;
    int rank = 0;
    std::function<void(const void* in, void* out, size_t bytes_per_rank)> all_to_all;
    // Deterministic mode: the owner sends each source rank the expert weight gradients of that rank's tokens (one
    // more all_to_all per layer of E/size experts' gradients per peer), so every rank's gradient is exactly the one
    // it computes without expert parallelism (a leaf of the fixed tree). Needs backward(accumulate = false).
    bool return_expert_grads = false;
  };
  void set_expert_exchange(ExpertExchange exchange);
  const ExpertExchange& expert_exchange() const { return ep_; }

  // (B, T, Vp) logits of the last kEval forward.
  const T* logits() const { return logits_; }
  // Per-position losses (B, T) of the last forward.
  const T* losses() const { return losses_; }

 private:
  // Where layer l's activations live: its slice of the stacked buffers, or (recomputed layers) the one-layer working
  // set, which backward refills by running the layer's forward again.
  // With experts, fch/fch_gelu hold the experts' rows (E * capacity, 4C), probs the router softmax (N, E) and
  // moe_y the experts' outputs (E * capacity, C).
  using LayerActs = worker::LayerActs<T>;  // model/layer_acts.h
  // Routing of one MoE layer (always kept: small): per (token, choice) the expert and its row (e * cap + position,
  // -1 when dropped); per expert its token count and the token of each row. The host decides the dispatch; a device
  // that is not the host gets its own copies of choice, row and token for its kernels (d_*; the same pointers on the
  // CPU).
  struct Routing {
    int32_t *choice, *row, *count, *token;
    int32_t *d_choice, *d_row, *d_token;
  };
  void layer_forward(size_t l, const T* residual, const LayerActs& a, T* residual3, MoeStats* stats);
  // out (N, C) = sum over kept choices of probs * expert(ln2); routing into routing_[l].
  void moe_forward(size_t l, const LayerActs& a, T* out, MoeStats* stats);
  // dx (N, C) = d ln2 (overwritten) from dout (N, C) = d(MoE output); expert and router gradients accumulated.
  void moe_backward(size_t l, const LayerActs& a, const T* dout, T* dx);
  // The experts' part of moe_forward/moe_backward with expert parallelism (gpt_expert_parallel.cc): moe_x_ holds
  // the dispatched rows in routing order (e * cap + i); outputs a.moe_y (forward) and moe_dx_ (backward) in that
  // order, as the single-rank loops leave them.
  void moe_experts_forward_ep(size_t l, const LayerActs& a);
  void moe_experts_backward_ep(size_t l, const LayerActs& a, const T* dout);
  // ep_.all_to_all after the device's queued kernels (its stream does not order against the communicator's).
  void ep_exchange(const void* in, void* out, size_t bytes_per_rank);
  // The per-expert row counts (E int32 from the host's routing; E int32 back into ep_count_).
  void ep_exchange_counts(const int32_t* mine, int32_t* theirs);
  const T* layer_input(size_t l) const;

  GptConfig config_;
  RecomputeSpec recompute_;
  int B_, T_;
  ThreadPool& pool_;
  std::unique_ptr<Kernels<T>> own_device_;  // the CPU, when no device was given
  Kernels<T>* dev_;
  DeviceBuffer<T> params_, grads_, acts_;
  DeviceBuffer<int32_t> inputs_, targets_;
  std::vector<T> losses_host_;  // the losses copied to the host (devices that are not the host)
  bool have_dlogits_ = false;
  T dloss_ = T(1);  // of the last kTrain forward: scales the load-balancing loss's gradient
  MoeStats moe_stats_;
  size_t moe_cap_ = 0;
  std::vector<Routing> routing_;
  std::vector<double> moe_f_;  // per expert: share of the choices (backward of the load-balancing loss)
  AlignedBuffer<int32_t> routing_buf_;
  DeviceBuffer<int32_t> routing_dev_;  // the d_* views (devices that are not the host)
  DeviceBuffer<T> moe_aux_;            // (E) the load-balancing loss's gradient per probability (moe::aux_grads)
  std::vector<T> probs_host_;          // (N, E) router probabilities copied out for the balance statistics
  // MoE scratch: gathered expert inputs and their gradient (E*cap, C), d expert output (E*cap, C), d hidden
  // (E*cap, 4C), d router probabilities (N, E).
  T *moe_x_ = nullptr, *moe_dx_ = nullptr, *moe_dy_ = nullptr, *moe_dh_ = nullptr, *moe_dp_ = nullptr;
  GradReadyHook grad_ready_;
  ExpertExchange ep_;
  // Per layer (L, E) with expert parallelism: rows source rank s sends to local expert j, at s * E/size + j.
  std::vector<int32_t> ep_count_;
  DeviceBuffer<int32_t> ep_count_dev_;           // off the host: the counts' way through device memory (2 E)
  DeviceBuffer<T> ep_grad_send_, ep_grad_recv_;  // return_expert_grads: one layer's (source, expert) weight gradients
  ParamsNeededHook params_needed_;
  // Views into acts_. residual3 is stacked [L, B, T, C] (every layer's output is the next one's input); the other
  // per-layer tensors are in layer_.
  T *encoded_, *residual3_, *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *losses_;
  std::vector<LayerActs> layer_;
  // Backward scratch (one layer at a time) and the forward's projection output.
  T *dres_, *dc_, *d4c_, *dqkv_, *att_scratch_, *ln_scratch_, *proj_;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace railyard::worker
