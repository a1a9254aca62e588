// bench_informer: creates N pending pods in a fresh namespace, then measures how long an Informer takes to sync
// them and how much the process's RSS grows. Run it through tests/bench/informer.sh (see docs/benchmarks.md).
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/kube/client.h"
#include "common/kube/informer.h"
#include "tests/bench/process_stats.h"

using namespace railyard::kube;
using Clock = std::chrono::steady_clock;

namespace {

using railyard::bench::cpu_seconds;
using railyard::bench::status_kib;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Json pending_pod(const std::string& name) {
  // A scheduler that does not exist: the pod stays Pending and nothing runs it.
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"labels", {{"app", "bench-informer"}}}}},
          {"spec",
           {{"schedulerName", "bench-no-such-scheduler"},
            {"containers", Json::array({{{"name", "main"},
                                         {"image", "busybox"},
                                         {"command", Json::array({"sleep", "3600"})},
                                         {"resources", {{"requests", {{"cpu", "10m"}, {"memory", "16Mi"}}}}}}})}}}};
}

int usage() {
  std::cerr << "usage: bench_informer [--pods N] [--threads T] [--keep] [--baseline-cmd CMD]\n"
               "  CMD runs (sh -c) after the informer measurement with BENCH_NAMESPACE set, e.g. a kubectl list\n"
               "  needs KUBECONFIG pointing at a cluster (tests/bench/informer.sh sets it)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int pods = 10000;
  int threads = 8;
  bool keep = false;
  std::string baseline;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--pods" && i + 1 < argc) {
      pods = std::atoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--baseline-cmd" && i + 1 < argc) {
      baseline = argv[++i];
    } else if (a == "--keep") {
      keep = true;
    } else {
      return usage();
    }
  }
  if (pods <= 0 || threads <= 0) return usage();
  try {
    Config cfg = default_config();
    cfg.qps = 2000;  // measure the informer and the server, not our own client-side limit
    cfg.burst = 4000;
    cfg.max_connections = threads;
    Client client(cfg);
    std::mt19937 rng(std::random_device{}());
    const std::string ns = "bench-informer-" + std::to_string(rng() % 1000000);
    client.create(resources::namespaces, "", {{"metadata", {{"name", ns}}}});
    std::printf("namespace %s: creating %d pending pods with %d threads\n", ns.c_str(), pods, threads);
    std::fflush(stdout);

    auto t0 = Clock::now();
    std::atomic<int> next{0}, failed{0};
    std::vector<std::thread> ts;
    for (int w = 0; w < threads; ++w) {
      ts.emplace_back([&] {
        for (int i = next++; i < pods; i = next++) {
          try {
            client.create(resources::pods, ns, pending_pod("p-" + std::to_string(i)));
          } catch (const std::exception& e) {
            if (failed++ < 3) std::fprintf(stderr, "create failed: %s\n", e.what());
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    double create_s = seconds_since(t0);
    std::printf("created %d pods in %.2f s (%.0f/s), %d failed\n", pods - failed.load(), create_s,
                (pods - failed.load()) / create_s, failed.load());

    long hwm_create = status_kib("VmHWM:");
    {
      // Reset the peak so that "peak" below covers the informer phase only (Linux: clear_refs 5).
      std::ofstream clear("/proc/self/clear_refs");
      clear << "5";
    }
    long rss_before = status_kib("VmRSS:");
    InformerOptions io;
    io.ns = ns;
    io.page_size = 500;
    Informer inf(client, resources::pods, io);
    std::atomic<int> adds{0};
    inf.on_add([&](const Json&) { ++adds; });
    auto t1 = Clock::now();
    double cpu0 = cpu_seconds();
    inf.start();
    bool synced = inf.wait_for_sync(std::chrono::minutes(5));
    double sync_s = seconds_since(t1);
    double sync_cpu = cpu_seconds() - cpu0;
    long rss_after = status_kib("VmRSS:");
    size_t cached = inf.size();  // not list(): that would deep-copy every object
    std::printf("informer sync: %s in %.3f s (%.3f s CPU in this process), %zu objects cached, %d add events\n",
                synced ? "ok" : "TIMED OUT", sync_s, sync_cpu, cached, adds.load());
    std::printf("peak rss while creating: %.1f MiB\n", hwm_create / 1024.0);
    std::printf("rss before: %.1f MiB, after sync: %.1f MiB, growth: %.1f MiB (%.1f KiB per pod), peak: %.1f MiB\n",
                rss_before / 1024.0, rss_after / 1024.0, (rss_after - rss_before) / 1024.0,
                static_cast<double>(rss_after - rss_before) / std::max<size_t>(cached, 1),
                status_kib("VmHWM:") / 1024.0);
    inf.stop();

    if (!baseline.empty()) {
      setenv("BENCH_NAMESPACE", ns.c_str(), 1);
      std::printf("baseline: %s\n", baseline.c_str());
      std::fflush(stdout);
      auto tb = Clock::now();
      int rc = std::system(baseline.c_str());
      std::printf("baseline finished in %.3f s (exit %d)\n", seconds_since(tb), rc);
    }

    if (!keep) {
      auto t2 = Clock::now();
      client.remove(resources::namespaces, "", ns);
      std::printf("namespace %s deleted (%.2f s); its pods go with it\n", ns.c_str(), seconds_since(t2));
    }
    return synced && cached == static_cast<size_t>(pods - failed.load()) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_informer: %s\n", e.what());
    return 1;
  }
}
