// Reductions of device buffers that are ordered after the compute stream's work and completed later: how the
// data-parallel bucket reducer overlaps gradient communication with backward on CUDA (docs/parallel.md "Data
// parallelism on CUDA"). Free of CUDA headers, so worker/parallel and the trainer need none.
#pragma once

#include <cstddef>
#include <memory>

#include "worker/comm/communicator.h"

namespace railyard::worker::comm {

class StreamReducer {
 public:
  virtual ~StreamReducer() = default;
  // Enqueues an in-place reduction of `count` elements at `buf` over the group. It starts once every kernel enqueued
  // on the compute stream before this call has finished, and runs while later kernels compute. Returns without
  // waiting for it. Collective: every member enqueues the same reductions in the same order.
  virtual void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // Blocks until every enqueued reduction has finished (CommError/CommTimeout within the group's timeout(), which
  // then is unusable); kernels enqueued on the compute stream afterwards see the results.
  virtual void wait() = 0;
  // Reductions enqueued since the last wait().
  virtual size_t pending() const = 0;
};

// The host twin: reduces at once with the blocking `comm` (buffers in host memory, whose producers have returned by
// the time they are enqueued), wait() only settles the count. It is what the off-host test device of the trainer
// tests (CPU kernels behind memory the trainer must treat as a device's) reduce with, and the reference the NCCL
// reducer must equal. `comm` must outlive it.
std::unique_ptr<StreamReducer> host_stream_reducer(Communicator& comm);

}  // namespace railyard::worker::comm
