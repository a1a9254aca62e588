// One pipeline stage of the GPT, tensor-sharded Megatron-style over the tp group (docs/parallel.md):
//   - QKV and MLP-up column-parallel (rank r holds the q, k, v rows of heads [r NHl, (r+1) NHl) and rows
//     [r 4Cl, (r+1) 4Cl) of fcw), attention-out and MLP-down row-parallel (the matching input columns); the f
//     operator (identity forward, all-reduce backward) sits before each column-parallel layer, g (all-reduce
//     forward, identity backward) after each row-parallel one, whose bias tp rank 0 adds so it counts once.
//   - wte split by vocabulary rows: the embedding all-reduces its output, the tied LM head produces (N, Vl) logits
//     and the cross entropy all-reduces the row max and the sum of exponentials: no rank ever holds full logits.
// Parameters and gradients live in one flat local buffer each, in llm.c tensor order with local shapes
// (local_param_sizes); shard_map() says which global slice each piece is. Activations are kept for `slots`
// micro-batches in flight (the 1F1B schedule in parallel_model.h picks the slot).
// Sequence parallelism (Korthikanti et al. 2022; docs/parallel.md "Sequence parallelism"): with sequence_parallel
// and tp > 1, the layernorm/residual regions hold only this rank's N/tp token rows (rows [r N/tp, (r+1) N/tp) of the
// (B,T) row-major tokens; the stage's input, output and the pipeline messages are that shard). f becomes an
// all-gather forward (reduce-scatter backward), g a reduce-scatter forward (all-gather backward); the layernorm
// weight gradients, computed from local rows, are summed over tp at the end of backward.
// Context parallelism (docs/parallel.md "Context parallelism"): with a cp group of size P > 1 the stage holds
// positions [r T/P, (r+1) T/P) of every sequence of the micro-batch (it is given the whole (B,T) tokens and keeps its
// slice); attention is RingAttention over cp, everything else is row-wise. The loss returned and the gradients are
// those of the local tokens (mean over them): the caller averages both over cp, as over data-parallel replicas.
// Device (issue #11, docs/gpu.md): every kernel goes through worker/device/kernels.h and params, grads, activations,
// scratch and token copies are that device's memory (the CPU's CpuKernels<float> on `pool` by default). Pointers
// handed out (params(), grads(), input()/output()/grad_*()) and given to the tp communicator are device memory, so on
// CUDA the communicators must take device memory (NCCL). Inputs and targets passed to forward() are host memory.
// Context parallelism (RingAttention) runs on host-accessible devices only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/device/cpu_kernels.h"
#include "worker/device/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/parallel/ring_attention.h"
#include "worker/parallel/stage_plan.h"

namespace railyard::worker::parallel {

// The bytes a GptStage of these arguments allocates for activations (activation_bytes()), without building it:
// what the memory comparison with the planner uses on shapes too big to allocate in a unit test.
size_t stage_activation_bytes(const StageShape& shape, int B, int seq_len, int slots, size_t threads,
                              const RecomputeSpec& recompute = {}, bool sequence_parallel = false, int cp = 1);

// The MoE layers' share of it (0 for a dense model): routing, router probabilities and expert rows per slot and
// layer, plus one layer's backward scratch (gpt_stage_moe.cc).
size_t stage_moe_activation_bytes(const StageShape& shape, int B, int seq_len, int slots, bool sequence_parallel);

class GptStage {
 public:
  // (B, T) micro-batches; tp is the tensor-parallel group (nullptr or size 1 when tp_size == 1).
  // recompute: which layers (global index) drop activations after forward and rebuild them in backward, tp
  // all-reduces included (docs/worker.md); results are bitwise those without.
  // device: where the stage lives and runs (null: CpuKernels<float> on `pool`); it must outlive the stage.
  GptStage(const StageShape& shape, int B, int seq_len, int slots, ThreadPool& pool, comm::Communicator* tp,
           const RecomputeSpec& recompute = {}, bool sequence_parallel = false, comm::Communicator* cp = nullptr,
           Kernels<float>* device = nullptr);

