#include "worker/train/trainer.h"

#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/log.h"
#include "worker/data/gpt2_bpe.h"
#include "worker/data/tokenizer.h"
#include "worker/device/cpu_kernels.h"
#include "worker/model/gpt_decode.h"
#include "worker/train/train_metrics.h"

namespace railyard::worker {

namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// "3,1"
std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (int a : v) {
    if (!out.empty()) out += ',';
    out += std::to_string(a);
  }
  return out;
}

}  // namespace

namespace {
// Refuses what the CUDA trainer cannot run yet, before anything is allocated on the device.
Kernels<float>* check_device(Kernels<float>* device, GradSync* sync, ShardedModel* sharded) {
  // A tensor/pipeline-parallel model allocates on its own device: it must be the trainer's (null = the CPU).
  if (sharded != nullptr && sharded->device() != device)
    throw ConfigError(
        "the tensor/pipeline-parallel model was built for another device than the trainer's (a bug: give "
        "ParallelGpt the trainer's device)");
  if (device == nullptr || device->host_accessible()) return device;
  const std::string d = std::string("spec.device / --device ") + device_name(device->kind());
  if (sync != nullptr && !sync->device_buffers())
    throw ConfigError(d +
                      ": this gradient reduction works on host buffers only (it was built without the device: plain "
                      "data parallelism, ZeRO 1/2 and --deterministic on CUDA reduce device buffers over NCCL when "
                      "given DataParallelOptions::device, as railyard-worker does): use --device cpu");
  return device;
}
}  // namespace

Trainer::Trainer(const GptConfig& model, const TrainConfig& config, ThreadPool& pool, BatchSource& train,
                 BatchSource* val, GradSync* sync, ShardedModel* sharded, Kernels<float>* device)
    : gpt_((config.validate(model), model)),
      cfg_(config),
      pool_(pool),
      train_(train),
      val_(val),
      device_(check_device(device, sync, sharded)),
      // A sharded model replaces the built-in one: no full-size buffers on this rank.
      model_(sharded != nullptr
                 ? nullptr
                 : std::make_unique<Gpt<float>>(model, config.batch, config.seq_len, pool, config.recompute, device_)),
      sync_(sync),
      sharded_(sharded),
      inputs_(static_cast<size_t>(config.batch) * config.seq_len),
      targets_(static_cast<size_t>(config.batch) * config.seq_len) {
  schedule_ = LrSchedule{cfg_.lr, cfg_.warmup_steps, cfg_.steps, cfg_.min_lr_frac};
  if (sharded_ != nullptr) {
    sharded_->init_weights(cfg_.seed);
  } else if (cfg_.offload != OffloadMode::kNone) {
    if (sync_ != nullptr && sync_->zero_stage() > 0)
      throw ConfigError("--offload optimizer with --zero " + std::to_string(sync_->zero_stage()) +
                        ": the sharded ZeRO optimizer is not offloaded; use --offload with --zero 0, or ZeRO alone");
    // The grad norm: on the CPU the in-memory AdamW's kernels; off the host the device's (its grads are there).
    if (on_host()) host_kernels_ = std::make_unique<CpuKernels<float>>(pool);
    // Off the host the update thread moves each group through the device's side copies (worker/optim/offload.h).
    offload_ = std::make_unique<OffloadAdamW>(
        model, AdamWHyper{cfg_.beta1, cfg_.beta2, cfg_.eps, static_cast<float>(cfg_.weight_decay)},
        cfg_.offload_threads, device_);
    // The next forward waits for each parameter group's update just before it reads the group.
    model_->set_params_needed_hook([this](int group) { offload_->wait_group(group); });
  } else if (sync_ == nullptr || sync_->zero_stage() == 0) {
    opt_.emplace(model, AdamWHyper{cfg_.beta1, cfg_.beta2, cfg_.eps, static_cast<float>(cfg_.weight_decay)}, pool,
                 device_);
  }
  if (sharded_ != nullptr && cfg_.offload != OffloadMode::kNone)
    throw ConfigError(
        "--offload optimizer with --tp/--pp/--cp: only the plain and data-parallel model offloads; drop one");
  if (!cfg_.dp_split.empty()) {
    const int micro = cfg_.micro_steps(), dp = sync_ != nullptr ? sync_->size() : 1;
    const std::string list = join_ints(cfg_.dp_split);
    if (sync_ == nullptr || sharded_ != nullptr || sync_->deterministic())
      throw ConfigError("--dp-split " + list +
                        ": an uneven split needs plain data parallelism (--nproc N without --tp/--pp, not "
                        "--deterministic)");
    if (static_cast<int>(cfg_.dp_split.size()) != dp)
      throw ConfigError("--dp-split " + list + ": " + std::to_string(cfg_.dp_split.size()) +
                        " entries for dp=" + std::to_string(dp) + " replicas: give one count per replica");
    for (int a : cfg_.dp_split)
      if (a < 1) throw ConfigError("--dp-split " + list + ": every replica needs at least one micro-batch");
    if (std::accumulate(cfg_.dp_split.begin(), cfg_.dp_split.end(), 0) != micro)
      throw ConfigError("--dp-split " + list + ": the counts must sum to the " + std::to_string(micro) +
                        " micro-batches per step (--global-batch / (--batch * --seq))");
  }
  if (cfg_.cp > 1 &&
      (sharded_ == nullptr || sync_ == nullptr || sync_->size() % cfg_.cp != 0 || sync_->deterministic())) {
    throw ConfigError("--cp " + std::to_string(cfg_.cp) +
                      " needs the model-parallel model and a data-parallel group of dp x cp ranks (not deterministic)");
  }
  if (sync_ != nullptr) {
    const int micro = cfg_.micro_steps(), dp = sync_->size() / cfg_.cp;  // replicas (cp ranks share one)
    if (cfg_.dp_split.empty() && micro % dp != 0) {
      throw ConfigError("--global-batch: " + std::to_string(micro) + " micro-batches of batch*seq tokens per step " +
                        "do not divide over dp=" + std::to_string(dp) + " replicas: make it a multiple of " +
                        std::to_string(static_cast<int64_t>(dp) * cfg_.batch * cfg_.seq_len) + " tokens");
    }
    // Buckets start reducing while backward still runs (a no-op unless the step armed the reducer).
    if (sharded_ == nullptr) {
      model_->set_grad_ready_hook([this](size_t offset, size_t count) { sync_->grads_ready(offset, count); });
    } else {
      sharded_->set_grad_ready_hook([this](size_t offset, size_t count) { sync_->grads_ready(offset, count); });
    }
  }
  if (model_) model_->init_weights(cfg_.seed);
  if (!on_host() && model_) {
    host_params_ = AlignedBuffer<float>(model_->num_params());
    if (opt_) {  // ZeRO: the sync keeps host copies of its shard's moments
      host_m_ = AlignedBuffer<float>(model_->num_params());
      host_v_ = AlignedBuffer<float>(model_->num_params());
    }
    host_stale_ = true;  // the first state() downloads
  }
  peak_flops_ = cfg_.peak_flops;
  if (!cfg_.log_json.empty()) {
    json_ = std::make_unique<std::ofstream>(cfg_.log_json, std::ios::app);
    if (!*json_) throw ConfigError("--log-json " + cfg_.log_json + ": cannot open for writing");
  }
  pass_ = choose_pass();
  update_ = choose_update();
}

