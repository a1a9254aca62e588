// The stages of `railyard-worker train` before the first step, each from the options (train_options.h): the device,
// the model, the recipe, the shards, the memory check. Each throws ConfigError (exit 2) naming the flag, or the
// TrainingJob field the value came from.
#pragma once

#include <string>

#include "worker/cmd/train_options.h"
#include "worker/device/cuda_module.h"
#include "worker/device/device.h"
#include "worker/model/gpt_config.h"
#include "worker/train/trainer.h"

namespace railyard::worker {

// --device / spec.device resolved on this machine, with the CUDA module when it runs on CUDA (loaded only then).
struct DeviceChoice {
  DeviceKind kind = DeviceKind::kCpu;
  int visible_gpus = 0;
  CudaModule* cuda = nullptr;
};
DeviceChoice choose_device(const TrainOptions& o);

// --model, or the shape of --init-from (checked against --model / spec.model), and --moe-*.
GptConfig model_config(const TrainOptions& o);

// The recipe and the trainer's switches (--steps ... --offload-threads, --dp-split, --slow-ranks,
// RAILYARD_PROGRESS_FILE), validated against the model.
TrainConfig train_config(const TrainOptions& o, const GptConfig& cfg);

// The shards: --data / spec.data.train and --val-data / spec.data.val are globs (a directory means its train_*.bin /
// val_*.bin); validation defaults to val_*.bin beside the training shards. Both must match something (validation only
// when it runs); logged.
struct ShardGlobs {
  std::string train, val;
};
ShardGlobs shard_globs(const TrainOptions& o, const TrainConfig& tc);

// Refuses, before anything is allocated, a model whose training state does not fit in this machine's memory.
void check_memory_budget(const GptConfig& cfg, const TrainConfig& tc, const TrainOptions& o);

// The memory a rank may count on, and where that figure comes from: the container's memory limit (cgroup v2
// memory.max, or v1 memory.limit_in_bytes) shared by the pod's local_ranks processes, else the machine's memory.
struct MemoryRoom {
  double bytes = 0;    // for one rank
  std::string what;    // "the container's memory limit of 2.00 GiB shared by 2 local ranks", "the machine's 23.4 GiB"
  bool limit = false;  // from the container's limit
};
// Pure: cgroup_max is the limit file's text ("max", a byte count, or "" when unreadable); phys the machine's bytes.
MemoryRoom memory_room(const std::string& cgroup_max, double phys, int local_ranks);

}  // namespace railyard::worker
