#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/nccl_bootstrap.h"
#include "worker/comm/tcp_store.h"
#include "worker/comm/watchdog.h"

namespace railyard::worker::comm {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  throw std::invalid_argument("nccl: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  throw std::invalid_argument("nccl: unknown reduce op");
}

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw CommError(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")" +
                    (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? "; no usable GPU on this host" : ""));
  }
}

struct Bootstrap {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStore> store;
};

// The p2p ops queued since the last launch; launched together in one NCCL group.
struct P2pOp {
  void* buf;
  size_t count;
  DType dtype;
  int peer;
  bool is_send;
};
struct Batch {
  std::vector<P2pOp> ops;
  size_t bytes() const {
    size_t n = 0;
    for (const auto& p : ops) n += p.count * dtype_size(p.dtype);
    return n;
  }
  cudaEvent_t done = nullptr;
  bool launched = false;
  ~Batch() {
    if (done) cudaEventDestroy(done);
  }
};

// Deadlines: every blocking call registers its operation with the State's Watchdog (worker/comm/watchdog.h) for
// timeout(); when one expires the watchdog thread calls ncclCommAbort (freeing the GPU from kernels spinning on a dead
// peer) and the caller, polling for completion, throws CommTimeout naming the operation. `comm` is guarded by `mu`
// because the watchdog thread aborts it while the caller polls it; every NCCL call on it is made under `mu`.
//
// The stream is an ordinary (blocking) stream: it orders after work on the legacy default stream, so buffers written
// by kernels there are complete before a collective reads them. Work on other streams must be synchronized by the
// caller; calls return only when the NCCL work is done, so results can be read right after on any stream.
struct State {
  std::shared_ptr<Bootstrap> boot;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  std::string name;
  std::string prefix;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{30000};
  std::mutex mu;                  // guards comm (see above)
  std::unique_ptr<Watchdog> dog;  // started before the communicator is created, stopped first
  bool aborted = false;
  std::string error;
  std::shared_ptr<Batch> pending;  // isend/irecv not launched yet
  cudaEvent_t done = nullptr;      // completion of the last collective
  void* scratch = nullptr;         // barrier's device word

