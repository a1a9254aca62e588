// The worker's process groups by device, built in one place: `railyard-worker train` (data parallelism) and the
// tensor/pipeline-parallel model on CUDA take their communicators from here (docs/parallel.md "Communicators by
// device").
#pragma once

#include <functional>
#include <memory>

#include "worker/comm/gloo_communicator.h"
#include "worker/comm/process_groups.h"
#include "worker/device/device.h"

namespace railyard::worker::comm {

struct WorkerGroups {
  // Gloo over TCP, on every device: collectives on host buffers (losses, skip flags, the checkpointer's agreement,
  // norms gathered as doubles) and, on the CPU, the tensors too. Rank 0 serves the generation's store from it.
  std::unique_ptr<ProcessGroups> host;
  // NCCL on CUDA (one world communicator from the store's ncclUniqueId, every group an ncclCommSplit of it): device
  // buffers (gradient buckets, tp/pp activations). Null on the CPU.
  std::unique_ptr<ProcessGroups> device;
  // The groups this device's tensors are reduced over.
  ProcessGroups& tensors() { return device ? *device : *host; }
};

// Collective over the world of `options` (every rank calls it with the same device and layout): the Gloo world first
// (rank 0 serves the store when options.serve_store), then on CUDA the NCCL world bootstrapped through that store
// under the generation's prefix ("g<N>/nccl_id"), on GPU `cuda_device`, and both split into the layout's groups.
// Throws ConfigError for CUDA in a build without NCCL, CommError when a rank or the device fails.
// `connect_device_world` makes the NCCL world (connect_nccl in tests that link NCCL; the CUDA module's entry point in
// railyard-worker, which must not link NCCL: worker/comm/nccl_module.h); null is refused on CUDA.
using DeviceWorldConnector = std::function<std::unique_ptr<Communicator>(const GlooOptions& options, int cuda_device)>;
WorkerGroups connect_worker_groups(DeviceKind device, const Layout& layout, const GlooOptions& options, int cuda_device,
                                   const DeviceWorldConnector& connect_device_world = nullptr);

// The GPU of a worker process: its LOCAL_RANK (the agent starts one process per GPU of the pod). ConfigError naming
// LOCAL_RANK when this host shows fewer GPUs.
int cuda_device_for(int local_rank, int visible_gpus);

}  // namespace railyard::worker::comm
