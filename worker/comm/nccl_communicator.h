// NCCL backend of Communicator: collectives between CUDA device buffers. Built only when CUDA and NCCL are found
// (RAILYARD_WITH_NCCL is then defined for everything that links railyard_comm). Not run here (no GPU): see
// docs/parallel.md "Communication".
#pragma once

#include <memory>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/stream_reducer.h"

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

// ncclGetUniqueId's 128 bytes (what rank 0 publishes; exchange_nccl_id in nccl_bootstrap.h). Needs no GPU: it
// opens NCCL's bootstrap listener on the first usable interface (NCCL_COMM_ID pins it). Throws CommError.
std::vector<char> nccl_unique_id();

// A StreamReducer (stream_reducer.h) over `comm`, which must be an NCCL communicator (connect_nccl or a split of
// it; std::invalid_argument otherwise), for buffers produced on `compute_stream` (a cudaStream_t): all_reduce records
// an event on the compute stream, makes the communicator's stream wait for it and enqueues ncclAllReduce there (its
// launch is watched with the deadline); wait() blocks on the communicator's stream with the deadline, polling
// ncclCommGetAsyncError, and makes the compute stream wait for it too. No other call may use `comm` between an
// all_reduce and the wait() (the reductions are in flight on its stream). `comm` must outlive the reducer.
std::unique_ptr<StreamReducer> nccl_stream_reducer(Communicator& comm, void* compute_stream);

}  // namespace railyard::worker::comm