Gpt<float>& Trainer::model() {
  if (!model_) throw Error("Trainer::model(): a tensor/pipeline-parallel run has no full model on this rank");
  if (offload_) offload_->wait_all();  // the caller may read or write the parameters
  return *model_;
}

void Trainer::refresh_host_state() {
  const size_t bytes = model_->num_params() * sizeof(float);
  device_->to_host(host_params_.data(), model_->params(), bytes);
  if (opt_) {
    device_->to_host(host_m_.data(), opt_->m(), bytes);
    device_->to_host(host_v_.data(), opt_->v(), bytes);
  }
  host_stale_ = false;
}

void Trainer::load_params(const float* host) {
  model().copy_params_from_host(host);
  if (!on_host()) host_stale_ = true;
}

AdamW& Trainer::optimizer() {
  if (offload_) throw Error("Trainer::optimizer(): with --offload the AdamW state is on the host (state())");
  if (!opt_) throw Error("Trainer::optimizer(): under ZeRO the AdamW state is sharded in the GradSync");
  return *opt_;
}

MemoryBudget Trainer::memory_budget() const {
  MemoryBudget m = railyard::worker::memory_budget(gpt_, cfg_.batch, cfg_.seq_len, pool_.size(), cfg_.recompute);
  if (cfg_.offload != OffloadMode::kNone && sharded_ == nullptr) {
    m.adam = 0;
    m.host = offload_host_bytes(gpt_);
  }
  return m;
}

MemoryBudget Trainer::allocated_memory() const {
  if (!model_) throw Error("Trainer::allocated_memory(): the tensor/pipeline-parallel model is not counted here");
  MemoryBudget m;
  m.params = model_->num_params() * sizeof(float);
  m.grads = model_->num_params() * sizeof(float);
  m.activations = model_->activation_bytes();
  m.adam = opt_ ? 2 * opt_->size() * sizeof(float) : 0;
  m.host = offload_ ? offload_->host_bytes() : 0;
  return m;
}

void Trainer::add_global_moe_stats(const double local[3], int micro, StepResult& r,
                                   const std::vector<double>* leaf_aux) {
  // Drops and the load-balancing loss over the whole global batch, not this replica's share: sums over the
  // data-parallel ranks in rank order (the same bits everywhere). Collective: every rank of an MoE model calls it.
  const std::vector<double> all = sync_ != nullptr ? sync_->all_gather({local[0], local[1], local[2]})
                                                   : std::vector<double>{local[0], local[1], local[2]};
  double assigned = 0, dropped = 0, aux = 0;
  for (size_t i = 0; i + 2 < all.size(); i += 3) {
    assigned += all[i];
    dropped += all[i + 1];
    aux += all[i + 2];
  }
  aux /= micro;
  if (leaf_aux != nullptr && sync_ != nullptr) {
    // Deterministic mode: the loss of each virtual micro-batch, added in virtual order as one process adds them
    // (aux / micro, micro-batch by micro-batch), so the bits do not depend on D. A rank-by-rank sum of per-rank sums
    // associates differently at D = 2 x 2 leaves: ((a0+a1)+(a2+a3)) vs (((a0+a1)+a2)+a3).
    aux = 0;
    for (double a : sync_->all_gather(*leaf_aux)) aux += a / micro;
  }
  if (assigned > 0) {
    r.moe_aux_loss = aux;
    r.moe_dropped_fraction = dropped / assigned;
  }
}