  const StageShape& shape() const { return shape_; }
  int slots() const { return slots_; }
  bool sequence_parallel() const { return sp_; }
  int cp_size() const { return cp_size_; }
  // Token rows of the residual stream held here: B*T, or B*T/tp with sequence parallelism (input(), output(),
  // grad_output() and grad_input() are (rows(), C)).
  size_t rows() const { return rows_; }
  size_t num_params() const { return params_.size(); }
  Kernels<float>& device() const { return *dev_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const std::vector<ShardSlice>& shard_map() const { return map_; }
  void zero_grad();

  // Every rank initialises the same full llm.c buffer (init_gpt2_weights, same seed) and keeps its slices, so any
  // layout starts from identical weights.
  void scatter_from_full(const float* full);
  // Writes this rank's slices of `local` (params(), grads() or a buffer of that layout) into the full buffer. `local`
  // is device memory when it is params() or grads(), host memory otherwise; `full` is host memory.
  void gather_into_full(const float* local, float* full) const;

  // (rows(),C) the residual stream entering this stage's first layer: stage > 0 receives it here before forward().
  float* input(int slot);
  // (rows(),C) the residual stream leaving the last layer (what stage s+1 receives); valid until the slot is reused.
  const float* output(int slot) const;
  // (rows(),C) d(output): stage < last receives it here before backward().
  float* grad_output() { return dres_; }
  // (rows(),C) d(input) after backward(slot): what stage s-1 receives.
  const float* grad_input(int slot) const;

  // One micro-batch forward into activation slot `slot`. inputs are read on the first stage, targets on the last
  // (both (B,T), ids in [0, V)). On the last stage returns the mean loss and leaves dloss/(B*T) * d(loss)/d(logits)
  // for backward (fused cross entropy); returns 0 elsewhere.
  double forward(int slot, const int32_t* inputs, const int32_t* targets, float dloss);
  // Accumulates (+=) the micro-batch's gradients into grads(); leaves d(input) in grad_input(slot) on stage > 0.
  // With `ready`, reports each local range of grads() as soon as this backward has finished it (lnf first, then
  // each layer's 12 slices, top layer first, then wpe): for the last micro-batch of a step, so that a data-parallel
  // reducer can start early. wte is reported here only when this stage holds both its uses (pp == 1); with pp > 1
  // ParallelModel::finish_grads reports it after the tied-embedding all-reduce.
  using GradReadyHook = std::function<void(size_t offset, size_t count)>;
  void backward(int slot, const GradReadyHook* ready = nullptr);

  // Bytes allocated for activations (all slots), backward scratch and the first stage's token copies.
  size_t activation_bytes() const {
    return (acts_.size() + scratch_.size()) * sizeof(float) +
           (tokens_.size() + cp_tokens_.size() + targets_.size()) * sizeof(int32_t) +
           (ring_ ? ring_->workspace_bytes() : 0) + moe_bytes();
  }

  // Seconds spent in tp all-reduces since the last call (then reset).
  double take_tp_comm_seconds();

  // Mixture of experts (gpt_stage_moe.cc; docs/parallel.md "Expert parallelism"): the MoE layers of this stage.
  // With sequence parallelism each tp rank routes its own rows and the expert and router weight gradients are partial
  // sums until finish_moe_grads() adds them over tp (once per step, after the last backward; reports them to `ready`).
  void finish_moe_grads(const GradReadyHook* ready);
  // What this stage's MoE layers did in the forwards since the last call (then reset): aux loss, assignments and
  // drops of the whole micro-batches (over tp when the tokens are split), summed over micro-batches and layers.
  MoeStats take_moe_stats();
  // Expert parallelism (as Gpt<float>::set_expert_exchange; worker/parallel/expert_parallel.h): this rank runs experts
  // [rank E/size, (rank+1) E/size) of its MoE layers for the tokens of its group (data-parallel ranks of the same
  // (tp, pp) coordinate), dispatch and combine by all_to_all; every forward/backward is then collective over the
  // group. All E experts stay in the buffer; the other ranks' experts get zero gradient here (the data-parallel
  // reduction adds the owners'). return_expert_grads (the deterministic mode) is not supported here.
  void set_expert_exchange(Gpt<float>::ExpertExchange exchange);

 private:
  // One layer's activations: its share of the slot's buffers, or (recomputed layers) the stage's one-layer working
  // set, which backward refills by running the layer forward again.
  using LayerActs = worker::LayerActs<float>;  // model/layer_acts.h (probs, moe_y unused: the MoE part holds them)
  struct Slot {
    float *input, *res3, *lnf, *lnf_mean, *lnf_rstd, *logits, *losses, *dinput;
    std::vector<LayerActs> layer;  // local layer index
    int32_t* tokens;
  };
  void all_reduce(float* buf, size_t n, comm::ReduceOp op);
  // Sequence parallelism: (rows_,C) shard -> (N,C) in rank order, and the (N,C) partial sums -> this rank's rows.
  void all_gather_rows(const float* local, float* full);
  void reduce_scatter_rows(const float* full, float* local);
  // The attention core: the CPU kernel on the whole sequence, or (context parallel) the ring; `att` holds the
  // probabilities (B,NHl,T,T), or the ring's log-sum-exp (B,NHl,T/P).
  void attention_fwd(const LayerActs& a);
  void attention_bwd(const LayerActs& a);
  // Local layer l of a slot: writes res3 (proj_ may be passed to discard it).
  void layer_forward(size_t l, const float* residual, const LayerActs& a, float* res3);
  // Mixture of experts, activation slot cur_slot_: out (rows_,C) = the MoE output for a.ln2; its backward writes
  // dx (rows_,C) = d ln2 from dout (rows_,C) and accumulates the expert and router gradients.
  struct Moe;
  void moe_init();
  size_t moe_bytes() const;
  void moe_forward(size_t l, const LayerActs& a, float* out);
  void moe_backward(size_t l, const LayerActs& a, const float* dout, float* dx, const GradReadyHook* ready);
  // all_gather over tp of a few host integers (routing counts): through device buffers when tp_ takes device memory.
  void moe_tp_all_gather(const void* mine, void* all, size_t n, comm::DType t);
  // The experts' part with expert parallelism: the moe_x rows (routing order) in, the outputs (forward) or input
  // gradients (backward) back in routing order.
  void moe_experts_forward_ep(size_t l);
  void moe_experts_backward_ep(size_t l, const LayerActs& a, const float* dout);

  StageShape shape_;
  RecomputeSpec recompute_;
  int B_, T_, slots_;
  bool sp_;
  size_t rows_;
  int T_full_, cp_size_ = 1, cp_rank_ = 0;  // T_ is the local sequence length T_full_ / cp_size_
  AlignedBuffer<int32_t> cp_tokens_;        // context parallel: this rank's slice of the inputs and targets (2 B T_)
  ThreadPool& pool_;
  std::unique_ptr<CpuKernels<float>> own_dev_;  // the default device
  Kernels<float>* dev_;
  comm::Communicator* tp_;
  std::vector<ShardSlice> map_;
  std::array<size_t, kNumParamTensors> sizes_{};
  DeviceBuffer<float> params_, grads_, acts_, scratch_;
  std::unique_ptr<RingAttention> ring_;  // context parallel; its buffers are the device's (after dev_)
  // tokens_: the first stage's inputs per slot; targets_: the last stage's targets (devices that are not the host
  // only: the CPU reads them in place); losses_: the host copy of the losses (likewise).
  DeviceBuffer<int32_t> tokens_, targets_;
  std::vector<float> losses_;
  std::vector<Slot> slot_;
  // Shared by all slots (one micro-batch computes at a time): backward scratch, the row-parallel outputs, and the
  // cross entropy's per-row max and [sum exp | target logit].
  float *dres_, *dc_, *d4c_, *dqkv_, *att_scratch_, *proj_, *ce_max_, *ce_sums_;
  float* ln_scratch_ = nullptr;  // layernorm_backward's (none on the CPU)
  // Sequence parallelism only (else null): gath_ (N,C) the all-gathered layernorm output or d(residual); rs_
  // (rows_,C) a reduce-scatter's result; sp_ln_ the micro-batch's layernorm weight gradients from local rows, per
  // layer [ln1w ln1b ln2w ln2b] (4C) then lnfw lnfb (2C), summed over tp before they join grads().
  float *gath_ = nullptr, *rs_ = nullptr, *sp_ln_ = nullptr;
  double tp_seconds_ = 0;
  struct MoeDelete {
    void operator()(Moe* m) const;  // gpt_stage_moe.cc, where Moe is complete
  };
  std::unique_ptr<Moe, MoeDelete> moe_;  // null for a dense model
  int cur_slot_ = 0;                     // the slot forward/backward works on (MoE routing is kept per slot)
  bool recomputing_ = false;             // a recomputed forward adds no MoE statistics
  double moe_aux_ = 0;                   // this forward's load-balancing loss (this stage's layers)
  float dloss_ = 1;                      // of the last forward: scales the load-balancing loss's gradient
};

}  // namespace railyard::worker::parallel
