// The NCCL backend on real GPUs (label gpu; tests/gpu/run.sh runs it). Without at least 2 usable GPUs it prints why
// and exits 77, which CTest reports as Skipped. Ranks are threads, one GPU each (up to 4); NCCL's bootstrap stays
// on 127.0.0.1: NCCL_COMM_ID is set to a fresh loopback port per world and NCCL_SOCKET_IFNAME to lo (unless the
// caller set them), so nothing listens on the machine's other addresses.
//  1. equivalence with the Gloo backend: every Communicator operation, on the same inputs, gives the same result over
//     NCCL (device buffers) as over Gloo (host buffers), for fp32, bf16 and int32, in the world and in split groups;
//  2. the watchdog: a rank that never joins a collective makes the others fail with CommTimeout naming the operation
//     and the group, within the deadline plus a generous margin, and the communicator refuses later calls.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda_gpus.h"
#include "tests/unit/worker_comm/nccl_test_world.h"
#include "worker/comm/bf16.h"
#include "worker/comm/local_world.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/tcp_store.h"

using namespace railyard::worker::comm;
using namespace std::chrono_literals;

namespace {

// NCCL refuses two ranks on one GPU: 2 or more, and up to 4 ranks.
int ranks() {
  static const int n = std::min(railyard::test::require_gpus("worker_comm_nccl_gpu", 2, "NCCL"), 4);
  return n;
}

// The world of every test here: its store keys under one prefix (testing::run_nccl_world).
std::vector<std::string> run_nccl_world(int n, std::chrono::milliseconds timeout,
                                        const std::function<void(Communicator&)>& fn) {
  return testing::run_nccl_world(n, timeout, "nccl-gpu-test", fn);
}

// A buffer the scenario works on: host memory under Gloo, device memory under NCCL (copied in and out).
struct Buffers {
  explicit Buffers(bool on_device) : device(on_device) {}
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  bool device;
  std::vector<void*> owned;
  ~Buffers() {
    for (void* p : owned)
      if (device) cudaFree(p);
  }
  template <class T>
  T* put(std::vector<T>& host) {
    if (!device) return host.data();
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, host.size() * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    owned.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T>
  void get(std::vector<T>& host, const T* p) {
    if (!device) return;
    REQUIRE(cudaMemcpy(host.data(), p, host.size() * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  }
};

// Every operation of the Communicator interface; returns the rank's results as named byte strings. Values are small
// integers (exact in fp32 and bf16, so sums do not depend on the reduction order) except the avg inputs.
using Results = std::map<std::string, std::vector<unsigned char>>;
template <class T>
void keep(Results& out, const std::string& name, const std::vector<T>& v) {
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  out[name].assign(b, b + v.size() * sizeof(T));
}

Results scenario(Communicator& c, bool device) {
  Buffers mem(device);
  Results out;
  const int r = c.rank(), n = c.size();
  const size_t count = 1000;  // not a multiple of anything NCCL chunks by
  {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i)
        v[i] = op == ReduceOp::kAvg ? 0.25f * static_cast<float>((r + 1) * (i % 13))
                                    : static_cast<float>((r * 7 + i) % 23);
      float* d = mem.put(v);
      c.all_reduce(d, count, DType::kFloat32, op);
      mem.get(v, d);
      keep(out, "all_reduce f32 op" + std::to_string(static_cast<int>(op)), v);
    }
  }
  {
    std::vector<uint16_t> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = float_to_bf16(static_cast<float>((r + i) % 9));
    uint16_t* d = mem.put(v);
    c.all_reduce(d, count, DType::kBFloat16, ReduceOp::kSum);
    mem.get(v, d);
    keep(out, "all_reduce bf16", v);
  }
  {
    std::vector<int32_t> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i) * (r + 1) - 500;
    int32_t* d = mem.put(v);
    c.all_reduce(d, count, DType::kInt32, ReduceOp::kSum);
    mem.get(v, d);
    keep(out, "all_reduce i32", v);
  }
  {
    std::vector<float> in(count * static_cast<size_t>(n)), o(count);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i + static_cast<size_t>(r)) % 17);
    float* din = mem.put(in);
    float* dout = mem.put(o);
    c.reduce_scatter(din, dout, count, DType::kFloat32, ReduceOp::kSum);
    mem.get(o, dout);
    keep(out, "reduce_scatter", o);
  }
  {
    std::vector<float> in(count), o(count * static_cast<size_t>(n));
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
    float* din = mem.put(in);
    float* dout = mem.put(o);
    c.all_gather(din, dout, count, DType::kFloat32);
    mem.get(o, dout);
    keep(out, "all_gather", o);
  }
  {
    std::vector<float> v(count, static_cast<float>(r + 1));
    float* d = mem.put(v);
    c.broadcast(d, count, DType::kFloat32, n - 1);
    mem.get(v, d);
    keep(out, "broadcast", v);
  }
  {
    std::vector<float> in(count * static_cast<size_t>(n)), o(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r * 100000 + static_cast<int>(i));
    float* din = mem.put(in);
    float* dout = mem.put(o);
    c.all_to_all(din, dout, count, DType::kFloat32);
    mem.get(o, dout);
    keep(out, "all_to_all", o);
  }
  {
    // A ring exchange: isend right, irecv left, wait both (the NCCL backend launches them as one group).
    std::vector<float> send(count, static_cast<float>(r)), recv(count, -1.f);
    float* ds = mem.put(send);
    float* dr = mem.put(recv);
    auto s = c.isend(ds, count, DType::kFloat32, (r + 1) % n, 5);
    auto q = c.irecv(dr, count, DType::kFloat32, (r + n - 1) % n, 5);
    s->wait();
    q->wait();
    mem.get(recv, dr);
    keep(out, "ring", recv);
  }
  c.barrier();
  {
    // Two disjoint groups of one split call (evens and odds), each reducing its own values.
    std::vector<int> mine;
    for (int k = r % 2; k < n; k += 2) mine.push_back(k);
    auto g = c.split(mine, r % 2 ? "odd" : "even");
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * (i % 5));
    float* d = mem.put(v);
    g->all_reduce(d, count, DType::kFloat32, ReduceOp::kSum);
    mem.get(v, d);
    keep(out, "split all_reduce", v);
    CHECK(g->name() == (r % 2 ? "odd" : "even"));
  }
  return out;
}

}  // namespace

