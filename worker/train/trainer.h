// The single-process training loop: micro-batches with gradient accumulation, global-norm clipping, AdamW with
// warmup + cosine LR, periodic validation, NaN/Inf detection, and one log line per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker/data/data_loader.h"
#include "worker/device/cpu_kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/optim/adamw.h"
#include "worker/optim/offload.h"
#include "worker/optim/train_config.h"
#include "worker/parallel/grad_sync.h"
#include "worker/parallel/sharded_model.h"
#include "worker/parallel/step_times.h"
#include "worker/train/perf.h"
#include "worker/train/step_result.h"

namespace railyard::worker {

// Where batches come from. The data helper's DataLoader fits through LoaderBatchSource (loader_source.h);
// tests may feed in-memory tokens.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // B*T inputs and the B*T next tokens as targets, row-major (B, T).
  virtual void next_batch(int32_t* inputs, int32_t* targets) = 0;
  // Back to the first batch (validation starts from the same batches every time).
  virtual void reset() {}
  // The position in the data, for checkpoints; sources without one (in-memory test data) return nullopt.
  virtual std::optional<LoaderState> loader_state() const { return std::nullopt; }
  virtual void restore_loader(const LoaderState&) {}
};

// What a checkpoint needs besides the loader's own state (which the BatchSource owner keeps): views of the flat
// buffers plus the counters. There is no training-time RNG (no dropout); the seed only fixes the initial weights.
struct TrainerState {
  int64_t step = 0;    // steps taken (including skipped ones)
  int64_t adam_t = 0;  // updates applied
  int64_t bad_steps_total = 0;
  int64_t bad_steps_consecutive = 0;
  uint64_t seed = 0;
  float* params = nullptr;  // num_params each, gpt_config.h order
  // AdamW moments; null under ZeRO (each rank then holds only its shard: GradSync::shard_m/shard_v/shard_size).
  float* adam_m = nullptr;
  float* adam_v = nullptr;
  size_t num_params = 0;
  std::optional<LoaderState> loader;  // the training source's position, when it has one
};

class TrainMetrics;

// Optional callbacks (worker/train/checkpointing.h): before_update runs in step() just before the optimizer writes
// params and AdamW state (a background snapshot of them must be complete by then); after_step runs in run() after
// each step, before the step is logged and reported, and an exit code it returns ends run() with that code (e.g.
// after the SIGTERM save).
struct TrainerHooks {
  std::function<void()> before_update;
  std::function<std::optional<int>(const StepResult&)> after_step;
  // Adds to each progress record (the agent forwards it to the rendezvous service): the checkpointer's cumulative
  // checkpoint_stall_seconds and restore_seconds, which the operator's goodput ledger splits out.
  std::function<void(nlohmann::json&)> progress_extras;
};

class Trainer {
 public:
  // sync: the data-parallel group's reduction (worker/parallel/data_parallel.h), or null for one process. With it,
  // TrainConfig's global batch is the whole job's: each of the D replicas runs micro_steps()/D micro-batches from
  // its own `train` source (a DataLoader built with the dp rank and size). In deterministic mode every replica's
  // `train` must instead yield the job's whole sequence of micro-batches (a DataLoader with rank 0 of world 1): rank
  // r computes virtual micro-batches [r*A, (r+1)*A) and skips the others, so each leaf's data does not depend on D.
  // Under ZeRO (sync->zero_stage() > 0) the optimizer state lives in `sync`, sharded; optimizer() must not be used.
  //
  // sharded: a tensor/pipeline-parallel model (worker/parallel/dist_model.h) trained instead of the built-in Gpt<float>
  // (which is then not allocated at all: model() throws). Every
  // rank of a replica reads the replica's micro-batches; `sync` (if any) reduces over the dp group (ZeRO: `sync` also
  // owns the sharded optimizer and the count-once norm). Deterministic mode runs each virtual micro-batch through the
  // pipeline alone.
  //
  // device: where the built-in model and AdamW live and run (worker/device/kernels.h); null = the CPU on `pool`. On a
  // device that is not the host (CUDA), state() points to host copies, refreshed by state() itself when an update
  // happened since the last call (so only checkpoint and export steps pay the device->host copy), and
  // restore_counters() uploads them, so checkpoints and exports see host memory. The sharded model's host copies
  // (ShardedModel::refresh_host) and ZeRO's shard moments (GradSync::refresh_host) follow the same rule. Data
  // parallelism across processes runs there when `sync` reduces device buffers (DataParallel with a StreamReducer, ZeRO
  // 1/2 or the deterministic tree with the device), also for sharded (tp/pp) models; a sync built for host buffers is
  // refused (ConfigError).
  Trainer(const GptConfig& model, const TrainConfig& config, ThreadPool& pool, BatchSource& train,
          BatchSource* val = nullptr, GradSync* sync = nullptr, ShardedModel* sharded = nullptr,
          Kernels<float>* device = nullptr);

  // The built-in model; with a sharded model there is none (throws). Its buffers are device memory.
  Gpt<float>& model();
  // The initial weights again (the built-in or the sharded model's), e.g. after a failed restore wrote into them.
  void reinit_weights();
  // Writes the built-in model's parameters from a host array (e.g. --init-from), keeping state()'s copies in step.
  void load_params(const float* host);
  DeviceKind device_kind() const { return device_ != nullptr ? device_->kind() : DeviceKind::kCpu; }
  AdamW& optimizer();
  const TrainConfig& config() const { return cfg_; }