// The step, once its paths are chosen (choose_pass, choose_update at construction): the forward and backward pass of
// this rank's micro-batches with the data-parallel reduction, the gradient norm, the skip decision every rank shares,
// the update, and the rates.
StepResult Trainer::step() {
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_seconds();
  StepResult r;
  r.step = step_;
  r.lr = schedule_.at(step_);
  if (offload_) offload_->take_wait_seconds();  // waits outside steps (validation, checkpoints) are not this step's
  const int micro = cfg_.micro_steps();
  switch (pass_) {
    case Pass::kStageDeterministic:
      pass_stage_deterministic(r, micro);
      break;
    case Pass::kStage:
      pass_stage(r, micro);
      break;
    case Pass::kSingle:
      pass_single(r, micro, t0);
      break;
    case Pass::kDeterministic:
      pass_deterministic(r, micro, t0);
      break;
    case Pass::kDataParallel:
      pass_data_parallel(r, micro, t0);
      break;
  }
  const auto t_opt = Clock::now();
  r.grad_norm = gradient_norm();
  if (any_rank_bad(r)) {
    r.skipped = true;
    ++bad_total_;
    ++bad_consecutive_;
  } else {
    bad_consecutive_ = 0;
    if (hooks_.before_update) hooks_.before_update();
    update(r);
  }
  if (sync_ != nullptr) {
    sync_->take_comm_seconds();  // the norm/flag gathers belong to the optimizer phase
    sync_->take_gather_seconds();
  }
  r.times.optimizer = seconds_since(t_opt);
  if (offload_) {
    // The forward's waits for the previous step's update: optimizer time the overlap did not hide.
    const double w = offload_->take_wait_seconds();
    r.times.compute -= w;
    r.times.optimizer += w;
  }
  ++step_;
  r.seconds = seconds_since(t0);
  r.cpu_seconds = process_cpu_seconds() - cpu0;
  measure_rates(r, micro);
  return r;
}

