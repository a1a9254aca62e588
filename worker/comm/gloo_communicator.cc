#include "worker/comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>

#include "common/error.h"
#include "common/flash_checkpoint.h"
#include "common/log.h"
#include "common/pod_env.h"
#include "worker/comm/bf16.h"
#include "worker/comm/tcp_store.h"

namespace railyard::worker::comm {
namespace {

using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

// Slots of our own unbound-buffer traffic. Gloo's collectives use slots built from prefixes 0x01..0x08 (or, with the
// Slot::build of this Gloo version, small numbers), so the top byte keeps ours apart: p2p by user tag, and the ring
// reduce-scatter.
constexpr uint64_t kP2pSlot = uint64_t{0x40} << 56;
constexpr uint64_t kReduceScatterSlot = uint64_t{0x41} << 56;

// Everything one connect_gloo() set up, shared by the world communicator and every split of it: the store server
// (rank 0), the store client and the TCP device (one event loop thread for all contexts of this process).
struct Bootstrap {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStore> store;
  std::shared_ptr<gloo::transport::Device> device;

  // Every context of this world in this process. A failure in one group ends the generation, so it closes the
  // connections of all of them: a peer blocked on us in another group (a tp peer waiting while we hit a dead dp
  // peer) then fails at once instead of at its deadline, and so on down the chain.
  std::mutex mu;
  std::vector<std::weak_ptr<gloo::Context>> contexts;
  void add(const std::shared_ptr<gloo::Context>& ctx) {
    std::lock_guard<std::mutex> lock(mu);
    contexts.push_back(ctx);
  }
  void close_all() {
    std::vector<std::shared_ptr<gloo::Context>> live;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& w : contexts) {
        if (auto c = w.lock()) live.push_back(std::move(c));
      }
    }
    for (auto& c : live) {
      try {
        c->closeConnections();
      } catch (...) {
      }
    }
  }
  ~Bootstrap() {
    device.reset();
    store.reset();
    server.reset();  // last: peers may still be reading keys while we tear down the rest
  }
};

