// Benchmark (label bench, not run by CI): per-step time split of the tensor/pipeline-parallel GPT over real Gloo
// sockets on loopback, one thread per rank with a one-thread pool each. Prints, per layout and rank, the mean
// compute / tp_comm / pp_wait seconds of a step of M micro-batches, and for pipelines the measured wait share beside
// the ideal 1F1B bubble (P-1)/(M+P-1).
//   RAILYARD_BENCH_MODEL (default "tiny"; e.g. gpt2-124m), RAILYARD_BENCH_B (4), RAILYARD_BENCH_T (64),
//   RAILYARD_BENCH_M (4), RAILYARD_BENCH_STEPS (3)
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
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

TEST_CASE("tp/pp step time split") {
  const testing::BenchShape shape = testing::bench_shape(/*default_T=*/64, /*default_M=*/4);
  const GptConfig& cfg = shape.cfg;
  const int B = shape.B, T = shape.T, M = shape.M, steps = shape.steps;
  std::printf("%-10s %4s %10s %10s %10s %10s %10s\n", "layout", "rank", "step_s", "compute_s", "tp_comm_s", "pp_wait_s",
              "ideal_bub");
  struct L {
    int tp, pp;
  };
  for (const L lay : {L{1, 1}, L{2, 1}, L{1, 2}}) {
    const int n = lay.tp * lay.pp;
    std::vector<StepTimes> times(n);
    std::vector<double> wall(n);
    std::mutex mu;
    comm::run_local_world(n, [&](comm::Communicator& world) {
      comm::ProcessGroups groups(world, comm::Layout{.dp = 1, .tp = lay.tp, .pp = lay.pp});
      ThreadPool pool(1);
      ParallelModel model(cfg, B, T, M, pool, model_groups(groups));
      model.init_weights(1);
      auto next = testing::random_micro_batches(cfg.vocab_size, B * T, 5);
      StepTimes sum;
      double secs = 0;
      for (int s = 0; s <= steps; ++s) {
        StepTimes t;
        model.zero_grad();
        const auto t0 = std::chrono::steady_clock::now();
        model.forward_backward(M, next, 1.0f / M, &t);
        model.finish_grads(&t);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s > 0) {
          sum += t;
          secs += dt;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      times[world.rank()] = sum;
      wall[world.rank()] = secs;
    });
    for (int r = 0; r < n; ++r) {
      const double ideal = lay.pp > 1 ? double(lay.pp - 1) / (M + lay.pp - 1) : 0.0;
      std::printf("tp%d pp%d    %4d %10.4f %10.4f %10.4f %10.4f %10.2f\n", lay.tp, lay.pp, r, wall[r] / steps,
                  times[r].compute / steps, times[r].tp_comm / steps, times[r].pp_wait / steps, ideal);
      CHECK(times[r].compute > 0);
    }
  }
}