TEST_CASE("every Communicator operation gives the same result over NCCL as over Gloo") {
  const int n = ranks();
  std::vector<Results> gloo(static_cast<size_t>(n)), nccl(static_cast<size_t>(n));
  std::mutex mu;
  run_local_world(n, [&](Communicator& c) {
    Results r = scenario(c, false);
    std::lock_guard lock(mu);
    gloo[static_cast<size_t>(c.rank())] = std::move(r);
  });
  auto errors = run_nccl_world(n, 60s, [&](Communicator& c) {
    Results r = scenario(c, true);
    std::lock_guard lock(mu);
    nccl[static_cast<size_t>(c.rank())] = std::move(r);
  });
  for (const auto& e : errors) CHECK(e == "");
  for (int r = 0; r < n; ++r) {
    REQUIRE(gloo[r].size() == nccl[r].size());
    for (const auto& kv : gloo[r]) {  // not a structured binding: doctest's message lambdas capture it (clang < 16)
      const std::string& name = kv.first;
      const std::vector<unsigned char>& bytes = kv.second;
      if (name.find("op" + std::to_string(static_cast<int>(ReduceOp::kAvg))) != std::string::npos) {
        // Avg: NCCL divides (or pre-multiplies) in its own order; compare as floats to 1 ulp-ish.
        const auto* a = reinterpret_cast<const float*>(bytes.data());
        const auto* b = reinterpret_cast<const float*>(nccl[r][name].data());
        for (size_t i = 0; i < bytes.size() / sizeof(float); ++i)
          REQUIRE_MESSAGE(std::abs(a[i] - b[i]) <= 1e-6f * (1 + std::abs(a[i])), name << " rank " << r << " at " << i);
      } else {
        CHECK_MESSAGE(nccl[r][name] == bytes, name << " differs on rank " << r);
      }
    }
  }
}