  ~State() {
    dog.reset();  // joins the watchdog thread: nothing else touches comm from here on
    if (comm) {
      // A healthy communicator is finalized (flushes outstanding work) and destroyed; one that does not finish within
      // the deadline is aborted. A failed one was aborted already (comm == nullptr).
      ncclResult_t st = ncclCommFinalize(comm);
      auto deadline = Clock::now() + timeout;
      while (st == ncclInProgress && Clock::now() < deadline) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) break;
        std::this_thread::yield();
      }
      if (st == ncclSuccess) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    if (done) cudaEventDestroy(done);
    if (scratch) cudaFree(scratch);
    if (stream) cudaStreamDestroy(stream);
  }

  std::string where(const std::string& op) const {
    return op + " on group '" + name + "' (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  }
  void check_usable(const std::string& op) const {
    if (aborted) throw CommError(where(op) + ": communicator was aborted");
    if (!error.empty()) throw CommError(where(op) + ": communicator is unusable after an earlier error: " + error);
  }
  void start_watchdog() {
    dog = std::make_unique<Watchdog>([this](const ExpiredOp&) { abort_comm(); });
  }
  void abort_comm() {
    std::lock_guard lock(mu);
    if (comm) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }
  [[noreturn]] void fail(const std::string& op, const std::string& detail, bool timed_out, int peer = -1) {
    std::string msg = where(op) + ": " +
                      (timed_out ? "timed out after " + std::to_string(timeout.count()) + " ms, aborted by the watchdog"
                                 : std::string("failed")) +
                      (peer >= 0 ? " waiting for rank " + std::to_string(peer) : std::string()) +
                      (detail.empty() ? std::string() : " (" + detail + ")");
    if (error.empty()) error = msg;
    abort_comm();  // frees the GPU from kernels that would spin forever on the dead peer
    if (timed_out) throw CommTimeout(msg);
    throw CommError(msg);
  }

  // Checks the return of an NCCL call made on the non-blocking communicator: ncclInProgress is fine (finished by
  // wait()), anything else is an error.
  void nccl_call(ncclResult_t r, const std::string& op, const char* call) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::string last;
    {
      std::lock_guard lock(mu);
      if (comm) last = std::string(" ") + ncclGetLastError(comm);
    }
    fail(op, std::string(call) + ": " + ncclGetErrorString(r) + last, false);
  }

  // Runs `call` (an NCCL call on comm) under mu; a communicator the watchdog aborted is reported as the timeout.
  template <class Call>
  ncclResult_t locked(const std::string& op, Call&& call) {
    {
      std::lock_guard lock(mu);
      if (comm) return call();
    }
    timed_out_or_aborted(op, -1);
  }
  [[noreturn]] void timed_out_or_aborted(const std::string& op, int peer) {
    if (auto f = dog->failure()) fail(op, describe(*f), true, peer);
    fail(op, "communicator was aborted", false, peer);
  }

  // Waits for the comm's pending state and, when given, an event; aborts on error. The deadline is the watchdog's:
  // callers hold a WatchedOp for the operation.
  void wait_done(const std::string& op, cudaEvent_t event, int peer = -1) {
    for (;;) {
      if (dog->failure()) timed_out_or_aborted(op, peer);
      ncclResult_t st = ncclSuccess;
      ncclResult_t r = ncclSuccess;
      bool alive = false;
      std::string last;
      {
        std::lock_guard lock(mu);
        if (comm) {
          alive = true;
          r = ncclCommGetAsyncError(comm, &st);
          if (r == ncclSuccess && st != ncclSuccess && st != ncclInProgress) last = ncclGetLastError(comm);
        }
      }
      if (!alive) timed_out_or_aborted(op, peer);  // the watchdog aborted it between our checks
      if (r != ncclSuccess) fail(op, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r), false, peer);
      if (st != ncclSuccess && st != ncclInProgress)
        fail(op, std::string(ncclGetErrorString(st)) + " " + last, false, peer);
      bool launched = st == ncclSuccess;
      if (launched && event == nullptr) return;
      if (launched) {
        cudaError_t q = cudaEventQuery(event);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) fail(op, std::string("cudaEventQuery: ") + cudaGetErrorString(q), false, peer);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Launches the queued p2p ops as one group and records their completion event.
  void flush(const std::string& op) {
    if (!pending || pending->ops.empty()) return;
    auto batch = std::move(pending);
    pending.reset();
    cuda_check(cudaSetDevice(device), where(op) + ": cudaSetDevice");
    cuda_check(cudaEventCreateWithFlags(&batch->done, cudaEventDisableTiming), where(op) + ": cudaEventCreate");
    WatchedOp watched(*dog, op + " (launch of " + std::to_string(batch->ops.size()) + " p2p ops)", name, batch->bytes(),
                      timeout);
    nccl_call(locked(op,
                     [&] {
                       ncclResult_t r = ncclGroupStart();
                       for (const auto& p : batch->ops) {
                         if (r != ncclSuccess && r != ncclInProgress) break;
                         r = p.is_send ? ncclSend(p.buf, p.count, nccl_type(p.dtype), p.peer, comm, stream)
                                       : ncclRecv(p.buf, p.count, nccl_type(p.dtype), p.peer, comm, stream);
                       }
                       ncclResult_t e = ncclGroupEnd();
                       return r == ncclSuccess || r == ncclInProgress ? e : r;
                     }),
              op, "ncclSend/ncclRecv");
    wait_done(op, nullptr);  // the group is enqueued
    cuda_check(cudaEventRecord(batch->done, stream), where(op) + ": cudaEventRecord");
    batch->launched = true;
  }

  void wait_request(std::shared_ptr<Batch>& batch, bool is_send, int peer) {
    const std::string op = is_send ? "send" : "recv";
    check_usable(op);
    if (!batch->launched) flush(op);
    WatchedOp watched(*dog, op + " with rank " + std::to_string(peer), name, batch->bytes(), timeout);
    wait_done(op, batch->done, peer);
  }

  // `bytes`: what this rank sends, for the watchdog's report.
  template <class Launch>
  void run(const std::string& op, size_t bytes, Launch&& launch) {
    check_usable(op);
    flush(op);
    cuda_check(cudaSetDevice(device), where(op) + ": cudaSetDevice");
    if (!done) cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), where(op));
    WatchedOp watched(*dog, op, name, bytes, timeout);
    nccl_call(locked(op, launch), op, op.c_str());
    wait_done(op, nullptr);
    cuda_check(cudaEventRecord(done, stream), where(op) + ": cudaEventRecord");
    wait_done(op, done);
  }
};

