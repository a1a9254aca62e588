#include "worker/cmd/checkpoint_setup.h"

#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/shm_store.h"
#include "common/error.h"
#include "common/flash_checkpoint.h"
#include "common/pod_env.h"

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

CheckpointOptions checkpoint_options(const Flags& f, const DistSetup& dist, const parallel::ExpertParallel* ep,
                                     std::vector<ShardSpec>& shards) {
  // Checkpoints (docs/checkpointing.md): restore before the first step, save every --ckpt-every steps, and on
  // SIGTERM save and exit 143.
  CheckpointOptions co;
  if (f.count("ckpt-dir")) co.dir = f.at("ckpt-dir");
  co.every = static_cast<int>(to_int(f, "ckpt-every", 0));
  co.keep = static_cast<int>(to_int(f, "ckpt-keep", 3));
  const std::string async = f.count("ckpt-async") ? f.at("ckpt-async") : "on";
  if (async != "on" && async != "off") throw ConfigError("--ckpt-async must be on or off");
  co.async = async == "on";
  co.shm_every = static_cast<int>(to_int(f, "ckpt-shm-every", 0));
  co.term_budget_seconds = to_double(f, "ckpt-term-budget", 8);
  // --resume, else the agent's RAILYARD_RESTORE, else auto.
  co.resume = f.count("resume") ? f.at("resume") : env_or(pod_env::kRestore, "");
  if (co.resume.empty()) co.resume = "auto";
  if (co.resume == "auto" && co.dir.empty() && co.shm_every == 0) co.resume = "never";
  const std::string job_id = env_or(pod_env::kJobNamespace, "") + "_" + env_or(pod_env::kJobName, "local");
  // The agent sets RAILYARD_GENERATION (the config's generation); without it (a run by hand) the writer is not fenced.
  // With the job's uid: a re-created job of the same name and checkpoint path starts at generation 1 again and must not
  // be fenced by its predecessor's `latest`.
  const std::string job_uid = env_or(pod_env::kJobUid, "");
  co.job = job_uid.empty() ? job_id : job_id + "_" + job_uid;
  co.generation = std::max<int64_t>(0, std::atoll(env_or(flash::kGenerationEnv, "0").c_str()));
  // The agent names its pod's segments (RAILYARD_SHM_PREFIX) and removes them when the pod ends (worker/agent).
  const int global_rank = static_cast<int>(std::atol(env_or("RANK", "0").c_str()));
  if (const std::string prefix = env_or(flash::kShmPrefixEnv, ""); !prefix.empty()) {
    co.shm_name = prefix + "-r" + std::to_string(global_rank);
  } else {
    co.shm_name = ckpt::ShmStore::name_for(job_id, global_rank);
  }
  // Steps the agent fetched from a peer pod into this rank's slots (a replacement pod; docs/checkpointing.md).
  for (std::string rest = env_or(flash::kPeerStepsEnv, ""); !rest.empty();) {
    const auto comma = rest.find(',');
    co.shm_peer_steps.push_back(std::atoll(rest.substr(0, comma).c_str()));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  co.layout = nlohmann::json{{"dp", 1}, {"tp", 1}, {"pp", 1}, {"zero", dist.zero}};
  if (const int world = std::atoi(env_or("WORLD_SIZE", "1").c_str()); world > 1) {
    // Every rank of the world saves into the same directory under its global rank, with one run id for all ranks
    // of this world; data-parallel replicas split the writes of their identical state, and all ranks stop at the
    // same step on SIGTERM.
    co.rank = std::atoi(env_or("RANK", "0").c_str());
    co.world_size = world;
    co.run_id = job_id + "-g" + env_or(flash::kGenerationEnv, "0") + "-" + env_or("MASTER_ADDR", "") + "-" +
                env_or("MASTER_PORT", "");
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
