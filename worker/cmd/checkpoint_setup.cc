#include "worker/cmd/checkpoint_setup.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/peer_held.h"
#include "checkpoint/shm_store.h"
#include "common/error.h"

namespace railyard::worker {

std::vector<ShardSpec> checkpoint_shards(const GptConfig& cfg, Trainer& trainer, const DistSetup& dist,
                                         parallel::ExpertParallel* ep) {
  if (expert_storage_sharded(ep, dist)) {
    comm::Communicator& edp = ep->expert_data_parallel();
    return expert_shard_state_shards(trainer.model().config(), trainer.state(), dist.groups->dp().rank(),
                                     dist.groups->dp().size(), edp.rank(), edp.size());
  }
  if (dist.sharded == nullptr && dist.zero == 0) return full_state_shards(cfg, trainer.state());
  std::vector<OwnedRange> owned;
  if (dist.zero > 0) {
    const parallel::BucketLayout& bl = dist.sync->layout();
    for (size_t b = 0; b < bl.buckets().size(); ++b) {
      const auto [s, e] = bl.own(b, dist.sync->rank());
      if (s < e) owned.push_back({s, e, bl.buckets()[b].shard_offset});
    }
  }
  if (dist.sharded == nullptr) {
    return zero_state_shards(cfg, trainer.state().params, dist.sync->shard_m(), dist.sync->shard_v(), owned,
                             dist.sync->rank(), dist.sync->size());
  }
  const comm::Layout& l = dist.groups->layout();
  const comm::Coord& c = dist.groups->coord();
  if (dist.zero == 0) {
    return shards_from_slices(dist.sharded->model().shard_map(), dist.sharded->host_params(), dist.sharded->adam_m(),
                              dist.sharded->adam_v(), c.tp, l.tp, c.dp, l.dp);
  }
  return zero_slices_shards(dist.sharded->model().shard_map(), dist.sharded->host_params(), dist.sync->shard_m(),
                            dist.sync->shard_v(), owned, c.tp, l.tp, c.dp, l.dp);
}

CheckpointOptions checkpoint_options(const TrainOptions& o, const DistSetup& dist, const parallel::ExpertParallel* ep,
                                     std::vector<ShardSpec>& shards) {
  // Checkpoints (docs/checkpointing.md): restore before the first step, save every --ckpt-every steps, and on
  // SIGTERM save and exit 143.
  const LauncherEnv& env = o.env;
  CheckpointOptions co;
  co.dir = o.ckpt_dir;
  co.every = o.ckpt_every;
  co.keep = o.ckpt_keep;
  co.async = o.ckpt_async;
  co.shm_every = o.ckpt_shm_every;
  co.term_budget_seconds = o.ckpt_term_budget;
  co.resume = o.resume;
  const std::string job_id = env.job_namespace + "_" + (env.job_name.empty() ? "local" : env.job_name);
  // The agent sets RAILYARD_GENERATION (the config's generation); without it (a run by hand) the writer is not fenced.
  // With the job's uid: a re-created job of the same name and checkpoint path starts at generation 1 again and must not
  // be fenced by its predecessor's `latest`.
  co.job = env.job_uid.empty() ? job_id : job_id + "_" + env.job_uid;
  const std::string generation = env.generation.empty() ? "0" : env.generation;
  co.generation = std::max<int64_t>(0, std::atoll(generation.c_str()));
  // The agent names its pod's segments (RAILYARD_SHM_PREFIX) and removes them when the pod ends (worker/agent).
  const int global_rank = env.rank_number();
  if (!env.shm_prefix.empty()) {
    co.shm_name = env.shm_prefix + "-r" + std::to_string(global_rank);
  } else {
    co.shm_name = ckpt::ShmStore::name_for(job_id, global_rank);
  }
  // The agent copies this rank's slots to a peer pod and records which steps the peer holds: keep that one.
  if (env.shm_peer_copy == "1") co.shm_peer_held = ckpt::peer_held_name(co.shm_name);
  // Steps the agent fetched from a peer pod into this rank's slots (a replacement pod; docs/checkpointing.md).
  for (std::string rest = env.peer_steps; !rest.empty();) {
    const auto comma = rest.find(',');
    co.shm_peer_steps.push_back(std::atoll(rest.substr(0, comma).c_str()));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  co.layout = nlohmann::json{{"dp", 1}, {"tp", 1}, {"pp", 1}, {"zero", dist.zero}};
  if (const int world = std::atoi(env.world_size.empty() ? "1" : env.world_size.c_str()); world > 1) {
    // Every rank of the world saves into the same directory under its global rank, with one run id for all ranks
    // of this world; data-parallel replicas split the writes of their identical state, and all ranks stop at the
    // same step on SIGTERM.
    co.rank = global_rank;
    co.world_size = world;
    co.run_id = job_id + "-g" + generation + "-" + env.master_addr + "-" + env.master_port;
    for (char& c : co.run_id)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '-';
    if (dist.groups != nullptr) {
      const auto& l = dist.groups->layout();
      co.layout = nlohmann::json{{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"zero", dist.zero}};
      // Stage slices, ZeRO lists and expert shards carry their own split.
      if (dist.sharded == nullptr && dist.zero == 0 && !expert_storage_sharded(ep, dist)) {
        for (auto& s : shards) {
          s.replica_index = dist.groups->dp().rank();
          s.num_replicas = dist.groups->dp().size();
        }
      }
    }
    if (dist.groups != nullptr) {
      co.all_gather = [&dist](const std::vector<int64_t>& mine) {
        std::vector<int64_t> all(mine.size() * static_cast<size_t>(dist.groups->world().size()));
        dist.groups->world().all_gather(mine.data(), all.data(), mine.size(), comm::DType::kInt64);
        return all;
      };
    }
    if (dist.sharded != nullptr) {
      co.any_rank = [&dist](bool mine) { return dist.sharded->any(mine); };  // over the whole world
    } else if (dist.sync != nullptr) {
      co.any_rank = [&dist](bool mine) {
        for (double v : dist.sync->all_gather({mine ? 1.0 : 0.0}))
          if (v != 0) return true;
        return false;
      };
    }
  }
  return co;
}

}  // namespace railyard::worker