class NcclRequest : public Request {
 public:
  NcclRequest(std::shared_ptr<State> st, std::shared_ptr<Batch> batch, bool is_send, int peer)
      : st_(std::move(st)), batch_(std::move(batch)), is_send_(is_send), peer_(peer) {}
  ~NcclRequest() override {
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override;

 private:
  std::shared_ptr<State> st_;
  std::shared_ptr<Batch> batch_;
  bool is_send_;
  int peer_;
  bool done_ = false;
};

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<State> st) : st_(std::move(st)) {}

  int rank() const override { return st_->rank; }
  int size() const override { return st_->size; }
  const std::string& name() const override { return st_->name; }
  std::chrono::milliseconds timeout() const override { return st_->timeout; }

  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    st_->run("all_reduce", count * dtype_size(dtype),
             [&] { return ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), st_->comm, st_->stream); });
  }
  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    st_->run("reduce_scatter", count * dtype_size(dtype) * static_cast<size_t>(st_->size),
             [&] { return ncclReduceScatter(in, out, count, nccl_type(dtype), nccl_op(op), st_->comm, st_->stream); });
  }
  void all_gather(const void* in, void* out, size_t count, DType dtype) override {
    st_->run("all_gather", count * dtype_size(dtype),
             [&] { return ncclAllGather(in, out, count, nccl_type(dtype), st_->comm, st_->stream); });
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= st_->size) {
      throw std::invalid_argument(st_->where("broadcast") + ": root " + std::to_string(root) + " is not a rank");
    }
    st_->run("broadcast", count * dtype_size(dtype),
             [&] { return ncclBroadcast(buf, buf, count, nccl_type(dtype), root, st_->comm, st_->stream); });
  }
  void all_to_all(const void* in, void* out, size_t count, DType dtype) override {
    if (in == out) throw std::invalid_argument(st_->where("all_to_all") + ": in and out must not alias on NCCL");
    const size_t chunk = count * dtype_size(dtype);
    st_->run("all_to_all", chunk * static_cast<size_t>(st_->size), [&] {
      ncclResult_t r = ncclGroupStart();
      for (int j = 0; j < st_->size && (r == ncclSuccess || r == ncclInProgress); ++j) {
        r = ncclSend(static_cast<const char*>(in) + static_cast<size_t>(j) * chunk, count, nccl_type(dtype), j,
                     st_->comm, st_->stream);
        if (r == ncclSuccess || r == ncclInProgress) {
          r = ncclRecv(static_cast<char*>(out) + static_cast<size_t>(j) * chunk, count, nccl_type(dtype), j, st_->comm,
                       st_->stream);
        }
      }
      ncclResult_t e = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? e : r;
    });
  }

  std::unique_ptr<Request> isend(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    return post(const_cast<void*>(buf), count, dtype, peer, tag, true);
  }
  std::unique_ptr<Request> irecv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    return post(buf, count, dtype, peer, tag, false);
  }

  void barrier() override {
    if (!st_->scratch) cuda_check(cudaMalloc(&st_->scratch, sizeof(float)), st_->where("barrier") + ": cudaMalloc");
    st_->run("barrier", sizeof(float), [&] {
      return ncclAllReduce(st_->scratch, st_->scratch, 1, ncclFloat32, ncclSum, st_->comm, st_->stream);
    });
  }

  std::unique_ptr<Communicator> split(const std::vector<int>& ranks, const std::string& name) override {
    const std::string op = "split '" + name + "'";
    const int sub_rank = split_index(ranks, st_->rank, st_->size, st_->where(op));
    st_->check_usable(op);
    st_->flush(op);
    auto sub = std::make_shared<State>();
    sub->boot = st_->boot;
    sub->device = st_->device;
    sub->name = name;
    sub->rank = sub_rank;
    sub->size = static_cast<int>(ranks.size());
    sub->timeout = st_->timeout;
    sub->start_watchdog();
    cuda_check(cudaStreamCreate(&sub->stream), st_->where(op) + ": cudaStreamCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = sub->name.c_str();
    // Disjoint groups of one call differ by their lowest member, which is therefore the color. The split is watched
    // on both: the parent's watchdog aborts the parent, the child's the new communicator.
    WatchedOp watched(*st_->dog, op, st_->name, 0, st_->timeout);
    WatchedOp watched_sub(*sub->dog, op, sub->name, 0, sub->timeout);
    st_->nccl_call(st_->locked(op,
                               [&] {
                                 std::lock_guard sub_lock(sub->mu);
                                 return ncclCommSplit(st_->comm, ranks.front(), st_->rank, &sub->comm, &config);
                               }),
                   op, "ncclCommSplit");
    st_->wait_done(op, nullptr);
    sub->wait_done(op, nullptr);
    return std::make_unique<NcclCommunicator>(sub);
  }

  void abort() override {
    st_->aborted = true;
    st_->abort_comm();
  }

  const std::shared_ptr<State>& state() const { return st_; }

 private:
  std::unique_ptr<Request> post(void* buf, size_t count, DType dtype, int peer, uint32_t tag, bool is_send) {
    (void)tag;  // NCCL matches sends and receives by order per peer; callers keep one order per (peer, tag) anyway
    const char* op = is_send ? "isend" : "irecv";
    if (peer < 0 || peer >= st_->size || peer == st_->rank) {
      throw std::invalid_argument(st_->where(op) + ": peer " + std::to_string(peer) + " is not another rank");
    }
    st_->check_usable(op);
    if (!st_->pending) st_->pending = std::make_shared<Batch>();
    st_->pending->ops.push_back(P2pOp{buf, count, dtype, peer, is_send});
    return std::make_unique<NcclRequest>(st_, st_->pending, is_send, peer);
  }

  std::shared_ptr<State> st_;
};

