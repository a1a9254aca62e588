// The tensor- and pipeline-parallel GPT as the trainer sees it: this rank's GptStage plus the 1F1B schedule
// (docs/parallel.md, "Pipeline parallelism"). One object per rank; all ranks of a model replica (tp x pp) call the
// same methods in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/process_groups.h"
#include "worker/parallel/gpt_stage.h"
#include "worker/parallel/step_times.h"

namespace railyard::worker::parallel {

// The groups this rank belongs to; a null group means degree 1. embedding: the first and the last pipeline stage of
// this (dp, tp) coordinate (only used when pp > 1, on those two stages).
struct ModelGroups {
  comm::Communicator* tp = nullptr;
  comm::Communicator* pp = nullptr;
  comm::Communicator* embedding = nullptr;
  // context parallelism: the ranks that split each sequence (ring attention); the caller averages the gradients over
  // it as over data-parallel replicas. Not part of ProcessGroups yet (see docs/parallel.md).
  comm::Communicator* cp = nullptr;
};
// The model's groups out of the worker's process groups (which must outlive the model).
inline ModelGroups model_groups(comm::ProcessGroups& g) { return {&g.tp(), &g.pp(), g.embedding()}; }

class ParallelModel {
 public:
  // (B, T) micro-batches, at most max_micro_batches per forward_backward (activation memory is allocated here for
  // min(max_micro_batches, pp - stage) micro-batches). boundaries: stage split (empty = balance_stages).
  // recompute: activation recomputation of the stage's layers; sequence_parallel: Megatron sequence parallelism
  // over the tp group, the pipeline then sends each tp rank's rows only (GptStage). device: where the stage lives and
  // runs (null: the CPU on `pool`); on a device that is not the host the pipeline messages and the tied-embedding
  // all-reduce pass device pointers, so the groups' communicators must take device memory (NCCL on CUDA).
  ParallelModel(const GptConfig& config, int B, int seq_len, int max_micro_batches, ThreadPool& pool,
                const ModelGroups& groups, const std::vector<int>& boundaries = {}, const RecomputeSpec& recompute = {},
                bool sequence_parallel = false, Kernels<float>* device = nullptr);

  // Forward and backward of M micro-batches through the pipeline (1F1B), accumulating (+=) gradients scaled by
  // dloss (e.g. 1/(M*dp)) into grads(); call zero_grad() first. next_micro_batch fills (B,T) inputs and targets; it
  // is called M times on EVERY rank in micro-batch order (so every rank's loader advances alike) before the
  // schedule starts. Returns the mean loss over the M micro-batches on every rank (sent from the last stage).
  // times (optional) gets compute, tp_comm and pp_wait added.
  double forward_backward(int M, const std::function<void(int32_t* inputs, int32_t* targets)>& next_micro_batch,
                          float dloss, StepTimes* times = nullptr);
  // Forward only (validation): mean loss over M micro-batches, on every rank, in rounds of at most the
  // max_micro_batches the model was built for. Gradients untouched.
  double evaluate(int M, const std::function<void(int32_t* inputs, int32_t* targets)>& next_micro_batch,
                  StepTimes* times = nullptr);

  float* params() { return stage_->params(); }
  float* grads() { return stage_->grads(); }
  size_t num_params() const { return stage_->num_params(); }
  void zero_grad() { stage_->zero_grad(); }
  // With pp > 1 the first and last stages each hold wte (tied embedding / LM head): sums their wte gradients over
  // the embedding group so both copies take the same optimizer step. Call once per step after the last
  // forward_backward and before the data-parallel reduction/optimizer. Time is added to times->pp_wait.
  void finish_grads(StepTimes* times = nullptr);
  // Optional (data-parallel overlap): during each forward_backward's last micro-batch, and in finish_grads for the
  // tied wte when pp > 1, reports every local range of grads() once, as soon as it is final. See GptStage::backward.
  void set_grad_ready_hook(GptStage::GradReadyHook hook) { ready_ = std::move(hook); }

  const StageShape& shape() const { return stage_->shape(); }
  const std::vector<ShardSlice>& shard_map() const { return stage_->shard_map(); }
  // Local element ranges to count in global sums (grad norm): see count_once_ranges in stage_plan.h.
  const std::vector<ElementRange>& count_once() const { return count_once_; }
  // Sum of squares of a buffer of the local layout (e.g. grads() after the dp reduction) over the whole model
  // replica, each llm.c element counted once; identical bits on every rank of the replica (gathered over tp, then
  // pp, summed in rank order). sqrt of it is the global grad norm; a NaN/Inf anywhere makes it non-finite.
  // On a device that is not the host, buf is device memory and each range's sum comes from the device's global_norm
  // (the same value up to rounding, not the CPU loop's bits).
  double sum_squares_once(const float* buf);
  void scatter_from_full(const float* full) { stage_->scatter_from_full(full); }
  void gather_into_full(const float* local, float* full) const { stage_->gather_into_full(local, full); }
  // init_gpt2_weights(seed) of the full model, then this rank's slices.
  void init_weights(uint64_t seed);

  GptStage& stage() { return *stage_; }
  // Mixture of experts: the last forward_backward's statistics over all its micro-batches, summed over the stages
  // (aux_loss, assignments, dropped; the whole micro-batches even when sequence parallelism splits their tokens).
  const MoeStats& moe_stats() const { return moe_stats_; }
  bool sequence_parallel() const { return stage_->sequence_parallel(); }
  int cp_size() const { return stage_->cp_size(); }
  size_t activation_bytes() const { return stage_->activation_bytes(); }
  // For logs: "stage 1/2 layers [2,4) tp 0/2 (heads 0-1, vocab rows 0-63): 0.11M params, activations 1.3 MiB in 1
  // slot(s)".
  std::string describe() const;

 private:
  double run(int M, const std::function<void(int32_t*, int32_t*)>& next, float dloss, bool backward, StepTimes* times);
  // Fills batch_ with M micro-batches of N tokens each (inputs, then targets) and checks them against the vocabulary.
  void load_batch(int M, size_t N, const std::function<void(int32_t*, int32_t*)>& next);
  // The step's mean loss on every stage from this stage's `loss`: with MoE summed over the stages (and the routing
  // statistics with it, kept when `backward`), else the last stage's broadcast. Adds the time spent to *waited.
  double pipeline_loss(double loss, bool backward, double* waited);
  // The mean of the cp ranks' losses, in rank order. Adds the time spent to *waited.
  double mean_over_cp(double loss, double* waited);
  void wait(std::unique_ptr<comm::Request>& r, double* waited);
  // Element-wise sums over the pp group in rank order (fp64 as int64 bit patterns): the same bits on every stage.
  std::vector<double> sum_over_pp(const std::vector<double>& local, double* waited);

  GptConfig config_;
  int B_, T_, max_m_;
  ThreadPool& pool_;
  ModelGroups groups_;
  std::unique_ptr<GptStage> stage_;
  std::vector<ElementRange> count_once_;
  std::vector<int32_t> batch_;  // (M, 2, B, T): inputs and targets of the step's micro-batches
  std::vector<std::unique_ptr<comm::Request>> send_fwd_, send_bwd_;  // per slot
  GptStage::GradReadyHook ready_;
  uint32_t step_ = 0;  // tag space per call
  MoeStats moe_stats_;
};

}  // namespace railyard::worker::parallel
