// Benchmark (label bench, not run by CI): step time and activation bytes of tp=2 with and without sequence
// parallelism, and of cp=2 (context parallelism, ring attention) beside one rank, side by side in one run over real
// Gloo sockets on loopback (one thread per rank). The ring's transfers are inside "step_s" (StepTimes has no cp
// field); tp_comm_s is the tp collectives' time.
//   RAILYARD_BENCH_MODEL (default "tiny"), RAILYARD_BENCH_B (4), RAILYARD_BENCH_T (128), RAILYARD_BENCH_M (2),
//   RAILYARD_BENCH_STEPS (3)
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_parallel/bench_util.h"
#include "worker/comm/local_world.h"
#include "worker/comm/process_groups.h"
#include "worker/parallel/parallel_model.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

TEST_CASE("sequence / context parallel step time and activation bytes") {
  const testing::BenchShape shape = testing::bench_shape(/*default_T=*/128, /*default_M=*/2);
  const GptConfig& cfg = shape.cfg;
  const int B = shape.B, T = shape.T, M = shape.M, steps = shape.steps;
  std::printf("%-8s %4s %10s %10s %14s\n", "layout", "rank", "step_s", "tp_comm_s", "activation_MiB");
  struct L {
    const char* name;
    int tp, cp;
    bool sp;
  };
  for (const L lay :
       {L{"1 rank", 1, 1, false}, L{"tp2", 2, 1, false}, L{"tp2 sp", 2, 1, true}, L{"cp2", 1, 2, false}}) {
    const int n = lay.tp * lay.cp;
    std::vector<double> wall(n), tp(n);
    std::vector<size_t> bytes(n);
    std::mutex mu;
    comm::run_local_world(n, [&](comm::Communicator& world) {
      comm::ProcessGroups groups(world, comm::Layout{.dp = lay.cp, .tp = lay.tp, .pp = 1});
      ThreadPool pool(1);
      ModelGroups mg = model_groups(groups);
      if (lay.cp > 1) mg.cp = &groups.dp();
      ParallelModel model(cfg, B, T, M, pool, mg, {}, {}, lay.sp);
      model.init_weights(1);
      auto next = testing::random_micro_batches(cfg.vocab_size, B * T, 5);
      double secs = 0, tps = 0;
      for (int s = 0; s <= steps; ++s) {
        StepTimes t;
        model.zero_grad();
        const auto t0 = std::chrono::steady_clock::now();
        model.forward_backward(M, next, 1.0f / M, &t);
        if (lay.cp > 1)
          groups.dp().all_reduce(model.grads(), model.num_params(), comm::DType::kFloat32, comm::ReduceOp::kAvg);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s > 0) {
          secs += dt;
          tps += t.tp_comm;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      wall[world.rank()] = secs / steps;
      tp[world.rank()] = tps / steps;
      bytes[world.rank()] = model.activation_bytes();
    });
    for (int r = 0; r < n; ++r) {
      std::printf("%-8s %4d %10.4f %10.4f %14.1f\n", lay.name, r, wall[r], tp[r], bytes[r] / 1048576.0);
      CHECK(wall[r] > 0);
    }
  }
}