TEST_CASE("a rank that never joins makes the watchdog abort the collective and name it") {
  const int n = ranks();
  const auto timeout = 3000ms;
  std::vector<double> seconds(static_cast<size_t>(n), 0);
  std::vector<std::string> later(static_cast<size_t>(n));
  std::atomic<int> finished{0};
  auto errors = run_nccl_world(n, timeout, [&](Communicator& c) {
    const size_t count = 1 << 20;
    void* d = nullptr;
    REQUIRE(cudaMalloc(&d, count * sizeof(float)) == cudaSuccess);
    if (c.rank() == n - 1) {
      // The straggler: never calls the all_reduce; stays alive until the others have given up.
      while (finished.load() < n - 1) std::this_thread::sleep_for(10ms);
      cudaFree(d);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.all_reduce(d, count, DType::kFloat32, ReduceOp::kSum);
    } catch (...) {
      seconds[static_cast<size_t>(c.rank())] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      try {
        c.barrier();
      } catch (const CommError& e) {
        later[static_cast<size_t>(c.rank())] = e.what();
      }
      finished++;
      cudaFree(d);
      throw;
    }
    finished++;
    cudaFree(d);
  });
  for (int r = 0; r < n - 1; ++r) {
    CHECK_MESSAGE(errors[r].find("all_reduce on group 'world'") != std::string::npos, errors[r]);
    CHECK_MESSAGE(errors[r].find("aborted by the watchdog") != std::string::npos, errors[r]);
    CHECK_MESSAGE(errors[r].find("4194304 bytes") != std::string::npos, errors[r]);
    CHECK(seconds[r] >= 2.9);   // not before the deadline
    CHECK(seconds[r] <= 33.0);  // the deadline plus a generous margin: the abort freed the GPU
    CHECK_MESSAGE(later[r].find("unusable after an earlier error") != std::string::npos, later[r]);
  }
  CHECK(errors[n - 1] == "");
}

// The data-parallel reducer on CUDA (nccl_stream_reducer): buckets written by work on another stream (the compute
// stream) are reduced only after that work, while later work goes on; after wait() the compute stream sees the sums.
// The producer is a slow chain of async copies on the compute stream, so a reduction that did not wait for it would
// read stale values.
TEST_CASE("nccl_stream_reducer: buckets ordered after the compute stream's work, sums visible after wait()") {
  const int n = ranks();
  constexpr size_t kElems = 1 << 20, kBuckets = 4;
  const auto errors = run_nccl_world(n, 20s, [&](Communicator& c) {
    cudaStream_t compute = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
    float* buf = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&buf), kElems * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMemsetAsync(buf, 0, kElems * sizeof(float), compute) == cudaSuccess);
    auto grad = c.dup("dp-grad");
    auto reducer = nccl_stream_reducer(*grad, compute);
    std::vector<float> host(kElems);
    for (size_t i = 0; i < kElems; ++i) host[i] = static_cast<float>(c.rank() + 1) + static_cast<float>(i % 7);
    const size_t per = kElems / kBuckets;
    for (int step = 0; step < 3; ++step) {
      for (size_t b = kBuckets; b-- > 0;) {  // the top of the buffer first, as backward finishes it
        // "backward" writes bucket b on the compute stream (several copies: slow enough to race a careless reducer)
        for (int k = 0; k < 8; ++k)
          REQUIRE(cudaMemcpyAsync(buf + b * per, host.data() + b * per, per * sizeof(float), cudaMemcpyHostToDevice,
                                  compute) == cudaSuccess);
        reducer->all_reduce(buf + b * per, per, DType::kFloat32, ReduceOp::kSum);
      }
      CHECK(reducer->pending() == kBuckets);
      reducer->wait();
      CHECK(reducer->pending() == 0);
      std::vector<float> got(kElems);
      REQUIRE(cudaMemcpyAsync(got.data(), buf, kElems * sizeof(float), cudaMemcpyDeviceToHost, compute) == cudaSuccess);
      REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
      size_t bad = 0;
      for (size_t i = 0; i < kElems; ++i) {
        const float want = static_cast<float>(n * (n + 1) / 2) + static_cast<float>(n) * static_cast<float>(i % 7);
        bad += got[i] != want;
      }
      CHECK(bad == 0);
    }
    cudaFree(buf);
    cudaStreamDestroy(compute);
  });
  for (const auto& e : errors) CHECK(e.empty());
  // Not an NCCL communicator: refused by name.
  std::string refused;
  run_local_world(1, [&](Communicator& g) {
    try {
      nccl_stream_reducer(g, nullptr);
    } catch (const std::invalid_argument& e) {
      refused = e.what();
    }
  });
  CHECK(refused.find("not an NCCL communicator") != std::string::npos);
}
