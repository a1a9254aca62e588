#include "worker/cmd/train_options.h"

#include <cstdlib>

#include "common/error.h"
#include "common/flash_checkpoint.h"
#include "common/pod_env.h"
#include "common/torchrun.h"

namespace railyard::worker {

LauncherEnv LauncherEnv::from_process() {
  LauncherEnv e;
  e.rank = env_or(pod_env::kRank, "");
  e.local_rank = env_or(pod_env::kLocalRank, "");
  e.world_size = env_or(pod_env::kWorldSize, "");
  e.local_world_size = env_or(pod_env::kLocalWorldSize, "");
  e.master_addr = env_or(pod_env::kMasterAddr, "");
  e.master_port = env_or(pod_env::kMasterPort, "");
  e.data_dir = env_or(pod_env::kDataDir, "");
  e.data_root = env_or(pod_env::kDataRoot, "");
  e.checkpoint_root = env_or(pod_env::kCheckpointRoot, "");
  e.metrics_port = env_or(pod_env::kMetricsPort, "");
  e.pod_ip = env_or(pod_env::kPodIp, "");
  e.restore = env_or(pod_env::kRestore, "");
  e.job_namespace = env_or(pod_env::kJobNamespace, "");
  e.job_name = env_or(pod_env::kJobName, "");
  e.job_uid = env_or(pod_env::kJobUid, "");
  e.generation = env_or(flash::kGenerationEnv, "");
  e.shm_prefix = env_or(flash::kShmPrefixEnv, "");
  e.peer_steps = env_or(flash::kPeerStepsEnv, "");
  e.shm_peer_copy = env_or(pod_env::kShmPeerCopy, "");
  e.progress_file = env_or(torchrun::kProgressFileEnv, "");
  e.num_threads = env_or(pod_env::kNumThreads, "");
  return e;
}

// The launcher's numbers are read leniently (a launcher sets them; Gloo's store checks RANK and WORLD_SIZE strictly
// when the world is joined).
int LauncherEnv::rank_number() const { return static_cast<int>(std::atol(rank.c_str())); }
int LauncherEnv::local_rank_number() const { return static_cast<int>(std::atol(local_rank.c_str())); }
int LauncherEnv::local_world_number() const {
  const long n = std::atol(local_world_size.c_str());
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string TrainOptions::name_of(const std::string& flag, const std::string& origin) const {
  if (origin.empty()) return "--" + flag;
  return origin + (config.empty() ? std::string() : " (--config " + config + ")");
}

}  // namespace railyard::worker
