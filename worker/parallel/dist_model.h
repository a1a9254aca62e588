// hB's tensor/pipeline-parallel ParallelModel as the trainer's ShardedModel (worker/parallel/sharded_model.h): the
// schedule, the tied-embedding sync, the count-once grad norm over tp x pp, a skip flag agreed over the whole world,
// and AdamW over the local flat buffer with the decay rule of the llm.c tensor each local piece comes from.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/parallel_model.h"
#include "worker/parallel/zero.h"
#include "worker/parallel/sharded_model.h"
#include "worker/optim/train_config.h"

namespace railyard::worker::parallel {

class ParallelGpt final : public ShardedModel {
 public:
  // world: every rank of the job (for any()); groups: this rank's tp/pp/embedding groups. B, T, max_micro_batches as
  // ParallelModel. device: where the stage lives and runs (null: the CPU on `pool`). On a device that is not the host
  // params()/grads() are device memory, AdamW runs there per local tensor (kernels.h adamw_update, the same arithmetic
  // as ZeroAdamW), and adam_m()/adam_v()/host_params() are host copies for checkpoints, refreshed by refresh_host()
  // when the device's values changed since the last refresh (Trainer::state() calls it; never once per step);
  // upload_host() writes them back after a restore. The device moments are allocated on first use (update(),
  // adam_m()/adam_v()): under ZeRO the DataParallel owns the shard's moments and this model never allocates its own.
  // On a host-accessible device (the CPU) none of this applies: the buffers are read in place.
  ParallelGpt(const GptConfig& config, const TrainConfig& train, int max_micro_batches, ThreadPool& pool,
              comm::Communicator& world, const ModelGroups& groups, Kernels<float>* device = nullptr);

  size_t num_params() const override { return model_.num_params(); }
  float* params() override { return model_.params(); }
  float* grads() override { return model_.grads(); }
  void init_weights(uint64_t seed) override {
    model_.init_weights(seed);
    params_changed();
  }
  double forward_backward(int M, const NextBatch& next, float dloss, StepTimes* times) override;
  void set_grad_ready_hook(std::function<void(size_t, size_t)> hook) override {
    model_.set_grad_ready_hook(std::move(hook));
  }
  double evaluate(int M, const NextBatch& next) override { return model_.evaluate(M, next); }
  double grad_norm(const float* grads) override;
  bool moe_stats(double out[3]) override;
  bool any(bool local) override;
  void update(float* params, const float* grads, float lr, float grad_scale) override;
  int64_t adam_t() const override { return on_host() ? adam_->t() : t_; }
  // AdamW moments, laid out like params() (checkpoints: shards_from_slices over model().shard_map()); host memory.
  // Off the host the first call allocates the moments (not under ZeRO, whose sync holds them: do not call it then).
  float* adam_m() { return on_host() ? adam_->m() : moments().host_m.data(); }
  float* adam_v() { return on_host() ? adam_->v() : moments().host_v.data(); }
  // params() in host memory (the host copy on a device that is not the host).
  float* host_params() override { return on_host() ? params() : host_params_.data(); }
  void set_adam_t(int64_t t) override {
    if (on_host()) adam_->set_t(t);
    t_ = t;
  }
  // Devices that are not the host: device -> host copies of params and the AdamW moments it holds, if they changed
  // since the last refresh / host -> device after a restore.
  void refresh_host() override;
  void upload_host() override;
  void params_changed() override { host_stale_ = !on_host(); }
  const Kernels<float>* device() const override { return dev_; }
  // Bytes of device memory this model holds for its own AdamW moments (0 on the CPU, and under ZeRO).
  size_t device_moment_bytes() const { return moments_ ? 2 * moments_->m.size() * sizeof(float) : 0; }
  std::string describe() const override;

  // Every rank keeps its slices of a full llm.c buffer (e.g. an --init-from model).
  void load_full(const float* full) {
    model_.scatter_from_full(full);
    params_changed();
  }
  // The full llm.c parameter buffer on every rank (collective over the world): each element is written by exactly
  // one rank (dp rank 0, tp rank 0 for replicated pieces, never the tied wte copy) into zeros, then summed. Off the
  // host it refreshes host_params() first (an export after the last checkpoint).
  std::vector<float> gather_full(int dp_rank);

  ParallelModel& model() { return model_; }

 private:
  bool on_host() const { return dev_ == nullptr || dev_->host_accessible(); }
  // Off the host: the model's own AdamW moments on the device and their host copies.
  struct Moments {
    DeviceBuffer<float> m, v;
    std::vector<float> host_m, host_v;
  };
  Moments& moments();  // allocated (zeros) on first use

  comm::Communicator& world_;
  GptConfig config_;
  Kernels<float>* dev_;  // null: the CPU
  ParallelModel model_;
  BucketLayout whole_;             // one bucket, one owner: ZeroAdamW then is plain AdamW over the local buffer
  std::optional<ZeroAdamW> adam_;  // host-accessible devices
  std::vector<TensorSpan> spans_;  // devices that are not the host: AdamW per local tensor there
  AdamWHyper hyper_;
  int64_t t_ = 0;
  std::optional<Moments> moments_;  // off the host, without ZeRO
  std::vector<float> host_params_;
  bool host_stale_ = false;  // off the host: the device changed since the host copies were refreshed
};

// The data-parallel reducer of a ParallelGpt replica: its local buffer, ZeRO's AdamW per local tensor, and the
// count-once grad norm summed over dp, then tp and pp (`groups`).
std::unique_ptr<DataParallel> parallel_gpt_data_parallel(comm::Communicator* dp, ParallelGpt& model,
                                                         const ModelGroups& groups, const TrainConfig& train,
                                                         ThreadPool& pool, DataParallelOptions options);

// The 16 local tensors' spans of a stage's flat buffer (local_param_sizes order) with AdamW's decay rule, then the
// MoE router's.
std::vector<TensorSpan> local_tensor_spans(const StageShape& shape);

}  // namespace railyard::worker::parallel
