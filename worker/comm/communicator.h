// The one interface every collective of the worker goes through (docs/parallel.md). Backends: Gloo over TCP for CPU
// buffers (gloo_communicator.h), NCCL for CUDA buffers (nccl_communicator.h, built when CUDA is present).
//
// Contract shared by all backends:
// - Every call is collective over the group (all members call it, in the same order), except send/recv.
// - Every blocking call honours the communicator's deadline: a peer that died or hangs becomes a CommError on every
//   survivor within timeout(), never a hang. After a CommError the communicator is unusable (abort() it and build
//   a new one for the next generation).
// - Buffers are host memory for Gloo, device memory for NCCL. `count` is in elements of `dtype`.
// - Not thread-safe: one thread per communicator at a time. Code that overlaps communication with compute (the
//   data-parallel bucket reducer) uses its own communicator from dup().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace railyard::worker::comm {

enum class DType : uint8_t {
  kFloat32,
  kBFloat16,  // stored as uint16_t (the upper half of an fp32); reductions accumulate in fp32
  kInt32,
  kInt64,
};
size_t dtype_size(DType t);
const char* dtype_name(DType t);

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };

// "[0,2,4]": group members in logs and errors.
std::string rank_list(const std::vector<int>& ranks);
// Checks split()'s `ranks` (ascending, distinct, within [0, size), containing `rank`) and returns the index of `rank`
// in them; otherwise throws std::invalid_argument starting with `where`.
int split_index(const std::vector<int>& ranks, int rank, int size, const std::string& where);

// A peer died, the deadline passed, or the group was aborted. what() names the operation, the group and the peer
// when known, e.g. "all_reduce on group 'dp' (rank 1 of 2): timed out after 2000 ms waiting for rank 0".
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

// A pending point-to-point operation. wait() blocks until done or throws CommError at the deadline. Destroying a
// request that was never waited on waits for it (errors swallowed), so buffers are never written after they die.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name for logs, errors and metrics: "world", "tp", "dp", "pp", or what split() was given.
  virtual const std::string& name() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // In place: buf holds count elements on every rank; afterwards the reduction over ranks.
  virtual void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // in: size()*count elements; out: count elements = the reduction of chunk rank() (chunks in rank order). out may
  // alias chunk rank() of in.
  virtual void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  // in: count elements; out: size()*count elements, chunk j from rank j. in may alias chunk rank() of out.
  virtual void all_gather(const void* in, void* out, size_t count, DType dtype) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  // in and out: size()*count elements; chunk j of in goes to rank j, chunk j of out came from rank j.
  virtual void all_to_all(const void* in, void* out, size_t count, DType dtype) = 0;
  // Point to point within the group. A send and its recv must agree on count, dtype and tag.
  virtual std::unique_ptr<Request> isend(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) = 0;
  virtual std::unique_ptr<Request> irecv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) = 0;
  void send(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
    isend(buf, count, dtype, peer, tag)->wait();
  }
  void recv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) {
    irecv(buf, count, dtype, peer, tag)->wait();
  }
  virtual void barrier() = 0;

  // A new communicator over `ranks` (ranks of this group, ascending, containing rank()). Collective over this whole
  // group: every member calls split() with the same `name` and its own `ranks` (disjoint groups may be created by
  // one call). dup() is split() over all ranks, for a second stream of collectives.
  virtual std::unique_ptr<Communicator> split(const std::vector<int>& ranks, const std::string& name) = 0;
  std::unique_ptr<Communicator> dup(const std::string& name);

  // Tears the connections down so that peers blocked on us fail fast; every later call throws CommError.
  virtual void abort() = 0;
};

}  // namespace railyard::worker::comm
