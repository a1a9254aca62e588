// The NCCL backend as the CUDA module offers it (worker/kernels/cuda/module.cc): railyard-worker never links NCCL or
// the CUDA runtime (CPU runs must not map them, docs/gpu.md "The CUDA module"), so its NCCL communicators are made
// inside librailyard_cuda.so and used through the Communicator / StreamReducer interfaces. Exceptions do not cross the
// C boundary of these two calls: a failure returns null with the message in err. Later calls on the objects throw
// CommError as usual.
#pragma once

#include <cstddef>

#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/stream_reducer.h"

namespace railyard::worker::comm {

// connect_nccl(*options, cuda_device) (nccl_communicator.h).
using NcclConnectFn = Communicator* (*)(const GlooOptions* options, int cuda_device, char* err, size_t err_len);
// nccl_stream_reducer(*comm, stream): comm must come from the same module's NcclConnectFn (or a split of it).
using NcclStreamReducerFn = StreamReducer* (*)(Communicator* comm, void* stream, char* err, size_t err_len);
inline constexpr const char* kNcclConnectSymbol = "railyard_cuda_connect_nccl";
inline constexpr const char* kNcclStreamReducerSymbol = "railyard_cuda_nccl_stream_reducer";

}  // namespace railyard::worker::comm