double Trainer::seconds_since(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// The slow-down test knob: stretch this micro-batch's forward + backward to slow_factor x its wall time.
void Trainer::slow_down(Clock::time_point since) const {
  if (cfg_.slow_factor <= 1) return;
  std::this_thread::sleep_for((Clock::now() - since) * (cfg_.slow_factor - 1));
}

Trainer::Pass Trainer::choose_pass() const {
  if (sharded_ != nullptr) return sync_ != nullptr && sync_->deterministic() ? Pass::kStageDeterministic : Pass::kStage;
  if (sync_ == nullptr) return Pass::kSingle;
  return sync_->deterministic() ? Pass::kDeterministic : Pass::kDataParallel;
}

Trainer::Update Trainer::choose_update() const {
  const bool zero = sync_ != nullptr && sync_->zero_stage() > 0;
  if (sharded_ != nullptr) return zero ? Update::kStageZero : Update::kStage;
  if (zero) return Update::kZero;
  return offload_ ? Update::kOffload : Update::kAdamW;
}

// Deterministic tp/pp: each of this replica's virtual micro-batches is one leaf, run through the pipeline alone
// (M = 1: no overlap of micro-batches, the price of a fixed summation order).
void Trainer::pass_stage_deterministic(StepResult& r, int micro) {
  double loss_sum = 0;
  const int A = micro / sync_->size(), first = sync_->rank() * A;
  std::vector<double> leaf_losses, leaf_aux;
  double moe_local[3] = {0, 0, 0};
  for (int v = 0; v < micro; ++v) {
    if (v < first || v >= first + A) {
      train_.next_batch(inputs_.data(), targets_.data());  // another replica's leaf
      continue;
    }
    leaf_losses.push_back(sharded_->forward_backward(
        1, [&](int32_t* in, int32_t* tgt) { train_.next_batch(in, tgt); }, 1.0f / static_cast<float>(micro), &r.times));
    sync_->add_leaf(sharded_->grads());
    if (double s[3]; sharded_->moe_stats(s)) {
      for (int i = 0; i < 3; ++i) moe_local[i] += s[i];
      leaf_aux.push_back(s[2]);
    } else {
      leaf_aux.push_back(0);
    }
  }
  if (gpt_.moe.experts > 0) add_global_moe_stats(moe_local, micro, r, &leaf_aux);
  const auto t_dp = Clock::now();
  sync_->finish(sharded_->grads());
  for (double l : sync_->all_gather(leaf_losses)) loss_sum += l;  // virtual order
  r.loss = loss_sum / micro;
  sync_->take_comm_seconds();
  r.times.dp_comm = seconds_since(t_dp);
}

// Tensor/pipeline parallel: the schedule runs this replica's A micro-batches; dp buckets are reduced as the last
// micro-batch's backward finishes them.
void Trainer::pass_stage(StepResult& r, int micro) {
  const int dp = sync_ != nullptr ? sync_->size() : 1, A = micro / (dp / cfg_.cp);  // cp ranks share a replica's
  if (sync_ != nullptr) sync_->arm(sharded_->grads());
  r.loss = sharded_->forward_backward(
      A, [&](int32_t* in, int32_t* tgt) { train_.next_batch(in, tgt); }, 1.0f / static_cast<float>(A), &r.times);
  // Mixture of experts: the replica's statistics (summed over its stages), then over the dp replicas.
  if (double s[3]; sharded_->moe_stats(s)) add_global_moe_stats(s, micro, r);
  if (sync_ != nullptr) {
    const auto t_dp = Clock::now();
    sync_->finish(sharded_->grads());
    double sum = 0;
    for (double l : sync_->all_gather({r.loss})) sum += l;
    r.loss = sum / dp;
    sync_->take_comm_seconds();
    r.times.dp_comm = seconds_since(t_dp);
  }
}

// One process: every micro-batch of the step, gradients accumulated.
void Trainer::pass_single(StepResult& r, int micro, Clock::time_point t0) {
  double loss_sum = 0;
  size_t moe_assigned = 0, moe_dropped = 0;
  double moe_aux = 0;
  for (int m = 0; m < micro; ++m) {
    train_.next_batch(inputs_.data(), targets_.data());
    const auto tm = Clock::now();
    loss_sum += model_->forward(inputs_.data(), targets_.data(), Gpt<float>::Mode::kTrain, 1.0f / micro);
    model_->backward(/*accumulate=*/m > 0);  // the first micro-batch overwrites: no zero_grad() pass
    slow_down(tm);
    moe_assigned += model_->moe_stats().assignments;
    moe_dropped += model_->moe_stats().dropped;
    moe_aux += model_->moe_stats().aux_loss / micro;
  }
  if (moe_assigned > 0) {
    r.moe_aux_loss = moe_aux;
    r.moe_dropped_fraction = static_cast<double>(moe_dropped) / static_cast<double>(moe_assigned);
  }
  r.loss = loss_sum / micro;
  r.times.compute = seconds_since(t0);
}

// Virtual micro-batch v of the job's sequence is a leaf of the fixed tree; this rank owns [r*A, (r+1)*A).
void Trainer::pass_deterministic(StepResult& r, int micro, Clock::time_point t0) {
  double loss_sum = 0;
  const int A = micro / sync_->size(), first = sync_->rank() * A;
  std::vector<double> leaf_losses, leaf_aux;
  double moe_local[3] = {0, 0, 0};
  for (int v = 0; v < micro; ++v) {
    train_.next_batch(inputs_.data(), targets_.data());
    if (v < first || v >= first + A) continue;
    const auto tm = Clock::now();
    leaf_losses.push_back(
        model_->forward(inputs_.data(), targets_.data(), Gpt<float>::Mode::kTrain, 1.0f / static_cast<float>(micro)));
    model_->backward(/*accumulate=*/false);
    slow_down(tm);
    sync_->add_leaf(model_->grads());
    moe_local[0] += static_cast<double>(model_->moe_stats().assignments);
    moe_local[1] += static_cast<double>(model_->moe_stats().dropped);
    moe_local[2] += model_->moe_stats().aux_loss;
    leaf_aux.push_back(model_->moe_stats().aux_loss);
  }
  if (gpt_.moe.experts > 0) add_global_moe_stats(moe_local, micro, r, &leaf_aux);
  r.times.compute = seconds_since(t0);
  sync_->finish(model_->grads());
  for (double l : sync_->all_gather(leaf_losses)) loss_sum += l;  // virtual order, whatever D is
  r.loss = loss_sum / micro;
  r.times.dp_comm = sync_->take_comm_seconds();
}

// Data parallel, even or uneven (--dp-split): the last micro-batch's backward hands its buckets to the reducer.
void Trainer::pass_data_parallel(StepResult& r, int micro, Clock::time_point t0) {
  double loss_sum = 0;
  const int D = sync_->size();
  const bool uneven = !cfg_.dp_split.empty();
  // Uneven: this replica owns the run [first, first + A) of the job's micro-batches (its loader yields all of them)
  // and scales its gradients by D/micro, so the group's average is the sum over all micro-batches / micro, the
  // single-process step whatever the split. Even: its own loader's A micro-batches, scaled 1/A (= D/micro).
  const int A = uneven ? cfg_.dp_split[sync_->rank()] : micro / D;
  const int first = uneven ? std::accumulate(cfg_.dp_split.begin(), cfg_.dp_split.begin() + sync_->rank(), 0) : 0;
  const float scale = uneven ? static_cast<float>(D) / static_cast<float>(micro) : 1.0f / static_cast<float>(A);
  double moe_local[3] = {0, 0, 0};  // assignments, dropped, aux loss summed over this replica's micro-batches
  for (int v = 0, m = 0; v < (uneven ? micro : A); ++v) {
    train_.next_batch(inputs_.data(), targets_.data());
    if (v < first || v >= first + A) continue;  // another replica's micro-batch (uneven only)
    const auto tm = Clock::now();
    loss_sum += model_->forward(inputs_.data(), targets_.data(), Gpt<float>::Mode::kTrain, scale);
    if (m == A - 1) sync_->arm(model_->grads());  // only the last micro-batch's backward communicates
    model_->backward(/*accumulate=*/m > 0);
    slow_down(tm);
    moe_local[0] += static_cast<double>(model_->moe_stats().assignments);
    moe_local[1] += static_cast<double>(model_->moe_stats().dropped);
    moe_local[2] += model_->moe_stats().aux_loss;
    ++m;
  }
  r.times.compute = seconds_since(t0);
  sync_->finish(model_->grads());
  double sum = 0;
  // Rank order: the same bits on every rank. Uneven: sums of losses, weighted by micro-batches.
  for (double l : sync_->all_gather({uneven ? loss_sum : loss_sum / A})) sum += l;
  r.loss = uneven ? sum / micro : sum / D;
  if (gpt_.moe.experts > 0) add_global_moe_stats(moe_local, micro, r);
  r.times.dp_comm = sync_->take_comm_seconds();
}

double Trainer::gradient_norm() {
  const bool zero = update_ == Update::kStageZero || update_ == Update::kZero;
  if (sharded_ != nullptr) return zero ? sync_->grad_norm(sharded_->grads()) : sharded_->grad_norm(sharded_->grads());
  // Expert-parallel storage: replicas hold different experts, so the sync adds the parts (owns_grad_norm).
  if (zero || (sync_ != nullptr && sync_->owns_grad_norm())) return sync_->grad_norm(model_->grads());
  return offload_ ? offload_norm_kernels()->global_norm(model_->grads(), model_->num_params())
                  : opt_->global_norm(model_->grads());
}

// Non-finite loss or gradient norm on any rank: every rank skips the update together.
bool Trainer::any_rank_bad(const StepResult& r) {
  bool bad = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (sharded_ != nullptr) {
    bad = sharded_->any(bad);  // over the whole world: tp/pp peers and dp replicas take the same branch
  } else if (sync_ != nullptr && sync_->size() > 1) {
    // Every replica must take the same branch, or the next collective pairs up wrong calls.
    bad = false;
    for (double f : sync_->all_gather({std::isfinite(r.loss) && std::isfinite(r.grad_norm) ? 0.0 : 1.0})) {
      bad = bad || f != 0;
    }
  }
  return bad;
}

// AdamW on this rank's parameters, through the path chosen at construction.
void Trainer::update(const StepResult& r) {
  const float lr = static_cast<float>(r.lr), scale = clip_factor(r.grad_norm, cfg_.grad_clip);
  switch (update_) {
    case Update::kStageZero:
      sync_->update(sharded_->params(), sharded_->grads(), lr, scale);  // own pieces, then all-gather over dp
      sharded_->params_changed();  // off the host: state() refreshes its parameter copy (a no-op on the CPU)
      break;
    case Update::kStage:
      sharded_->update(sharded_->params(), sharded_->grads(), lr, scale);
      break;
    case Update::kZero:
      sync_->update(model_->params(), model_->grads(), lr, scale);
      break;
    case Update::kOffload:
      // Off the host the update thread's side copies are not ordered after the compute stream: every kernel that
      // wrote the gradients or reads the parameters must be done first (on CUDA the norm's read already waited).
      if (!on_host()) device_->synchronize();
      offload_->start(model_->params(), model_->grads(), lr, scale);  // runs on while the next forward starts
      break;
    case Update::kAdamW:
      opt_->update(model_->params(), model_->grads(), lr, scale);
      break;
  }
  // The host copies are refreshed only when state() is asked for them (checkpoint, export): on CUDA that is
  // 3 x 4 bytes x params of device->host traffic saved on every other step. (A sharded model and ZeRO's sync keep
  // their own flags; state() asks them to refresh.)
  if (!on_host() && model_) host_stale_ = true;
}

// Tokens, FLOP/s and MFU of the step that took r.seconds.
void Trainer::measure_rates(StepResult& r, int micro) {
  // Tokens of the whole job's step: with data parallelism every replica reports the global rate.
  const double tokens = static_cast<double>(micro) * cfg_.batch * cfg_.seq_len;
  r.tokens_per_second = tokens / r.seconds;
  r.flops_per_second = r.tokens_per_second * flops_per_token(gpt_, cfg_.seq_len);
  const double per_process = r.flops_per_second / std::max(1, cfg_.world_size);
  if (cfg_.peak_flops <= 0 && peak_flops_ > 0 && per_process > peak_flops_) {
    // The GEMM rate measured at start was disturbed (a busy machine): a step cannot beat its own GEMMs, so the best
    // rate seen since is the better reference. Said once, so a reader knows the early MFU values were too high.
    if (!peak_raised_)
      log::warn("worker", "raising the measured GEMM-rate reference of MFU to a faster step's rate",
                {{"measured", fmt("%.4g", peak_flops_)}, {"step_rate", fmt("%.4g", per_process)}});
    peak_raised_ = true;
    peak_flops_ = per_process;
  }
  r.mfu = peak_flops_ > 0 ? per_process / peak_flops_ : 0;
}

double Trainer::validate() {
  if (val_ == nullptr) throw Error("validate(): no validation data was given");
  val_->reset();
  if (sharded_ != nullptr) {
    return sharded_->evaluate(cfg_.val_steps, [&](int32_t* in, int32_t* tgt) { val_->next_batch(in, tgt); });
  }
  double sum = 0;
  for (int i = 0; i < cfg_.val_steps; ++i) {
    val_->next_batch(inputs_.data(), targets_.data());
    sum += model_->forward(inputs_.data(), targets_.data(), Gpt<float>::Mode::kEval);
  }
  return sum / cfg_.val_steps;
}

void Trainer::log_step(const StepResult& r) {
  if (metrics_ != nullptr) metrics_->on_step(r, cfg_.steps);
  if (r.skipped) {
    log::warn("worker", "non-finite loss or gradient norm: update skipped",
              {{"step", std::to_string(r.step)},
               {"loss", fmt("%.6g", r.loss)},
               {"grad_norm", fmt("%.6g", r.grad_norm)},
               {"bad_steps_total", std::to_string(bad_total_)},
               {"bad_steps_consecutive", std::to_string(bad_consecutive_)}});
  }
  if (!cfg_.quiet) {
    log::info("worker", "step",
              {{"step", std::to_string(r.step + 1) + "/" + std::to_string(cfg_.steps)},
               {"loss", fmt("%.6f", r.loss)},
               {"lr", fmt("%.4e", r.lr)},
               {"grad_norm", fmt("%.4f", r.grad_norm)},
               {"tok_per_s", fmt("%.1f", r.tokens_per_second)},
               {"step_ms", fmt("%.1f", r.seconds * 1e3)},
               {"flops_per_s", fmt("%.4g", r.flops_per_second)},
               {"mfu", fmt("%.3f", r.mfu)},
               // compute/tp-comm/pp-wait/dp-comm/optimizer (docs/parallel.md "Running it")
               {"split_ms", fmt("%.1f", r.times.compute * 1e3) + "/" + fmt("%.1f", r.times.tp_comm * 1e3) + "/" +
                                fmt("%.1f", r.times.pp_wait * 1e3) + "/" + fmt("%.1f", r.times.dp_comm * 1e3) + "/" +
                                fmt("%.1f", r.times.optimizer * 1e3)}});
    if (gpt_.moe.experts > 0) {
      log::info("worker", "moe",
                {{"step", std::to_string(r.step + 1)},
                 {"aux_loss", fmt("%.6f", r.moe_aux_loss)},
                 {"dropped_fraction", fmt("%.4f", r.moe_dropped_fraction)}});
    }
  }
  if (!cfg_.progress_file.empty() && std::isfinite(r.loss)) {
    // The agent forwards this file to the rendezvous service (docs/rendezvous.md); a failed write must not stop
    // training, so it is logged and dropped.
    try {
      nlohmann::json record = {{"step", r.step + 1}, {"loss", r.loss}, {"tokens_per_second", r.tokens_per_second}};
      if (hooks_.progress_extras) hooks_.progress_extras(record);
      // With metrics, pauses are marked (set_metrics): "paused" tells the agent's hang watch that this rank says so.
      if (metrics_ != nullptr) record["paused"] = false;
      std::lock_guard<std::mutex> lock(progress_mu_);
      last_progress_ = record.dump();
      write_file_atomic(cfg_.progress_file, last_progress_);
    } catch (const std::exception& e) {
      log::warn("worker", "cannot write the progress file", {{"path", cfg_.progress_file}, {"error", e.what()}});
    }
  }
  if (json_) {
    nlohmann::json j = {{"event", "step"},
                        {"step", r.step + 1},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"grad_norm", r.grad_norm},
                        {"skipped", r.skipped},
                        {"step_ms", r.seconds * 1e3},
                        {"cpu_ms", r.cpu_seconds * 1e3},
                        {"tokens_per_s", r.tokens_per_second},
                        {"flops_per_s", r.flops_per_second},
                        {"mfu", r.mfu},
                        {"compute_ms", r.times.compute * 1e3},
                        {"tp_comm_ms", r.times.tp_comm * 1e3},
                        {"pp_wait_ms", r.times.pp_wait * 1e3},
                        {"dp_comm_ms", r.times.dp_comm * 1e3},
                        {"optimizer_ms", r.times.optimizer * 1e3}};
    if (!std::isfinite(r.loss)) j["loss"] = nullptr;
    if (!std::isfinite(r.grad_norm)) j["grad_norm"] = nullptr;
    if (gpt_.moe.experts > 0) {
      j["moe_aux_loss"] = r.moe_aux_loss;
      j["moe_dropped_fraction"] = r.moe_dropped_fraction;
    }
    *json_ << j.dump() << '\n';
    json_->flush();
  }
}

