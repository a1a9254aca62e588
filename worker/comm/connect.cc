#include "worker/comm/connect.h"

#include <string>

#include "common/error.h"

namespace railyard::worker::comm {

int cuda_device_for(int local_rank, int visible_gpus) {
  if (local_rank < 0 || local_rank >= visible_gpus) {
    throw ConfigError("LOCAL_RANK=" + std::to_string(local_rank) + " but this host shows " +
                      std::to_string(visible_gpus) +
                      " GPU(s): run one process per GPU (spec.procsPerReplica = GPUs per pod, or --nproc at most the "
                      "GPU count), or check CUDA_VISIBLE_DEVICES");
  }
  return local_rank;
}

WorkerGroups connect_worker_groups(DeviceKind device, const Layout& layout, const GlooOptions& options, int cuda_device,
                                   const DeviceWorldConnector& connect_device_world) {
  WorkerGroups g;
  g.host = std::make_unique<ProcessGroups>(connect_gloo(options), layout);
  if (device != DeviceKind::kCuda) return g;
  if (!connect_device_world) {
    throw ConfigError(
        "spec.device / --device cuda with more than one process: this railyard-worker has no NCCL backend (its CUDA "
        "module was built without nccl.h / libnccl): build with NCCL, or use --device cpu");
  }
  GlooOptions nccl = options;
  nccl.serve_store = false;  // the Gloo world's rank 0 serves the store for as long as g.host lives
  g.device = std::make_unique<ProcessGroups>(connect_device_world(nccl, cuda_device), layout);
  return g;
}

}  // namespace railyard::worker::comm
