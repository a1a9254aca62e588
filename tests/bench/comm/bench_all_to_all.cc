// All-to-all bus bandwidth, flat vs hierarchical, on loopback (ranks are threads of this process, each with its own
// Gloo communicator over real TCP sockets), side by side per size in one run: for each size the two algorithms
// alternate iteration by iteration, so machine noise hits both alike. Then the planner's predicted time of both
// schemes for the same sizes on an H100 rail topology (planner/moe_cost.h), i.e. the gain the hierarchical
// scheme is expected to bring where NVLink and rails exist; loopback has neither, so the measured ratio says what the
// extra pass costs when every link is the same. busbw = (n-1)/n * bytes per rank / time (nccl-tests' alltoall).
// Usage: bench_comm_all_to_all [max_kib=16384] [layouts=2x2,2x4]   (layout = nodes x local ranks)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "planner/calibration.h"
#include "planner/moe_cost.h"
#include "worker/comm/all_to_all.h"
#include "worker/comm/local_world.h"

using namespace railyard::worker::comm;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const size_t max_kib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 16384;
  std::vector<std::pair<int, int>> layouts{{2, 2}, {2, 4}};
  if (argc > 2) {
    layouts.clear();
    for (char* p = argv[2]; *p;) {
      const int nodes = static_cast<int>(std::strtol(p, &p, 10));
      if (*p == 'x') ++p;
      const int local = static_cast<int>(std::strtol(p, &p, 10));
      layouts.push_back({nodes, local});
      if (*p == ',') ++p;
    }
  }
  std::printf("# Gloo all_to_all on 127.0.0.1, ranks as threads; median of the iterations; bytes = per rank\n");
  std::printf("%-8s %-10s %-6s %-11s %-11s %-13s %-13s %-8s\n", "layout", "size", "iters", "flat_ms", "hier_ms",
              "flat_busbw", "hier_busbw", "hier/flat");
  for (auto [nodes, local] : layouts) {
    const int n = nodes * local;
    for (size_t kib = 64; kib <= max_kib; kib *= 4) {
      const size_t bytes = kib << 10, count = bytes / sizeof(float) / n * n;
      const int iters = kib <= 1024 ? 20 : kib <= 16384 ? 6 : 3;
      std::vector<double> tf, th;
      run_local_world(
          n,
          [&](Communicator& c) {
            FlatAllToAll flat(c);
            HierarchicalAllToAll hier(c, local);
            std::vector<float> in(count, static_cast<float>(c.rank())), out(count);
            flat.run(in.data(), out.data(), count / n, DType::kFloat32);  // warm-up: connections, page faults
            hier.run(in.data(), out.data(), count / n, DType::kFloat32);
            for (int i = 0; i < iters; ++i) {
              for (AllToAll* a : {static_cast<AllToAll*>(&flat), static_cast<AllToAll*>(&hier)}) {
                c.barrier();
                const auto t0 = Clock::now();
                a->run(in.data(), out.data(), count / n, DType::kFloat32);
                int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
                c.all_reduce(&ns, 1, DType::kInt64, ReduceOp::kMax);  // the slowest rank defines the time
                if (c.rank() == 0) (a == &flat ? tf : th).push_back(static_cast<double>(ns) / 1e9);
              }
              if (out[(count / n) * (n - 1)] != static_cast<float>(n - 1)) {
                std::fprintf(stderr, "wrong all_to_all result\n");
                std::abort();
              }
            }
          },
          LocalWorldOptions{std::chrono::milliseconds(300000)});
      std::sort(tf.begin(), tf.end());
      std::sort(th.begin(), th.end());
      const double f = tf[tf.size() / 2], h = th[th.size() / 2];
      const double moved = static_cast<double>(count * sizeof(float)) * (n - 1) / n / 1e9;
      std::printf("%-8s %-10s %-6d %-11.3f %-11.3f %-13.3f %-13.3f %-8.2f\n",
                  (std::to_string(nodes) + "x" + std::to_string(local)).c_str(), (std::to_string(kib) + "KiB").c_str(),
                  iters, f * 1e3, h * 1e3, moved / f, moved / h, h / f);
      std::fflush(stdout);
    }
  }
  // The planner's prediction on the rail topology (h100 profile, 8 GPUs per node, one NIC per GPU).
  std::printf("\n# planner (h100 profile, 8 GPUs/node, rail topology): predicted all_to_all time per size\n");
  std::printf("%-10s %-10s %-12s %-12s %-10s %-8s\n", "gpus", "size", "flat_us", "hier_us", "flat/hier", "choice");
  railyard::plan::Cluster c;
  c.device = railyard::plan::builtin_profile("h100");
  c.topology.gpus_per_node = 8;
  for (int gpus : {16, 64}) {
    c.gpus = gpus;
    for (size_t kib = 64; kib <= 262144; kib *= 4) {
      const auto a = railyard::plan::all_to_all_cost(c, gpus, static_cast<double>(kib) * 1024);
      std::printf("%-10d %-10s %-12.1f %-12.1f %-10.2f %-8s\n", gpus, (std::to_string(kib) + "KiB").c_str(),
                  a.flat * 1e6, a.hierarchical * 1e6, a.flat / a.hierarchical, a.use_hierarchical ? "hier" : "flat");
    }
  }
  c.topology.leaf_bandwidth_factor = 0.5;  // a 2:1 oversubscribed leaf for rail changes
  c.gpus = 16;
  std::printf("# with leaf_bandwidth_factor 0.5 (rail changes at half bandwidth), 16 GPUs:\n");
  for (size_t kib = 64; kib <= 262144; kib *= 4) {
    const auto a = railyard::plan::all_to_all_cost(c, 16, static_cast<double>(kib) * 1024);
    std::printf("%-10d %-10s %-12.1f %-12.1f %-10.2f %-8s\n", 16, (std::to_string(kib) + "KiB").c_str(), a.flat * 1e6,
                a.hierarchical * 1e6, a.flat / a.hierarchical, a.use_hierarchical ? "hier" : "flat");
  }
  return 0;
}
