// railyard-test-fake-worker: a stand-in for a training rank that exports the worker metric contract
// (docs/monitor.md) with common/metrics. Ranks started with the same --barrier-dir advance in lock step, like ranks
// joined by collectives: when one is frozen (SIGSTOP) the others stop stepping too but keep serving /metrics.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/metrics/metrics.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

long read_step(const std::filesystem::path& p) {
  std::ifstream in(p);
  long s = -1;
  in >> s;
  return in ? s : -1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace railyard;
  std::string ns = "default", job = "job", node = "node", gen = "0", port_file, barrier;
  int rank = 0, world = 1, port = 0, ckpt_every = 0;
  double step_s = 0.2, slow = 1.0;
  bool nan_at_step = false;
  long nan_step = -1;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw ConfigError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--namespace")
        ns = next();
      else if (a == "--job")
        job = next();
      else if (a == "--node")
        node = next();
      else if (a == "--generation")
        gen = next();
      else if (a == "--rank")
        rank = std::stoi(next());
      else if (a == "--world")
        world = std::stoi(next());
      else if (a == "--port")
        port = std::stoi(next());
      else if (a == "--port-file")
        port_file = next();
      else if (a == "--barrier-dir")
        barrier = next();
      else if (a == "--step-seconds")
        step_s = std::stod(next());
      else if (a == "--slow-factor")
        slow = std::stod(next());
      else if (a == "--checkpoint-every")
        ckpt_every = std::stoi(next());
      else if (a == "--nan-at-step") {
        nan_at_step = true;
        nan_step = std::stol(next());
      } else
        throw ConfigError("unknown flag '" + a + "'");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "railyard-test-fake-worker: error: %s\n", e.what());
    return 2;
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);

  metrics::Registry reg;
  metrics::Labels l{
      {"namespace", ns}, {"trainingjob", job}, {"generation", gen}, {"rank", std::to_string(rank)}, {"node", node}};
  auto& step_g = reg.gauge("railyard_worker_step", "Last completed training step.").add(l);
  auto& last_g = reg.gauge("railyard_worker_last_step_timestamp_seconds", "When the last step completed.").add(l);
  auto& dur_h = reg.histogram("railyard_worker_step_duration_seconds", "Wall time of one training step.",
                              metrics::exponential_buckets(0.01, 2, 14))
                    .add(l);
  auto& loss_g = reg.gauge("railyard_worker_loss", "Training loss of the last step.").add(l);
  auto& nonfinite = reg.counter("railyard_worker_nonfinite_total", "Steps with a non-finite loss or gradient.").add(l);
  auto& ck_step = reg.gauge("railyard_checkpoint_last_step", "Step of the last complete checkpoint.").add(l);
  auto& ck_ts = reg.gauge("railyard_checkpoint_last_timestamp_seconds", "When the last checkpoint completed.").add(l);
  metrics::Exposer exposer(reg, "127.0.0.1", port);
  if (!port_file.empty()) write_file_atomic(port_file, std::to_string(exposer.port()) + "\n");

  namespace fs = std::filesystem;
  long step = 0;
  auto last = std::chrono::steady_clock::now();
  while (!g_stop) {
    // Lock step: wait until every rank finished the current step (a collective).
    if (!barrier.empty()) {
      write_file_atomic((fs::path(barrier) / (std::to_string(rank) + ".step")).string(), std::to_string(step) + "\n");
      bool all = false;
      while (!g_stop && !all) {
        all = true;
        for (int r = 0; r < world && all; ++r)
          all = read_step(fs::path(barrier) / (std::to_string(r) + ".step")) >= step;
        if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(step_s * slow));
    ++step;
    auto now = std::chrono::steady_clock::now();
    dur_h.observe(std::chrono::duration<double>(now - last).count());
    last = now;
    double loss = 4.0 / std::sqrt(1.0 + step * 0.1);
    if (nan_at_step && step >= nan_step) {
      loss = std::nan("");
      nonfinite.increment();
    }
    loss_g.set(loss);
    step_g.set(static_cast<double>(step));
    last_g.set(unix_now());
    if (ckpt_every > 0 && step % ckpt_every == 0) {
      ck_step.set(static_cast<double>(step));
      ck_ts.set(unix_now());
    }
  }
  return 0;
}
