// Gloo all-reduce bus bandwidth on loopback for 2 and 4 ranks (threads of this process, real TCP sockets), beside the
// memcpy rate of this machine measured in the same run. busbw = 2(n-1)/n * bytes / time (the nccl-tests convention:
// the data each rank must send and receive in a ring). Usage: bench_comm_allreduce [max_mib=256] [ranks=2,4].
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/comm/local_world.h"

using namespace railyard::worker::comm;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best of a few copies of `bytes` between two buffers touched beforehand (no page faults in the timing).
double memcpy_gbps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, seconds_since(t0));
    a[static_cast<size_t>(i)] = b[bytes - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  return static_cast<double>(bytes) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  std::vector<int> worlds{2, 4};
  if (argc > 2) {
    worlds.clear();
    for (char* p = argv[2]; *p;) {
      worlds.push_back(static_cast<int>(std::strtol(p, &p, 10)));
      if (*p == ',') ++p;
    }
  }
  std::printf("# Gloo all_reduce (fp32 sum) on 127.0.0.1, ranks as threads; times are the median of the iterations\n");
  std::printf("%-6s %-10s %-6s %-12s %-14s %-14s %-14s\n", "ranks", "size", "iters", "time_ms", "algbw_GB/s",
              "busbw_GB/s", "memcpy_GB/s");
  for (int n : worlds) {
    for (size_t mib = 1; mib <= max_mib; mib *= 4) {
      const size_t bytes = mib << 20;
      const size_t count = bytes / sizeof(float);
      const int iters = mib <= 4 ? 20 : mib <= 64 ? 6 : 3;
      std::vector<double> times;
      run_local_world(
          n,
          [&](Communicator& c) {
            std::vector<float> buf(count, 1.0f);
            c.all_reduce(buf.data(), count, DType::kFloat32, ReduceOp::kSum);  // warm-up: connections, page faults
            for (int i = 0; i < iters; ++i) {
              c.barrier();
              auto t0 = Clock::now();
              c.all_reduce(buf.data(), count, DType::kFloat32, ReduceOp::kSum);
              // The slowest rank defines the operation's time.
              int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
              c.all_reduce(&ns, 1, DType::kInt64, ReduceOp::kMax);
              if (c.rank() == 0) times.push_back(static_cast<double>(ns) / 1e9);
            }
            // Every element was summed over n ranks 1 + iters times.
            if (buf[count - 1] != std::pow(static_cast<float>(n), static_cast<float>(iters + 1))) {
              std::fprintf(stderr, "wrong all_reduce result %g\n", static_cast<double>(buf[count - 1]));
              std::abort();
            }
          },
          LocalWorldOptions{std::chrono::milliseconds(300000)});
      std::sort(times.begin(), times.end());
      const double t = times[times.size() / 2];
      const double algbw = static_cast<double>(bytes) / t / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      std::printf("%-6d %-10s %-6d %-12.2f %-14.3f %-14.3f %-14.2f\n", n, (std::to_string(mib) + "MiB").c_str(), iters,
                  t * 1e3, algbw, busbw, memcpy_gbps(bytes));
      std::fflush(stdout);
    }
  }
  return 0;
}