bool looks_like_timeout(const std::string& what) {
  std::string lower = what;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

// State of one group, shared by its communicator and its pending requests (which report errors in the group's terms).
struct State {
  std::shared_ptr<Bootstrap> boot;
  std::shared_ptr<gloo::Context> ctx;
  std::string name;
  std::string prefix;  // store prefix of this group's rendezvous; splits nest under it
  int rank = 0;
  int size = 1;
  ms timeout{30000};
  bool aborted = false;
  std::string error;  // the first error; the group is unusable afterwards

  std::string where(const std::string& op) const {
    return op + " on group '" + name + "' (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  }

  void check_usable(const std::string& op) const {
    if (aborted) throw CommError(where(op) + ": communicator was aborted");
    if (!error.empty()) throw CommError(where(op) + ": communicator is unusable after an earlier error: " + error);
  }

  [[noreturn]] void fail(const std::string& op, const std::string& detail, int peer) {
    bool timed_out = looks_like_timeout(detail);
    std::string msg =
        where(op) + ": " +
        (timed_out ? "timed out after " + std::to_string(timeout.count()) + " ms" : std::string("failed")) +
        (peer >= 0 ? " waiting for rank " + std::to_string(peer) : std::string()) + " (" + detail + ")";
    if (error.empty()) error = msg;
    // Close our side so that peers blocked on us (in this group or any other of this world) fail now instead of at
    // their own deadline.
    if (boot) boot->close_all();
    if (timed_out) throw CommTimeout(msg);
    throw CommError(msg);
  }

  template <class F>
  void guarded(const std::string& op, int peer, F&& f) {
    check_usable(op);
    try {
      f();
    } catch (const CommError& e) {
      if (!error.empty()) throw;  // ours, already in the group's terms
      fail(op, e.what(), peer);   // the store's: say which group was bootstrapping
    } catch (const std::invalid_argument&) {
      throw;
    } catch (const std::exception& e) {  // gloo::IoException, gloo::EnforceNotMet, our store's errors
      fail(op, e.what(), peer);
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------------
// Reductions. bf16 never reaches these: it is widened to fp32 first.
template <typename T>
void reduce_sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}
template <typename T>
void reduce_max(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] < y[i] ? y[i] : x[i];
}
template <typename T>
gloo::AllreduceOptions::Func reduce_fn(ReduceOp op) {
  return op == ReduceOp::kMax ? &reduce_max<T> : &reduce_sum<T>;
}
template <typename T>
void divide(T* p, size_t n, int by) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(by));
}

std::vector<float> widen(const void* p, size_t n) {
  std::vector<float> out(n);
  auto* h = static_cast<const uint16_t*>(p);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(h[i]);
  return out;
}
void narrow(const float* p, size_t n, void* dst) {
  auto* h = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(p[i]);
}

void check_op(DType dtype, ReduceOp op, const char* where) {
  if (static_cast<int>(dtype) > static_cast<int>(DType::kInt64)) {
    throw std::invalid_argument(std::string(where) + ": unknown dtype " + std::to_string(static_cast<int>(dtype)));
  }
  if (static_cast<int>(op) > static_cast<int>(ReduceOp::kMax)) {
    throw std::invalid_argument(std::string(where) + ": unknown reduce op " + std::to_string(static_cast<int>(op)));
  }
}

// ---------------------------------------------------------------------------------------------------------------------
class GlooRequest : public Request {
 public:
  GlooRequest(std::shared_ptr<State> st, std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool is_send, int peer)
      : st_(std::move(st)), buf_(std::move(buf)), is_send_(is_send), peer_(peer) {}
  ~GlooRequest() override {
    try {
      wait();
    } catch (...) {  // documented: errors of a request nobody waited on are swallowed (the group is broken anyway)
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    if (!buf_) return;  // count 0
    const char* op = is_send_ ? "send" : "recv";
    st_->guarded(op, peer_, [&] {
      bool ok = is_send_ ? buf_->waitSend(st_->timeout) : buf_->waitRecv(st_->timeout);
      if (!ok) throw std::runtime_error("wait was aborted");
    });
  }

 private:
  std::shared_ptr<State> st_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool is_send_;
  int peer_;
  bool done_ = false;
};

// ---------------------------------------------------------------------------------------------------------------------
class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<State> st) : st_(std::move(st)) {}

  int rank() const override { return st_->rank; }
  int size() const override { return st_->size; }
  const std::string& name() const override { return st_->name; }
  std::chrono::milliseconds timeout() const override { return st_->timeout; }

  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    check_op(dtype, op, "all_reduce");
    st_->check_usable("all_reduce");
    if (count == 0 || st_->size == 1) return;  // avg over one rank is the identity
    st_->guarded("all_reduce", -1, [&] {
      switch (dtype) {
        case DType::kFloat32:
          reduce_typed(static_cast<float*>(buf), count, op);
          break;
        case DType::kBFloat16: {
          auto wide = widen(buf, count);
          reduce_typed(wide.data(), count, op);
          narrow(wide.data(), count, buf);
          break;
        }
        case DType::kInt32:
          reduce_typed(static_cast<int32_t*>(buf), count, op);
          break;
        case DType::kInt64:
          reduce_typed(static_cast<int64_t*>(buf), count, op);
          break;
      }
    });
  }

  void reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    check_op(dtype, op, "reduce_scatter");
    st_->check_usable("reduce_scatter");
    if (count == 0) return;
    st_->guarded("reduce_scatter", -1, [&] {
      switch (dtype) {
        case DType::kFloat32:
          ring_reduce_scatter(static_cast<const float*>(in), static_cast<float*>(out), count, op);
          break;
        case DType::kBFloat16: {
          auto wide = widen(in, count * static_cast<size_t>(st_->size));
          std::vector<float> result(count);
          ring_reduce_scatter(wide.data(), result.data(), count, op);
          narrow(result.data(), count, out);
          break;
        }
        case DType::kInt32:
          ring_reduce_scatter(static_cast<const int32_t*>(in), static_cast<int32_t*>(out), count, op);
          break;
        case DType::kInt64:
          ring_reduce_scatter(static_cast<const int64_t*>(in), static_cast<int64_t*>(out), count, op);
          break;
      }
    });
  }

  void all_gather(const void* in, void* out, size_t count, DType dtype) override {
    check_op(dtype, ReduceOp::kSum, "all_gather");
    st_->check_usable("all_gather");
    if (count == 0) return;
    const size_t bytes = count * dtype_size(dtype);
    auto* own = static_cast<char*>(out) + static_cast<size_t>(st_->rank) * bytes;
    if (in != own) std::memmove(own, in, bytes);
    if (st_->size == 1) return;
    st_->guarded("all_gather", -1, [&] {
      // In place: our chunk is already in `out`, so Gloo gets no input buffer.
      gloo::AllgatherOptions opts(st_->ctx);
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), bytes * static_cast<size_t>(st_->size));
      opts.setTimeout(st_->timeout);
      gloo::allgather(opts);
    });
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    check_op(dtype, ReduceOp::kSum, "broadcast");
    check_peer(root, "broadcast", "root", true);
    st_->check_usable("broadcast");
    if (count == 0 || st_->size == 1) return;
    st_->guarded("broadcast", root == st_->rank ? -1 : root, [&] {
      gloo::BroadcastOptions opts(st_->ctx);
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(buf), count * dtype_size(dtype));
      opts.setRoot(root);
      opts.setTimeout(st_->timeout);
      gloo::broadcast(opts);
    });
  }

  void all_to_all(const void* in, void* out, size_t count, DType dtype) override {
    check_op(dtype, ReduceOp::kSum, "all_to_all");
    st_->check_usable("all_to_all");
    if (count == 0) return;
    const size_t total = count * dtype_size(dtype) * static_cast<size_t>(st_->size);
    if (st_->size == 1) {
      std::memmove(out, in, total);
      return;
    }
    st_->guarded("all_to_all", -1, [&] {
      std::vector<uint8_t> copy;
      const void* src = in;
      if (in == out) {  // Gloo reads and writes concurrently: never in place
        copy.assign(static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + total);
        src = copy.data();
      }
      gloo::AlltoallOptions opts(st_->ctx);
      opts.setInput<uint8_t>(const_cast<uint8_t*>(static_cast<const uint8_t*>(src)), total);
      opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), total);
      opts.setTimeout(st_->timeout);
      gloo::alltoall(opts);
    });
  }

  std::unique_ptr<Request> isend(const void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    return post(const_cast<void*>(buf), count, dtype, peer, tag, true);
  }
  std::unique_ptr<Request> irecv(void* buf, size_t count, DType dtype, int peer, uint32_t tag) override {
    return post(buf, count, dtype, peer, tag, false);
  }

  void barrier() override {
    st_->check_usable("barrier");
    if (st_->size == 1) return;
    st_->guarded("barrier", -1, [&] {
      gloo::BarrierOptions opts(st_->ctx);
      opts.setTimeout(st_->timeout);
      gloo::barrier(opts);
    });
  }

  std::unique_ptr<Communicator> split(const std::vector<int>& ranks, const std::string& name) override {
    const std::string op = "split '" + name + "'";
    if (name.empty()) throw std::invalid_argument(st_->where(op) + ": name is empty");
    const int sub_rank = split_index(ranks, st_->rank, st_->size, st_->where(op));
    st_->check_usable(op);
    auto sub = std::make_shared<State>();
    sub->boot = st_->boot;
    sub->name = name;
    // Counter first: every member calls split in the same order, so the n-th split agrees across ranks; the rank
    // list tells apart the disjoint groups that one call creates.
    sub->prefix = st_->prefix + "/" + std::to_string(splits_++) + "." + name + rank_list(ranks);
    sub->rank = sub_rank;
    sub->size = static_cast<int>(ranks.size());
    sub->timeout = st_->timeout;
    st_->guarded(op, -1, [&] { sub->ctx = make_context(*sub); });
    sub->boot->add(sub->ctx);
    auto comm = std::make_unique<GlooCommunicator>(sub);
    comm->barrier();  // every member finished its rendezvous before anyone may tear the store down
    return comm;
  }

  void abort() override {
    st_->aborted = true;
    try {
      if (st_->ctx) st_->ctx->closeConnections();
    } catch (...) {
    }
  }

  static std::shared_ptr<gloo::Context> make_context(const State& st) {
    auto ctx = std::make_shared<gloo::rendezvous::Context>(st.rank, st.size);
    ctx->setTimeout(st.timeout);
    gloo::rendezvous::PrefixStore store(st.prefix, *st.boot->store);
    ctx->connectFullMesh(store, st.boot->device);
    return ctx;
  }

 private:
  void check_peer(int peer, const char* op, const char* what, bool self_ok) const {
    if (peer < 0 || peer >= st_->size || (!self_ok && peer == st_->rank)) {
      throw std::invalid_argument(st_->where(op) + ": " + what + " " + std::to_string(peer) + " is not " +
                                  (self_ok ? "" : "another ") + "rank of the group (size " + std::to_string(st_->size) +
                                  ")");
    }
  }

  template <typename T>
  void reduce_typed(T* buf, size_t count, ReduceOp op) {
    gloo::AllreduceOptions opts(st_->ctx);
    opts.setOutput<T>(buf, count);
    opts.setReduceFunction(reduce_fn<T>(op));
    opts.setTimeout(st_->timeout);
    gloo::allreduce(opts);
    if (op == ReduceOp::kAvg) divide(buf, count, st_->size);
  }

  // Ring reduce-scatter: in step s a rank receives from its left neighbour the partial reduction of chunk
  // (rank - 2 - s) mod n, adds its own input chunk and passes the sum on to the right; after n-1 steps it holds the
  // full reduction of chunk rank(). Each rank sends (n-1)/n of the data once (NCCL's ring), and needs two chunks of
  // scratch, never a copy of the whole input. Gloo's own ReduceScatterHalvingDoubling uses the old bound-buffer API
  // without per-operation deadlines, hence this.
  template <typename T>
  void ring_reduce_scatter(const T* in, T* out, size_t count, ReduceOp op) {
    const int n = st_->size, r = st_->rank;
    const size_t bytes = count * sizeof(T);
    auto chunk = [&](int i) { return in + static_cast<size_t>(((i % n) + n) % n) * count; };
    if (n == 1) {
      std::memmove(out, in, bytes);
      return;
    }
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    std::vector<T> incoming(count), partial(count);
    auto recv_buf = st_->ctx->createUnboundBuffer(incoming.data(), bytes);
    auto partial_buf = st_->ctx->createUnboundBuffer(partial.data(), bytes);
    // Step 0 sends our own input chunk as it is (Gloo only reads a send buffer).
    auto first_buf = st_->ctx->createUnboundBuffer(const_cast<T*>(chunk(r - 1)), bytes);
    auto deadline = Clock::now() + st_->timeout;
    auto remaining = [&] { return std::max(ms(1), std::chrono::duration_cast<ms>(deadline - Clock::now())); };
    for (int s = 0; s < n - 1; ++s) {
      auto& send_buf = s == 0 ? first_buf : partial_buf;
      recv_buf->recv(left, kReduceScatterSlot);
      send_buf->send(right, kReduceScatterSlot);
      if (!recv_buf->waitRecv(remaining())) throw std::runtime_error("recv from rank " + std::to_string(left));
      if (!send_buf->waitSend(remaining())) throw std::runtime_error("send to rank " + std::to_string(right));
      // The send has completed, so `partial` may be overwritten with what goes out next (or, last, the result).
      T* dst = s == n - 2 ? out : partial.data();
      if (op == ReduceOp::kMax) {
        reduce_max<T>(dst, chunk(r - 2 - s), incoming.data(), count);
      } else {
        reduce_sum<T>(dst, chunk(r - 2 - s), incoming.data(), count);
      }
    }
    if (op == ReduceOp::kAvg) divide(out, count, n);
  }

  std::unique_ptr<Request> post(void* buf, size_t count, DType dtype, int peer, uint32_t tag, bool is_send) {
    const char* op = is_send ? "isend" : "irecv";
    check_op(dtype, ReduceOp::kSum, op);
    check_peer(peer, op, "peer", false);
    st_->check_usable(op);
    std::unique_ptr<gloo::transport::UnboundBuffer> ub;
    if (count > 0) {
      st_->guarded(op, peer, [&] {
        ub = st_->ctx->createUnboundBuffer(buf, count * dtype_size(dtype));
        if (is_send) {
          ub->send(peer, kP2pSlot | tag);
        } else {
          ub->recv(peer, kP2pSlot | tag);
        }
      });
    }
    return std::make_unique<GlooRequest>(st_, std::move(ub), is_send, peer);
  }

  std::shared_ptr<State> st_;
  int splits_ = 0;
};

