// The distributed side of `train` (docs/parallel.md "Running it"): the world the launcher (the agent, or --nproc)
// describes in RANK/WORLD_SIZE/MASTER_*, its process groups on the host (Gloo) and, on CUDA, on the device (NCCL),
// the data-parallel reduction's device side, and the expert-parallel groups.
#pragma once

#include <cstddef>
#include <memory>

#include "worker/cmd/train_options.h"
#include "worker/comm/process_groups.h"
#include "worker/device/cuda_module.h"
#include "worker/device/device.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/dist_model.h"
#include "worker/parallel/expert_parallel.h"
#include "worker/train/trainer.h"

namespace railyard::worker {

// What join_world built; the trainer and the checkpointer read it.
struct DistSetup {
  std::unique_ptr<comm::ProcessGroups> groups;  // null: one process. Gloo: host buffers (and CPU tensors)
  // CUDA: the same layout over NCCL (comm::connect_worker_groups), the gradient buckets' dup of its dp group and the
  // stream-ordered reducer on it (declared before `sync`, which uses it).
  std::unique_ptr<comm::ProcessGroups> device_groups;
  std::unique_ptr<comm::Communicator> grad_comm;
  std::unique_ptr<comm::StreamReducer> reducer;
  std::unique_ptr<comm::Communicator> cp;         // --cp > 1: this rank's block of cp consecutive dp ranks
  std::unique_ptr<comm::Communicator> device_cp;  // the same block over NCCL (CUDA): ring attention's device memory
  std::unique_ptr<parallel::DataParallel> sync;
  std::unique_ptr<parallel::ParallelGpt> sharded;  // tp * pp > 1
  int zero = 0;
  bool deterministic = false;
  size_t bucket_bytes = size_t{25} << 20;
};

// The communicators of the tensor/pipeline-parallel stage (tp, pp, the tied-embedding pair, cp): the Gloo groups on
// the CPU, the NCCL groups over the same ranks on CUDA.
parallel::ModelGroups model_parallel_groups(DistSetup& d, DeviceKind device);

// CUDA with a dp group: the stream-ordered reducer of the gradient buckets into `dpo` (nothing on the CPU).
void set_device_reduction(DistSetup& d, Kernels<float>* device, const CudaModule* cuda_module,
                          parallel::DataParallelOptions& dpo);

// --zero, --deterministic, --bucket-mb, --tp/--pp and --cp over the world of the environment (one process without
// WORLD_SIZE); on ranks other than 0 the job-wide files and step lines are turned off in `tc`.
DistSetup join_world(const TrainOptions& o, TrainConfig& tc, DeviceKind device, int visible_gpus,
                     const CudaModule* cuda_module);

// --ep/--ep-a2a/--ep-node-size: expert-parallel groups of consecutive dp ranks; null without --ep (or --ep 1).
std::unique_ptr<parallel::ExpertParallel> join_expert_parallel(const TrainOptions& o, const GptConfig& cfg,
                                                               const TrainConfig& tc, DistSetup& dist,
                                                               DeviceKind device);

// A rank holds only its ep group's share of the experts (not with ZeRO, --deterministic or a tp/pp stage).
bool expert_storage_sharded(const parallel::ExpertParallel* ep, const DistSetup& dist);

// The model's parallel parts, before the Trainer: with tp, pp or cp the stage (dist.sharded) and its data-parallel
// reduction, else the whole model's data-parallel reduction (dist.sync, also for ZeRO and --deterministic in one
// process); the expert-parallel groups (join_expert_parallel). `kernels` is the device (null: the CPU).
struct ParallelModel {
  std::unique_ptr<parallel::ExpertParallel> experts;  // null without --ep
  GptConfig local_cfg;  // the layout of this rank's buffers: the model's, or with expert storage its E/ep experts
};
ParallelModel build_parallel_model(const TrainOptions& o, const GptConfig& cfg, const TrainConfig& tc, DistSetup& dist,
                                   DeviceKind device, const CudaModule* cuda, Kernels<float>* kernels,
                                   ThreadPool& pool);

// `train --nproc N ...`: N copies of this command (without --nproc) as one local world; their exit code.
int launch_train_world(int argc, char** argv, const TrainOptions& o);

}  // namespace railyard::worker
