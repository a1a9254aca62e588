// NCCL backend of Communicator: collectives between CUDA device buffers. Built only when CUDA and NCCL are found
// (RAILYARD_WITH_NCCL is then defined for everything that links railyard_comm). Not run here (no GPU): see
// docs/parallel.md "Communication".
#pragma once

#include <memory>

#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"

namespace railyard::worker::comm {

// Bootstraps through the same TcpStore as Gloo (options.store_host/port, rank, size, prefix, timeout, serve_store,
// name; bind_host is unused): rank 0 makes the NCCL unique id and publishes it under "<prefix>/nccl_id". The
// communicator is non-blocking (ncclConfig.blocking = 0) and owns a CUDA stream on `cuda_device`; every call waits for
// its work with the deadline, polling ncclCommGetAsyncError, and calls ncclCommAbort when the deadline passes or NCCL
// reports an error, so survivors of a dead peer fail within timeout(). The stream orders after the legacy default
// stream; buffers produced on other streams must be synchronized by the caller first.
//
// isend/irecv are batched: they are queued and launched together (one ncclGroupStart/End) at the first wait() or
// collective, so exchanges such as "isend to the right, irecv from the left, wait both" never deadlock.
// Throws CommError naming the CUDA or NCCL call when the device or the library is unusable.
std::unique_ptr<Communicator> connect_nccl(const GlooOptions& options, int cuda_device);

}  // namespace railyard::worker::comm