void NcclRequest::wait() {
  if (done_) return;
  done_ = true;
  st_->wait_request(batch_, is_send_, peer_);
}

// Bucketed gradient reduction overlapped with backward: ordering is by events between the compute stream and the
// communicator's stream, so the host never waits until wait(). One `ready` event serves every bucket: a
// cudaStreamWaitEvent waits for the record made just before it, and later records do not change that.
class NcclStreamReducer final : public StreamReducer {
 public:
  NcclStreamReducer(std::shared_ptr<State> st, cudaStream_t compute) : st_(std::move(st)), compute_(compute) {
    cuda_check(cudaSetDevice(st_->device), st_->where("stream reducer") + ": cudaSetDevice");
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming),
               st_->where("stream reducer") + ": cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming),
               st_->where("stream reducer") + ": cudaEventCreate");
  }
  ~NcclStreamReducer() override {
    if (pending_ > 0 && st_->comm != nullptr) cudaStreamSynchronize(st_->stream);  // buffers outlive the reductions
    if (ready_) cudaEventDestroy(ready_);
    if (finished_) cudaEventDestroy(finished_);
  }

  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    const std::string what = "all_reduce (bucket " + std::to_string(pending_) + ", overlapped)";
    st_->check_usable(what);
    st_->flush(what);
    cuda_check(cudaSetDevice(st_->device), st_->where(what) + ": cudaSetDevice");
    cuda_check(cudaEventRecord(ready_, compute_), st_->where(what) + ": cudaEventRecord on the compute stream");
    cuda_check(cudaStreamWaitEvent(st_->stream, ready_, 0), st_->where(what) + ": cudaStreamWaitEvent");
    const size_t bytes = count * dtype_size(dtype);
    WatchedOp watched(*st_->dog, what + " launch", st_->name, bytes, st_->timeout);
    st_->nccl_call(
        st_->locked(
            what,
            [&] { return ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), st_->comm, st_->stream); }),
        what, "ncclAllReduce");
    st_->wait_done(what, nullptr);  // enqueued (a non-blocking communicator may still be launching)
    ++pending_;
    bytes_ += bytes;
  }

  void wait() override {
    if (pending_ == 0) return;
    const std::string what = "all_reduce of " + std::to_string(pending_) + " overlapped buckets";
    cuda_check(cudaEventRecord(finished_, st_->stream), st_->where(what) + ": cudaEventRecord");
    {
      WatchedOp watched(*st_->dog, what, st_->name, bytes_, st_->timeout);
      st_->wait_done(what, finished_);
    }
    // The host has seen them finish; the stream order says it too, for kernels enqueued from here on.
    cuda_check(cudaStreamWaitEvent(compute_, finished_, 0), st_->where(what) + ": cudaStreamWaitEvent");
    pending_ = 0;
    bytes_ = 0;
  }
  size_t pending() const override { return pending_; }

 private:
  std::shared_ptr<State> st_;
  cudaStream_t compute_;
  cudaEvent_t ready_ = nullptr, finished_ = nullptr;
  size_t pending_ = 0, bytes_ = 0;
};

}  // namespace

