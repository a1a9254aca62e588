// The NCCL backend. Without a GPU (this machine, CI) it checks that the library links and that connecting fails
// with one clear error naming the CUDA call; with GPUs it checks all-reduce and all-gather against host values.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "worker/comm/nccl_communicator.h"
#include "worker/comm/tcp_store.h"

using namespace railyard::worker::comm;

namespace {
int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
}  // namespace

TEST_CASE("connect_nccl without a usable GPU fails with a CommError naming the CUDA call") {
  if (gpu_count() > 0) return;  // the next test covers real devices
  TcpStoreServer server("127.0.0.1", 0);
  GlooOptions o;
  o.store_port = server.port();
  o.timeout = std::chrono::milliseconds(2000);
  o.serve_store = false;
  CHECK_THROWS_WITH_AS(connect_nccl(o, 0), doctest::Contains("cudaSetDevice(0)"), CommError);
  o.rank = 3;
  CHECK_THROWS_WITH_AS(connect_nccl(o, 0), doctest::Contains("GlooOptions.rank"), std::invalid_argument);
}

TEST_CASE("NCCL all_reduce and all_gather on every GPU of this host") {
  const int n = std::min(gpu_count(), 4);
  if (n == 0) return;
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        GlooOptions o;
        o.store_port = server.port();
        o.rank = r;
        o.size = n;
        o.serve_store = false;
        auto comm = connect_nccl(o, r);
        const size_t count = 1 << 20;
        std::vector<float> host(count);
        for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>((r + 1) * (i % 7));
        void* raw = nullptr;
        cudaMalloc(&raw, count * sizeof(float) * static_cast<size_t>(n));
        auto* dev = static_cast<float*>(raw);
        cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
        comm->all_reduce(dev, count, DType::kFloat32, ReduceOp::kSum);
        cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost);
        const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
        for (size_t i = 0; i < count; ++i) {
          if (host[i] != ranks_sum * static_cast<float>(i % 7)) {
            errors[static_cast<size_t>(r)] = "all_reduce wrong at " + std::to_string(i);
            break;
          }
        }
        comm->barrier();
        cudaFree(dev);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (const auto& e : errors) CHECK(e == "");
}
