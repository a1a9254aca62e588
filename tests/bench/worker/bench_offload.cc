// Optimizer offload, side by side in one process: the same gpt2-124m training run (real trainer, the license corpus)
// with the in-memory AdamW and with --offload optimizer, in interleaved rounds. Reports per mode the median step time,
// the optimizer time the step saw (offload: the next forward's waits for the host update), the host update's own time,
// the device-arena and host-arena bytes the trainer allocated and the process RSS, next to the planner's prediction
// (cpu profile) for the same shapes: device memory with and without offload, the host update time and its exposed
// part.
//
// usage: bench_offload [--model gpt2-124m] [--steps 5] [--batch 4] [--seq 64] [--threads 2] [--offload-threads 1]
//                      [--rounds 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "tests/bench/process_stats.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt_config.h"
#include "worker/train/trainer.h"

using namespace railyard;
using namespace railyard::worker;

namespace {

using bench::rss_bytes;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Samples {
  std::vector<double> step, optimizer, update;
  MemoryBudget mem;
  double rss = 0;
};

void run_mode(const GptConfig& model, TrainConfig tc, ThreadPool& pool, OffloadMode mode, Samples& out) {
  tc.offload = mode;
  testing::StreamSource src(0, 1, tc.batch, tc.seq_len, model.vocab_size);  // the license corpus
  Trainer trainer(model, tc, pool, src);
  out.mem = trainer.allocated_memory();
  for (int s = 0; s < tc.steps; ++s) {
    const StepResult r = trainer.step();
    if (s == 0) continue;  // page faults of the first touch of the optimizer state
    out.step.push_back(r.seconds);
    out.optimizer.push_back(r.times.optimizer);
  }
  out.rss = std::max(out.rss, rss_bytes());
  (void)trainer.state();  // waits for the last update
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> f = {{"model", "gpt2-124m"}, {"steps", "5"},   {"batch", "4"},
                                          {"seq", "64"},          {"threads", "2"}, {"offload-threads", "1"},
                                          {"rounds", "2"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = std::string(argv[i]).substr(2);
    if (!f.count(k)) {
      std::fprintf(stderr, "bench_offload: unknown flag %s\n", argv[i]);
      return 2;
    }
    f[k] = argv[i + 1];
  }
  try {
    log::set_level(log::Level::Warn);
    const GptConfig model = model_preset(f["model"]);
    TrainConfig tc;
    tc.steps = std::atoi(f["steps"].c_str());
    tc.batch = std::atoi(f["batch"].c_str());
    tc.seq_len = std::atoi(f["seq"].c_str());
    tc.quiet = true;
    tc.peak_flops = 1e11;
    tc.offload_threads = std::atoi(f["offload-threads"].c_str());
    const int threads = std::atoi(f["threads"].c_str()), rounds = std::atoi(f["rounds"].c_str());
    ThreadPool pool(threads);
    Samples in_memory, offload;
    std::vector<double> update_seconds;
    for (int r = 0; r < rounds; ++r) {
      run_mode(model, tc, pool, OffloadMode::kNone, in_memory);
      run_mode(model, tc, pool, OffloadMode::kOptimizer, offload);
    }
    // The host update alone (no forward competing): one OffloadAdamW update of the whole model.
    {
      OffloadAdamW opt(model, AdamWHyper{}, tc.offload_threads);
      std::vector<float> p(num_parameters(model), 0.01f), g(num_parameters(model), 0.001f);
      for (int i = 0; i < 3; ++i) {
        opt.start(p.data(), g.data(), 1e-4f, 1.0f);
        opt.wait_all();
        update_seconds.push_back(opt.last_update_seconds());
      }
    }

    plan::Cluster cluster;
    cluster.device = plan::builtin_profile("cpu");
    cluster.gpus = 1;
    cluster.topology.gpus_per_node = 1;
    const plan::Job job{plan::ModelShape{f["model"], model.num_layers, model.channels, model.num_heads, tc.seq_len,
                                         model.vocab_size, false},
                        tc.batch, 0};
    plan::Layout lin, loff;
    lin.micro_batch = loff.micro_batch = tc.batch;
    loff.offload = true;
    const plan::Estimate pin = plan::estimate(job, cluster, lin), poff = plan::estimate(job, cluster, loff);
    auto device = [](const plan::MemoryBreakdown& m) { return m.params + m.grads + m.optimizer + m.activations; };

    const double mib = 1048576.0;
    std::printf("%s B=%d T=%d threads=%d offload-threads=%d, %d rounds x %d steps (first of each run dropped)\n",
                f["model"].c_str(), tc.batch, tc.seq_len, threads, tc.offload_threads, rounds, tc.steps);
    for (auto [name, s] : {std::pair<const char*, Samples*>{"in-memory", &in_memory}, {"offload", &offload}}) {
      std::printf(
          "  %-9s step median %.3f s (optimizer seen by the step %.3f s); device %.1f MiB, host %.1f MiB, "
          "RSS %.1f MiB\n",
          name, median(s->step), median(s->optimizer), s->mem.total() / mib, s->mem.host / mib, s->rss / mib);
    }
    std::printf("  host update alone: median %.3f s\n", median(update_seconds));
    std::printf("  step ratio offload / in-memory: %.3f\n", median(offload.step) / median(in_memory.step));
    std::printf(
        "  planner (cpu): device %.1f -> %.1f MiB (measured %.1f -> %.1f, drop %.1f vs %.1f MiB); host update "
        "%.3f s, exposed %.3f s; in-memory optimizer %.3f s\n",
        device(pin.memory) / mib, device(poff.memory) / mib, in_memory.mem.total() / mib, offload.mem.total() / mib,
        (in_memory.mem.total() - offload.mem.total()) / mib, (device(pin.memory) - device(poff.memory)) / mib,
        poff.time.offload, poff.time.optimizer, pin.time.optimizer);
    std::printf(
        "{\"step_in_memory_s\": %.4f, \"step_offload_s\": %.4f, \"optimizer_in_memory_s\": %.4f, "
        "\"optimizer_offload_exposed_s\": %.4f, \"host_update_s\": %.4f, \"device_in_memory_bytes\": %zu, "
        "\"device_offload_bytes\": %zu, \"host_offload_bytes\": %zu, \"planner_device_in_memory_bytes\": %.0f, "
        "\"planner_device_offload_bytes\": %.0f, \"planner_host_update_s\": %.4f, \"planner_exposed_s\": %.4f}\n",
        median(in_memory.step), median(offload.step), median(in_memory.optimizer), median(offload.optimizer),
        median(update_seconds), in_memory.mem.total(), offload.mem.total(), offload.mem.host, device(pin.memory),
        device(poff.memory), poff.time.offload, poff.time.optimizer);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_offload: %s\n", e.what());
    return 1;
  }
  return 0;
}