  // One optimizer step over micro_steps() micro-batches.
  StepResult step();
  // Mean loss over val_steps batches of the validation source (reset first).
  double validate();
  // One text sample from the current parameters (TrainConfig::sample_every): the tokens drawn and their text.
  struct Sample {
    std::vector<int32_t> tokens;
    std::string text;  // bytes, or GPT-2's when its vocabulary files are found; else empty
  };
  Sample sample(int64_t step);
  // The whole loop with logging. Returns 0, or 3 after max_bad_steps consecutive non-finite steps.
  int run();

  TrainerState state();
  // Restores counters and the loader position from a checkpoint (the buffers are written through state()'s
  // pointers).
  void restore_counters(const TrainerState& s);

  // Optional: every step and validation is also published as Prometheus series (train_metrics.h).
  // Also marks the progress file while a Pause lives ("paused": the pod agent's hang watch counts no stall then).
  void set_metrics(TrainMetrics* m);
  TrainMetrics* metrics() const { return metrics_; }  // null when none was set
  void set_hooks(TrainerHooks h) { hooks_ = std::move(h); }
  // The process-group layout (ProcessGroups::describe()) for the line run() logs at start.
  void set_layout(std::string description) { layout_ = std::move(description); }

  // The model's memory by arena: params, grads, activations and (in memory) AdamW m, v on the device; with offload
  // the moments and the copy staging in `host`. memory_budget() is the formula; allocated_memory() adds up the
  // buffers this trainer actually holds.
  MemoryBudget memory_budget() const;
  MemoryBudget allocated_memory() const;
  double peak_flops() const { return peak_flops_; }
  // Losses of the validations run() performed, as (step, loss).
  const std::vector<std::pair<int64_t, double>>& val_history() const { return val_history_; }

 private:
  using Clock = std::chrono::steady_clock;
  // The step's forward and backward pass and its update, each chosen once at construction from the layout: a
  // tensor/pipeline stage (deterministic or not), one process, the deterministic tree, or data parallelism (even or
  // --dp-split); AdamW through the stage, ZeRO's sync, the offload thread or in memory.
  enum class Pass { kStageDeterministic, kStage, kSingle, kDeterministic, kDataParallel };
  enum class Update { kStageZero, kStage, kZero, kOffload, kAdamW };
  Pass choose_pass() const;
  Update choose_update() const;
  // Each pass leaves r.loss (the step's mean over the whole job), the gradients reduced over dp, and its times.
  void pass_stage_deterministic(StepResult& r, int micro);
  void pass_stage(StepResult& r, int micro);
  void pass_single(StepResult& r, int micro, Clock::time_point t0);
  void pass_deterministic(StepResult& r, int micro, Clock::time_point t0);
  void pass_data_parallel(StepResult& r, int micro, Clock::time_point t0);
  double gradient_norm();
  bool any_rank_bad(const StepResult& r);  // collective: every rank gets the same answer
  void update(const StepResult& r);
  void measure_rates(StepResult& r, int micro);
  static double seconds_since(Clock::time_point a);
  void slow_down(Clock::time_point since) const;
  // Data parallel: the step's MoE drop fraction and load-balancing loss over all replicas (collective over dp).
  // `leaf_aux` (deterministic mode): this rank's per-leaf load-balancing losses, summed in virtual order.
  void add_global_moe_stats(const double local[3], int micro, StepResult& r,
                            const std::vector<double>* leaf_aux = nullptr);
  void log_step(const StepResult& r);
  bool on_host() const { return device_ == nullptr || device_->host_accessible(); }
  // Device -> host copies of params and AdamW m, v (devices that are not the host).
  void refresh_host_state();
  // Whose global_norm the offload path uses: the host's kernels on the CPU, the device's off it (the grads live there).
  Kernels<float>* offload_norm_kernels() { return on_host() ? host_kernels_.get() : device_; }

  GptConfig gpt_;
  TrainConfig cfg_;
  ThreadPool& pool_;
  BatchSource& train_;
  BatchSource* val_;
  Kernels<float>* device_ = nullptr;   // null: the CPU
  std::unique_ptr<Gpt<float>> model_;  // null with a sharded model
  GradSync* sync_ = nullptr;
  ShardedModel* sharded_ = nullptr;
  std::optional<AdamW> opt_;                            // absent under ZeRO and with offload
  std::unique_ptr<CpuKernels<float>> host_kernels_;     // the CPU offload path's grad norm (the in-memory AdamW's)
  AlignedBuffer<float> host_params_, host_m_, host_v_;  // state()'s host copies when the device is not the host
  bool host_stale_ = false;                             // the device changed since the copies were last refreshed
  LrSchedule schedule_;
  AlignedBuffer<int32_t> inputs_, targets_;
  int64_t step_ = 0;
  int64_t bad_total_ = 0, bad_consecutive_ = 0;
  double peak_flops_ = 0;
  bool peak_raised_ = false;
  std::vector<std::pair<int64_t, double>> val_history_;
  std::unique_ptr<std::ofstream> json_;
  TrainMetrics* metrics_ = nullptr;
  // The last progress record written (JSON text), rewritten with "paused" at a pause's start and end (mark_pause).
  std::string last_progress_;
  std::mutex progress_mu_;
  void mark_pause(bool paused);
  TrainerHooks hooks_;
  std::string layout_;
  Pass pass_ = Pass::kSingle;
  Update update_ = Update::kAdamW;
  // Last member: destroyed first, so its thread stops before the model buffers it writes go away.
  std::unique_ptr<OffloadAdamW> offload_;
};

}  // namespace railyard::worker
