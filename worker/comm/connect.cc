#include "worker/comm/connect.h"

#include <string>

#include "common/error.h"
#ifdef RAILYARD_WITH_NCCL
#include "worker/comm/nccl_communicator.h"
#endif

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

WorkerGroups connect_worker_groups(DeviceKind device, const Layout& layout, const GlooOptions& options,
                                   int cuda_device) {
  WorkerGroups g;
  g.host = std::make_unique<ProcessGroups>(connect_gloo(options), layout);
  if (device != DeviceKind::kCuda) return g;
#ifdef RAILYARD_WITH_NCCL
  GlooOptions nccl = options;
  nccl.serve_store = false;  // the Gloo world's rank 0 serves the store for as long as g.host lives
  g.device = std::make_unique<ProcessGroups>(connect_nccl(nccl, cuda_device), layout);
  return g;
#else
  (void)cuda_device;
  throw ConfigError(
      "spec.device / --device cuda with more than one process: this railyard-worker was built without NCCL "
      "(nccl.h / libnccl not found next to the CUDA toolkit): build with NCCL, or use --device cpu");
#endif
}

}  // namespace railyard::worker::comm
