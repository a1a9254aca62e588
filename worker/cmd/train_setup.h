// The stages of `railyard-worker train` before the first step, each from the flags (the command line, completed by the
// worker configuration, config_file.h): the device, the model, the recipe, the shards, the memory check. Each throws
// ConfigError (exit 2) naming the flag, or the TrainingJob field the value came from.
#pragma once

#include <string>

#include "worker/cmd/config_file.h"
#include "worker/cmd/flags.h"
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
DeviceChoice choose_device(const Flags& f);

// --model, or the shape of --init-from (checked against --model / spec.model), and --moe-*.
GptConfig model_config(const Flags& f, const ConfigOrigins& origins);

// The recipe and the trainer's switches (--steps ... --offload-threads, --dp-split, --slow-ranks,
// RAILYARD_PROGRESS_FILE), validated against the model.
TrainConfig train_config(const Flags& f, const GptConfig& cfg);

// The shards: --data / spec.data.train and --val-data / spec.data.val are globs (a directory means its train_*.bin /
// val_*.bin); validation defaults to val_*.bin beside the training shards. Both must match something (validation only
// when it runs); logged.
struct ShardGlobs {
  std::string train, val;
};
ShardGlobs shard_globs(const Flags& f, const ConfigOrigins& origins, const TrainConfig& tc);

// Refuses, before anything is allocated, a model whose training state does not fit in this machine's memory.
void check_memory_budget(const GptConfig& cfg, const TrainConfig& tc, int threads);

}  // namespace railyard::worker