int Trainer::run() {
  const MemoryBudget mem = memory_budget();
  if (peak_flops_ <= 0 && !on_host()) {
    // The CPU GEMM rate says nothing about a GPU: MFU stays 0 unless --peak-flops gives the device's peak.
    log::warn("worker", "no --peak-flops for this device: MFU is reported as 0",
              {{"device", device_name(device_kind())}});
  } else if (peak_flops_ <= 0) {
    // The gradient buffer is free until the first step zeroes it: borrow it so the measurement costs no memory.
    peak_flops_ = measure_gemm_rate(pool_, gpt_, cfg_.batch, cfg_.seq_len, 3, model_ ? model_->grads() : nullptr,
                                    model_ ? model_->num_params() : 0);
    if (model_) model_->zero_grad();
  }
  log::info("worker", "model",
            {{"shape", describe(gpt_)},
             {"device", device_name(device_kind())},
             {"threads", std::to_string(pool_.size())},
             {"recompute", describe(cfg_.recompute)}});
  if (sync_ != nullptr || !layout_.empty()) {
    log::info("worker", "layout",
              {{"groups", layout_.empty() ? "single process" : layout_},
               {"data_parallel", sync_ != nullptr ? sync_->describe() : "dp=1"}});
  }
  log::info("worker", "memory budget",
            {{"params_bytes", std::to_string(mem.params)},
             {"grads_bytes", std::to_string(mem.grads)},
             {"adamw_m_v_bytes", std::to_string(mem.adam)},
             {"activations_bytes", std::to_string(mem.activations)},
             {"total_bytes", std::to_string(mem.total())},
             {"offload", to_string(cfg_.offload)},
             {"host_bytes", std::to_string(mem.host)}});
  log::info(
      "worker", "training",
      {{"steps", std::to_string(cfg_.steps)},
       {"micro_batch", std::to_string(cfg_.batch)},
       {"seq", std::to_string(cfg_.seq_len)},
       {"micro_steps", std::to_string(cfg_.micro_steps())},
       {"dp_split", cfg_.dp_split.empty() ? std::string("even") : join_ints(cfg_.dp_split)},
       {"global_batch_tokens", std::to_string(static_cast<int64_t>(cfg_.micro_steps()) * cfg_.batch * cfg_.seq_len)},
       {"flops_per_token", fmt("%.6g", flops_per_token(gpt_, cfg_.seq_len))},
       {"peak_flops", fmt("%.4g", peak_flops_)},
       {"peak_source", cfg_.peak_flops > 0 ? "flag" : "measured_gemm_rate"}});
  auto do_val = [&](int64_t s) {
    const double v = [&] {
      TrainMetrics::Pause pause(metrics_);
      return validate();
    }();
    val_history_.emplace_back(s, v);
    if (metrics_ != nullptr) metrics_->on_validation(v);
    log::info("worker", "validation", {{"step", std::to_string(s)}, {"val_loss", fmt("%.6f", v)}});
    if (json_) *json_ << nlohmann::json{{"event", "validation"}, {"step", s}, {"val_loss", v}}.dump() << std::endl;
  };
  if (val_ != nullptr && cfg_.val_every > 0) do_val(0);
  while (step_ < cfg_.steps) {
    const StepResult r = step();
    // The hook runs before the step is reported (log, metrics, progress file): a step counts as done for the operator
    // only once the checkpointer's in-memory snapshot of it exists on every rank (docs/checkpointing.md).
    std::optional<int> rc;
    const bool give_up = bad_consecutive_ >= cfg_.max_bad_steps;
    // Not a pause as a whole: the hook's per-step agreement of the ranks is a collective, and a peer that hangs must
    // show there as a stall. The checkpointer pauses around a synchronous save itself (a save can take many step
    // times).
    if (hooks_.after_step && !give_up) rc = hooks_.after_step(r);
    log_step(r);
    if (give_up) {
      log::error("worker", "too many consecutive non-finite steps: stopping",
                 {{"consecutive", std::to_string(bad_consecutive_)},
                  {"limit", std::to_string(cfg_.max_bad_steps)},
                  {"hint", "lower --lr, raise --warmup or set --grad-clip"}});
      return 3;
    }
    if (rc) return *rc;
    if (val_ != nullptr && cfg_.val_every > 0 && (step_ % cfg_.val_every == 0 || step_ == cfg_.steps)) do_val(step_);
    if (cfg_.sample_every > 0 && (step_ % cfg_.sample_every == 0 || step_ == cfg_.steps)) {
      const Sample smp = [&] {
        TrainMetrics::Pause pause(metrics_);
        return sample(step_);
      }();
      log::info("worker", "sample", {{"step", std::to_string(step_)}, {"text", smp.text}});
      if (json_) {
        *json_
            << nlohmann::json{{"event", "sample"}, {"step", step_}, {"tokens", smp.tokens}, {"text", smp.text}}.dump()
            << std::endl;
      }
    }
  }
  return 0;
}