std::unique_ptr<StreamReducer> nccl_stream_reducer(Communicator& comm, void* compute_stream) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr) {
    throw std::invalid_argument("nccl_stream_reducer: group '" + comm.name() +
                                "' is not an NCCL communicator (device buffers need connect_nccl's groups)");
  }
  return std::make_unique<NcclStreamReducer>(nccl->state(), static_cast<cudaStream_t>(compute_stream));
}

std::vector<char> nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw CommError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  return std::vector<char>(id.internal, id.internal + sizeof id.internal);
}

std::unique_ptr<Communicator> connect_nccl(const GlooOptions& o, int cuda_device) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw std::invalid_argument("connect_nccl: rank " + std::to_string(o.rank) + " / size " + std::to_string(o.size) +
                                " is not a valid rank (GlooOptions.rank, GlooOptions.size)");
  }
  if (o.store_port < 1 || o.store_port > 65535) {
    throw std::invalid_argument("connect_nccl: GlooOptions.store_port = " + std::to_string(o.store_port) +
                                ": must be in 1..65535 (MASTER_PORT)");
  }
  auto st = std::make_shared<State>();
  st->name = o.name;
  st->rank = o.rank;
  st->size = o.size;
  st->timeout = o.timeout;
  st->device = cuda_device;
  st->start_watchdog();
  const std::string op = "connect";
  cuda_check(cudaSetDevice(cuda_device), st->where(op) + ": cudaSetDevice(" + std::to_string(cuda_device) + ")");
  cuda_check(cudaStreamCreate(&st->stream), st->where(op) + ": cudaStreamCreate");

  st->boot = std::make_shared<Bootstrap>();
  if (o.serve_store && o.rank == 0) {
    st->boot->server =
        std::make_unique<TcpStoreServer>(o.store_host, o.store_port, o.timeout, o.store_token, o.store_tls);
  }
  st->boot->store =
      std::make_unique<TcpStore>(o.store_host, o.store_port, o.prefix, o.timeout, o.store_token, o.store_tls);
  ncclUniqueId id;
  const auto bytes = exchange_nccl_id(*st->boot->store, o.rank, sizeof id.internal, nccl_unique_id);
  std::memcpy(id.internal, bytes.data(), sizeof id.internal);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = st->name.c_str();
  WatchedOp watched(*st->dog, "ncclCommInitRankConfig", st->name, 0, o.timeout);
  ncclResult_t r;
  {
    std::lock_guard lock(st->mu);
    r = ncclCommInitRankConfig(&st->comm, o.size, id, o.rank, &config);
  }
  st->nccl_call(r, op, "ncclCommInitRankConfig");
  st->wait_done(op, nullptr);
  return std::make_unique<NcclCommunicator>(st);
}

}  // namespace railyard::worker::comm
