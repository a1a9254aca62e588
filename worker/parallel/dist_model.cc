#include "worker/parallel/dist_model.h"

#include <cmath>
#include <cstring>

namespace railyard::worker::parallel {

std::vector<TensorSpan> local_tensor_spans(const StageShape& shape) {
  std::vector<TensorSpan> spans = tensor_spans(local_param_sizes(shape));
  const size_t router = local_router_size(shape);  // MoE: the stage's router after lnfb, decayed like the full one
  if (router > 0) spans.push_back({local_num_params(shape) - router, router, true});
  return spans;
}

ParallelGpt::ParallelGpt(const GptConfig& config, const TrainConfig& train, int max_micro_batches, ThreadPool& pool,
                         comm::Communicator& world, const ModelGroups& groups, Kernels<float>* device)
    : world_(world),
      config_(config),
      dev_(device),
      model_(config, train.batch, train.seq_len, max_micro_batches, pool, groups, {}, train.recompute,
             train.sequence_parallel, device),
      whole_(model_.num_params(), 1, model_.num_params()),
      spans_(local_tensor_spans(model_.shape())),
      hyper_{train.beta1, train.beta2, train.eps, static_cast<float>(train.weight_decay)} {
  if (on_host()) {
    adam_.emplace(whole_, 0, spans_, hyper_, pool);
    return;
  }
  // The moments are not allocated here: under ZeRO they would be 8 unused bytes per local parameter on the device.
  host_params_.resize(model_.num_params());
  host_stale_ = true;  // the first refresh_host() downloads
}

ParallelGpt::Moments& ParallelGpt::moments() {
  if (!moments_) {
    const size_t n = model_.num_params();
    Moments& mo = moments_.emplace();
    mo.m = DeviceBuffer<float>(*dev_, n);
    mo.v = DeviceBuffer<float>(*dev_, n);
    dev_->zero(mo.m.data(), n * sizeof(float));
    dev_->zero(mo.v.data(), n * sizeof(float));
    mo.host_m.assign(n, 0.0f);
    mo.host_v.assign(n, 0.0f);
  }
  return *moments_;
}

void ParallelGpt::refresh_host() {
  if (on_host() || !host_stale_) return;
  const size_t bytes = model_.num_params() * sizeof(float);
  dev_->to_host(host_params_.data(), model_.params(), bytes);
  if (moments_) {
    dev_->to_host(moments_->host_m.data(), moments_->m.data(), bytes);
    dev_->to_host(moments_->host_v.data(), moments_->v.data(), bytes);
  }
  host_stale_ = false;
}

void ParallelGpt::upload_host() {
  if (on_host()) return;
  const size_t bytes = model_.num_params() * sizeof(float);
  dev_->to_device(model_.params(), host_params_.data(), bytes);
  if (moments_) {
    dev_->to_device(moments_->m.data(), moments_->host_m.data(), bytes);
    dev_->to_device(moments_->v.data(), moments_->host_v.data(), bytes);
  }
  host_stale_ = false;  // device and host copies hold the same values again
}

double ParallelGpt::forward_backward(int M, const NextBatch& next, float dloss, StepTimes* times) {
  model_.zero_grad();
  const double loss = model_.forward_backward(M, next, dloss, times);
  model_.finish_grads(times);
  return loss;
}

bool ParallelGpt::moe_stats(double out[3]) {
  if (config_.moe.experts <= 0) return false;
  const MoeStats& s = model_.moe_stats();
  out[0] = static_cast<double>(s.assignments);
  out[1] = static_cast<double>(s.dropped);
  out[2] = s.aux_loss;
  return true;
}

double ParallelGpt::grad_norm(const float* grads) { return std::sqrt(model_.sum_squares_once(grads)); }

bool ParallelGpt::any(bool local) {
  if (world_.size() == 1) return local;
  std::vector<int32_t> all(static_cast<size_t>(world_.size()));
  const int32_t mine = local ? 1 : 0;
  world_.all_gather(&mine, all.data(), 1, comm::DType::kInt32);
  for (int32_t v : all) {
    if (v != 0) return true;
  }
  return false;
}

void ParallelGpt::update(float* params, const float* grads, float lr, float grad_scale) {
  if (on_host()) {
    adam_->update(params, grads, /*shard_layout=*/false, lr, grad_scale);
    return;
  }
  ++t_;
  Moments& mo = moments();
  for (const TensorSpan& s : spans_) {
    dev_->adamw_update(params + s.offset, grads + s.offset, mo.m.data() + s.offset, mo.v.data() + s.offset, s.count, lr,
                       hyper_.beta1, hyper_.beta2, hyper_.eps, s.decay ? hyper_.weight_decay : 0.0f, t_, grad_scale);
  }
  host_stale_ = true;  // state() refreshes the host copies (checkpoints), not every step
}

std::unique_ptr<DataParallel> parallel_gpt_data_parallel(comm::Communicator* dp, ParallelGpt& model,
                                                         const ModelGroups& groups, const TrainConfig& train,
                                                         ThreadPool& pool, DataParallelOptions options) {
  for (const ElementRange& r : model.model().count_once()) options.count_once.emplace_back(r.begin, r.end);
  options.norm_groups = {groups.tp, groups.pp};
  const AdamWHyper hyper{train.beta1, train.beta2, train.eps, static_cast<float>(train.weight_decay)};
  return std::make_unique<DataParallel>(dp, model.num_params(), local_tensor_spans(model.model().shape()), hyper, pool,
                                        options);
}

std::vector<float> ParallelGpt::gather_full(int dp_rank) {
  refresh_host();
  std::vector<float> full(num_parameters(config_), 0.0f);
  if (dp_rank == 0) {
    std::vector<ShardSlice> once;
    for (const ShardSlice& s : model_.shard_map()) {
      if (!s.tied_copy && (!s.tp_replicated || model_.shape().tp_rank == 0)) once.push_back(s);
    }
    copy_local_to_full(once, config_, host_params(), full.data());
  }
  world_.all_reduce(full.data(), full.size(), comm::DType::kFloat32, comm::ReduceOp::kSum);  // x + 0 = x exactly
  return full;
}

std::string ParallelGpt::describe() const {
  const StageShape& s = model_.shape();
  return "stage " + std::to_string(s.pp_rank) + "/" + std::to_string(s.pp_size) + " layers [" +
         std::to_string(s.layer_begin) + "," + std::to_string(s.layer_end) + ") tp " + std::to_string(s.tp_rank) + "/" +
         std::to_string(s.tp_size) + ", " + std::to_string(model_.num_params()) + " local params" +
         (model_.sequence_parallel() ? ", sequence parallel" : "") +
         (model_.cp_size() > 1 ? ", context parallel " + std::to_string(model_.cp_size()) : "");
}

}  // namespace railyard::worker::parallel