Trainer::Sample Trainer::sample(int64_t step) {
  if (sharded_ != nullptr)
    throw ConfigError("--sample-every needs the whole model in this process: not with --tp/--pp");
  // state() gives host parameters on every device and waits for an offloaded update still writing them.
  const TrainerState st = state();
  GptDecoder dec(gpt_, st.params, pool_);
  SampleRng rng(cfg_.seed ^ (0x5a3c0ffeeULL + static_cast<uint64_t>(step)));
  // Start where llm.c's samples start for GPT-2 (<|endoftext|>, the last token of its vocabulary), a newline for
  // bytes, token 0 otherwise.
  const int V = gpt_.vocab_size;
  const int32_t start = V == kByteVocabSize ? '\n' : V == kGpt2VocabSize ? kGpt2EndOfText : 0;
  Sample out;
  const float* logits = dec.append(start);
  for (int k = 0; k < cfg_.sample_tokens; ++k) {
    out.tokens.push_back(sample_token(logits, V, SamplingOptions{}, rng));
    if (k + 1 < cfg_.sample_tokens) logits = dec.append(out.tokens.back());
  }
  if (V == kByteVocabSize) {
    out.text = escape_for_terminal(byte_decode(out.tokens.data(), out.tokens.size()));
  } else if (V == kGpt2VocabSize) {
    // Decoded where GPT-2's vocabulary is found ($RAILYARD_GPT2_DIR or the fetch script's cache); else ids only.
    static const std::optional<Gpt2Vocab> vocab = []() -> std::optional<Gpt2Vocab> {
      try {
        return Gpt2Vocab::load(default_gpt2_vocab_dir());
      } catch (const ConfigError&) {
        return std::nullopt;
      }
    }();
    if (vocab) out.text = escape_for_terminal(Gpt2Tokenizer(*vocab).decode(out.tokens.data(), out.tokens.size()));
  }
  return out;
}

