// The checkpointer's side of `train` (docs/checkpointing.md): which tensors this rank saves and how.
#pragma once

#include <vector>

#include "worker/cmd/train_options.h"
#include "worker/cmd/world.h"
#include "worker/train/checkpointing.h"

namespace railyard::worker {

// The checkpoint's tensor list: the full model, or a tp/pp stage's slices (shard_map), and with ZeRO over dp the
// parameters plus this rank's owned ranges of the moments (of the llm.c buffer, or of the stage's local buffer mapped
// through its shard_map). Every layout saves the same global tensors, so any checkpoint loads into any layout.
std::vector<ShardSpec> checkpoint_shards(const GptConfig& cfg, Trainer& trainer, const DistSetup& dist,
                                         parallel::ExpertParallel* ep);

// --ckpt-* and --resume (train_options.h resolves it), the shared-memory slot the agent named (RAILYARD_SHM_PREFIX) and
// the peer steps it fetched, and in a world the rank, run id, layout and collectives that make every rank save and
// stop together. Data-parallel replicas of an unsharded state split the writes of `shards` (their fields are set
// here). `dist` must outlive the options (their collectives use it).
CheckpointOptions checkpoint_options(const TrainOptions& o, const DistSetup& dist, const parallel::ExpertParallel* ep,
                                     std::vector<ShardSpec>& shards);

}  // namespace railyard::worker