int env_int(const char* var, const std::string& fallback, int lo, int hi, const char* fix) {
  std::string v = env_or(var, fallback);
  if (v.empty()) throw ConfigError(std::string(var) + " is not set: " + fix);
  size_t pos = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos != v.size() || x < lo || x > hi) {
    throw ConfigError(std::string(var) + "='" + v + "' is not an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]: " + fix);
  }
  return static_cast<int>(x);
}

}  // namespace

std::unique_ptr<Communicator> connect_gloo(const GlooOptions& o) {
  if (o.size < 1) throw std::invalid_argument("GlooOptions.size = " + std::to_string(o.size) + ": must be >= 1");
  if (o.rank < 0 || o.rank >= o.size) {
    throw std::invalid_argument("GlooOptions.rank = " + std::to_string(o.rank) + ": must be in [0, " +
                                std::to_string(o.size) + ")");
  }
  if (o.store_port < 1 || o.store_port > 65535) {
    throw std::invalid_argument("GlooOptions.store_port = " + std::to_string(o.store_port) +
                                ": must be in 1..65535 (MASTER_PORT)");
  }
  if (o.timeout.count() <= 0) throw std::invalid_argument("GlooOptions.timeout must be positive");
  if (o.prefix.empty()) throw std::invalid_argument("GlooOptions.prefix is empty (one per generation, e.g. g0)");
  // A peer that vanished mid-write must be an error on this rank, not a SIGPIPE that kills it. Only when nobody
  // installed a handler: an application's own choice wins.
  static std::once_flag sigpipe_once;
  std::call_once(sigpipe_once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  });

  auto boot = std::make_shared<Bootstrap>();
  if (o.serve_store && o.rank == 0) {
    boot->server = std::make_unique<TcpStoreServer>(o.store_host, o.store_port, o.timeout, o.store_token, o.store_tls);
    log::info("comm", "serving the bootstrap store",
              {{"address", o.store_host + ":" + std::to_string(o.store_port)},
               {"prefix", o.prefix},
               {"token", o.store_token.empty() ? "none" : "required"},
               {"tls", o.store_tls ? "on" : "off"}});
  }
  boot->store = std::make_unique<TcpStore>(o.store_host, o.store_port, o.prefix, o.timeout, o.store_token, o.store_tls);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.bind_host;
    boot->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError("gloo: cannot open a TCP device on '" + o.bind_host +
                    "' (RAILYARD_POD_IP / GlooOptions.bind_host must be an address of this host): " + e.what());
  }
  auto st = std::make_shared<State>();
  st->boot = boot;
  st->name = o.name;
  st->prefix = "world";
  st->rank = o.rank;
  st->size = o.size;
  st->timeout = o.timeout;
  st->guarded("connect", -1, [&] { st->ctx = GlooCommunicator::make_context(*st); });
  boot->add(st->ctx);
  auto comm = std::make_unique<GlooCommunicator>(st);
  comm->barrier();
  log::debug("comm", "gloo group connected",
             {{"group", o.name},
              {"rank", std::to_string(o.rank)},
              {"size", std::to_string(o.size)},
              {"timeout_ms", std::to_string(o.timeout.count())}});
  return comm;
}