TrainerState Trainer::state() {
  TrainerState s;
  s.step = step_;
  // ZeRO (with or without tp/pp) counts AdamW steps in the GradSync, which runs the update.
  const bool zero = sync_ != nullptr && sync_->zero_stage() > 0;
  if (offload_) offload_->wait_all();  // the caller reads (or a restore writes) params and the host moments
  s.adam_t = opt_ ? opt_->t() : offload_ ? offload_->t() : zero ? sync_->adam_t() : sharded_->adam_t();
  s.bad_steps_total = bad_total_;
  s.bad_steps_consecutive = bad_consecutive_;
  s.seed = cfg_.seed;
  // Off the host, the sharded model's and ZeRO's host copies are downloaded here if an update happened since the
  // last call (no-ops on the CPU), by the same rule as the built-in model's below.
  if (sharded_ != nullptr) sharded_->refresh_host();
  if (zero) sync_->refresh_host();
  s.params = sharded_ != nullptr ? sharded_->host_params() : model_->params();  // sharded: this rank's local buffer
  s.adam_m = opt_ ? opt_->m() : offload_ ? offload_->m() : nullptr;
  s.adam_v = opt_ ? opt_->v() : offload_ ? offload_->v() : nullptr;
  if (!on_host() && model_) {
    // Only after an update since the last call. Safe against the checkpointer's background snapshot of the previous
    // copies: it is joined before every update (before_update), and without an update there is nothing to copy.
    if (host_stale_) refresh_host_state();
    s.params = host_params_.data();
    if (opt_) {
      s.adam_m = host_m_.data();
      s.adam_v = host_v_.data();
    }
  }
  s.num_params = sharded_ != nullptr ? sharded_->num_params() : model_->num_params();
  s.loader = train_.loader_state();
  return s;
}

