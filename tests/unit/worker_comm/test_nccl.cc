// The NCCL backend. Without a GPU (this machine, CI) it checks that the library links and that connecting fails
// with one clear error naming the CUDA call; with GPUs it checks all-reduce and all-gather against host values.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "tests/cuda_gpus.h"
#include "tests/unit/worker_comm/nccl_test_world.h"
#include "worker/comm/connect.h"
#include "worker/comm/nccl_bootstrap.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/tcp_store.h"

using namespace railyard::worker::comm;
using railyard::test::usable_gpus;

TEST_CASE("connect_nccl without a usable GPU fails with a CommError naming the CUDA call") {
  if (usable_gpus() > 0) return;  // the next test covers real devices
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
  const int n = std::min(usable_gpus(), 4);
  if (n == 0) return;
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        auto comm = connect_nccl(testing::store_client(server.port(), r, n), r);
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

// The bootstrap's store protocol runs without a GPU: ncclGetUniqueId needs none (checked 2026-11-25 with NCCL 2.28 on
// this GPU-less machine), and the exchange is plain store traffic.
TEST_CASE("NCCL bootstrap: rank 0's ncclUniqueId reaches every rank through the store, scoped to the generation") {
  TcpStoreServer server("127.0.0.1", 0);
  // NCCL's bootstrap stays on loopback in tests (docs/parallel.md): the id then names 127.0.0.1.
  ::setenv("NCCL_COMM_ID", ("127.0.0.1:" + std::to_string(server.port() + 1)).c_str(), 0);
  constexpr int kRanks = 3;
  std::vector<std::vector<char>> got(kRanks);
  std::vector<char> made;
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r) {
    ts.emplace_back([&, r] {
      TcpStore store("127.0.0.1", server.port(), "g4", std::chrono::milliseconds(5000));
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others wait for the key
      got[static_cast<size_t>(r)] = exchange_nccl_id(store, r, 128, [&] { return made = nccl_unique_id(); });
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(made.size() == 128);
  for (const auto& g : got) CHECK(g == made);
  CHECK(std::any_of(made.begin(), made.end(), [](char c) { return c != 0; }));

  // Another generation never reads it: its ranks wait for their own rank 0, and say which key is missing.
  TcpStore g5("127.0.0.1", server.port(), "g5", std::chrono::milliseconds(300));
  CHECK_THROWS_WITH_AS(exchange_nccl_id(g5, 1, 128, [] { return std::vector<char>(128); }),
                       doctest::Contains("[nccl_id] under prefix 'g5'"), CommTimeout);
  // A value of the wrong size (a stray writer, another NCCL version on rank 0) is refused naming the key.
  TcpStore g6("127.0.0.1", server.port(), "g6", std::chrono::milliseconds(300));
  g6.set("nccl_id", std::vector<char>(5, 'x'));
  CHECK_THROWS_WITH_AS(exchange_nccl_id(g6, 1, 128, [] { return std::vector<char>(128); }),
                       doctest::Contains("g6/nccl_id holds 5 bytes"), CommError);
  CHECK_THROWS_AS(exchange_nccl_id(g6, 0, 128, [] { return std::vector<char>(7); }), std::invalid_argument);
}

TEST_CASE("connect_worker_groups: Gloo groups on the CPU; on CUDA the NCCL world after them, through the same store") {
  int port, port2;  // generation 2 on another port: a rank must not reach generation 1's server as it closes
  {
    TcpStoreServer probe("127.0.0.1", 0), probe2("127.0.0.1", 0);
    port = probe.port();
    port2 = probe2.port();
  }
  const Layout layout{2, 1, 1};
  std::vector<std::string> errors(2);
  std::vector<float> sums(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      GlooOptions o;
      o.store_port = port;
      o.rank = r;
      o.size = 2;
      o.timeout = std::chrono::milliseconds(10000);
      o.prefix = "g1";
      {
        WorkerGroups g = connect_worker_groups(railyard::worker::DeviceKind::kCpu, layout, o, 0);
        CHECK(g.device == nullptr);
        CHECK(&g.tensors() == g.host.get());
        float x = static_cast<float>(r + 1);
        g.tensors().dp().all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
        sums[static_cast<size_t>(r)] = x;
      }
      if (usable_gpus() > 0) return;
      // CUDA without a GPU: the Gloo world of generation 2 comes up (rank 0 serves its store), then NCCL fails on
      // every rank naming the CUDA call, never a hang.
      o.prefix = "g2";
      o.store_port = port2;
      try {
        connect_worker_groups(railyard::worker::DeviceKind::kCuda, layout, o, 0, connect_nccl);
        errors[static_cast<size_t>(r)] = "no error";
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(sums == std::vector<float>{3.0f, 3.0f});
  if (usable_gpus() == 0) {
    for (const auto& e : errors) {
      INFO(e);
      CHECK(e.find("cudaSetDevice(0)") != std::string::npos);
    }
  }
  CHECK(cuda_device_for(1, 2) == 1);
  CHECK_THROWS_WITH_AS(cuda_device_for(2, 2), doctest::Contains("LOCAL_RANK=2"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(cuda_device_for(0, 0), doctest::Contains("0 GPU(s)"), railyard::ConfigError);
}