GlooOptions gloo_options_from_env() {
  GlooOptions o;
  o.size = env_int(pod_env::kWorldSize, "", 1, 1 << 20, "set it to the number of ranks");
  o.rank = env_int(pod_env::kRank, "", 0, o.size - 1, "set it to this process's global rank, below WORLD_SIZE");
  o.store_host = env_or(pod_env::kMasterAddr, "");
  if (o.store_host.empty()) throw ConfigError("MASTER_ADDR is not set: set it to the address of rank 0");
  o.store_port = env_int(pod_env::kMasterPort, "", 1, 65535, "set it to the port where rank 0 serves the store");
  int gen = env_int(flash::kGenerationEnv, "0", 0, 1 << 30, "set it to the rendezvous generation (an integer)");
  char prefix[24];  // snprintf, not "g" + to_string: GCC 12 emits a false -Wrestrict for that concatenation
  std::snprintf(prefix, sizeof prefix, "g%d", gen);
  o.prefix = prefix;
  o.timeout = ms(env_int(pod_env::kCommTimeoutMs, "30000", 1, 24 * 3600 * 1000,
                         "set it to the collective deadline in milliseconds"));
  o.store_token = env_or(pod_env::kStoreToken, "");
  o.store_tls = tls::pod_identity_from_env();
  o.bind_host = env_or(pod_env::kPodIp, "");
  if (o.bind_host.empty()) {
    if (o.store_host.rfind("127.", 0) == 0 || o.store_host == "localhost") {
      o.bind_host = "127.0.0.1";
    } else {
      throw ConfigError("RAILYARD_POD_IP is not set and MASTER_ADDR '" + o.store_host +
                        "' is not loopback: set RAILYARD_POD_IP to this pod's IP (downward API status.podIP)");
    }
  }
  return o;
}

}  // namespace railyard::worker::comm