void Trainer::reinit_weights() {
  if (offload_) offload_->wait_all();
  if (sharded_ != nullptr) {
    sharded_->init_weights(cfg_.seed);
  } else {
    model_->init_weights(cfg_.seed);
    if (!on_host()) host_stale_ = true;
  }
}

void Trainer::restore_counters(const TrainerState& s) {
  if (offload_) offload_->wait_all();  // the upload below must not race an update still writing the parameters
  step_ = s.step;
  if (opt_) {
    opt_->set_t(s.adam_t);
  } else if (offload_) {
    offload_->set_t(s.adam_t);
  } else {
    if (sharded_ != nullptr) sharded_->set_adam_t(s.adam_t);
    if (sync_ != nullptr) sync_->set_adam_t(s.adam_t);  // a no-op without ZeRO
  }
  bad_total_ = s.bad_steps_total;
  bad_consecutive_ = s.bad_steps_consecutive;
  if (s.loader) train_.restore_loader(*s.loader);
  if (sharded_ != nullptr) sharded_->upload_host();  // a no-op on the CPU
  if (sync_ != nullptr) sync_->upload_host();        // ZeRO-1 on device buffers: the shard's moments
  if (!on_host() && model_) {
    // The checkpoint was loaded into state()'s host copies: upload them.
    const size_t bytes = model_->num_params() * sizeof(float);
    device_->to_device(model_->params(), host_params_.data(), bytes);
    if (opt_) {
      device_->to_device(opt_->m(), host_m_.data(), bytes);
      device_->to_device(opt_->v(), host_v_.data(), bytes);
    }
    host_stale_ = false;  // device and host copies hold the same values again
  }
}

void Trainer::set_metrics(TrainMetrics* m) {
  metrics_ = m;
  if (m != nullptr && !cfg_.progress_file.empty()) m->set_pause_listener([this](bool paused) { mark_pause(paused); });
}

// The last step's record again, with "paused": the agent sees the file change (a pause mark, its end counts as
// progress) and whether the rank is in a pass that completes no step. Nothing before the first step: the agent counts
// no stall before it has step times.
void Trainer::mark_pause(bool paused) {
  std::lock_guard<std::mutex> lock(progress_mu_);
  if (last_progress_.empty()) return;
  nlohmann::json record = nlohmann::json::parse(last_progress_, nullptr, false);
  if (!record.is_object()) return;
  record["paused"] = paused;
  try {
    write_file_atomic(cfg_.progress_file, record.dump());
  } catch (const std::exception& e) {
    log::warn("worker", "cannot mark a pause in the progress file",
              {{"path", cfg_.progress_file}, {"error", e.what()}});
  }
}

}  // namespace railyard::worker
