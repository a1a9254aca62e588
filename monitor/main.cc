// railyard-monitor: health rules over the workers' metrics; a verdict becomes a checkpoint-restart request.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/kube/client.h"
#include "common/log.h"
#include "monitor/monitor.h"

namespace {

using namespace railyard;

constexpr const char* kUsage = R"(usage: railyard-monitor [flags]
Evaluates health rules (stall, unreachable rank, straggler, NaN/Inf loss or loss spike, checkpoint age) for every
TrainingJob and requests a checkpoint-restart through the railyard.dev/restart-request annotation.
  --kubeconfig PATH          kubeconfig (default $KUBECONFIG, ~/.kube/config, in-cluster)
  --prometheus-url URL       Prometheus to query (e.g. http://127.0.0.1:9090); empty: scrape the pods directly
  --interval SECONDS         evaluation period (default 1)
  --listen HOST:PORT         webhook + /metrics + /healthz (default 127.0.0.1:9402; port 0 picks one)
  --webhook-token-file PATH  bearer token for POST /webhook/alertmanager (or $RAILYARD_MONITOR_WEBHOOK_TOKEN);
                             without one the webhook answers 503
  --namespace NS             only this namespace (default: all)
  --metrics-port PORT        embedded mode: worker port when a pod has no railyard.dev/metrics-port (default 9400)
  --stall-floor SECONDS      lower bound of the stall threshold (default 6)
  --stopped-seconds SECONDS  a rank whose process is stopped this long is a Hang of that rank (programs; default 2,
                             0 = off)
  --idle-seconds SECONDS     every rank of a program using no CPU this long, no step meanwhile, is a Hang naming the
                             rank that went idle first (default 15, 0 = off)
  --stall-factor K           stall threshold = max(K x typical step time, floor), at most hangTimeoutSeconds (2)
  --unreachable SECONDS      a rank's target down this long is a verdict (default 30)
  --straggler-window SECONDS a straggler must stay slow this long (default 30)
  --debounce N               consecutive evaluations for count-based rules (default 2)
)";

double to_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used == v.size() && d >= 0) return d;
  } catch (const std::exception&) {
  }
  throw ConfigError(flag + " '" + v + "' is not a non-negative number");
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  try {
    std::string kubeconfig, token_file;
    monitor::Options opts;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i], value;
      bool has_value = false;
      // --flag=value as well as --flag value: the chart (and every Kubernetes manifest convention) uses the former.
      if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_value = true;
      }
      auto next = [&]() -> std::string {
        if (has_value) return value;
        if (i + 1 >= argc) throw ConfigError(a + " needs a value (see --help)");
        return argv[++i];
      };
      if (a == "-h" || a == "--help") {
        std::cout << kUsage;
        return 0;
      } else if (a == "--kubeconfig") {
        kubeconfig = next();
      } else if (a == "--prometheus-url") {
        opts.prometheus_url = next();
      } else if (a == "--interval") {
        opts.interval_s = to_double(a, next());
      } else if (a == "--listen") {
        opts.listen = next();
      } else if (a == "--webhook-token-file") {
        token_file = next();
      } else if (a == "--namespace") {
        opts.ns = next();
      } else if (a == "--metrics-port") {
        opts.metrics_port = static_cast<int>(to_double(a, next()));
      } else if (a == "--stall-floor") {
        opts.defaults.stall_floor_s = to_double(a, next());
      } else if (a == "--stopped-seconds") {
        opts.defaults.stopped_s = to_double(a, next());
      } else if (a == "--idle-seconds") {
        opts.defaults.idle_s = to_double(a, next());
      } else if (a == "--stall-factor") {
        opts.defaults.stall_factor = to_double(a, next());
      } else if (a == "--unreachable") {
        opts.defaults.unreachable_s = to_double(a, next());
      } else if (a == "--straggler-window") {
        opts.defaults.straggler_window_s = to_double(a, next());
      } else if (a == "--debounce") {
        opts.defaults.debounce_evals = std::max(1, static_cast<int>(to_double(a, next())));
      } else {
        throw ConfigError("unknown flag '" + a + "' (see --help)");
      }
    }
    if (!token_file.empty()) {
      opts.webhook_token = read_file(token_file, "--webhook-token-file");
      while (!opts.webhook_token.empty() && (opts.webhook_token.back() == '\n' || opts.webhook_token.back() == ' '))
        opts.webhook_token.pop_back();
      if (opts.webhook_token.empty()) throw ConfigError("--webhook-token-file " + token_file + " is empty");
    } else {
      opts.webhook_token = env_or("RAILYARD_MONITOR_WEBHOOK_TOKEN", "");
    }
    monitor::parse_listen(opts.listen);

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    kube::Client client(kubeconfig.empty() ? kube::default_config() : kube::load_kubeconfig(kubeconfig));
    monitor::Monitor mon(client, opts);
    int port = mon.start_server();
    log::info("monitor", "started",
              {{"listen", opts.listen.substr(0, opts.listen.rfind(':')) + ":" + std::to_string(port)},
               {"mode", opts.prometheus_url.empty() ? "embedded" : "prometheus " + opts.prometheus_url},
               {"interval", std::to_string(opts.interval_s)},
               {"webhook", opts.webhook_token.empty() ? "disabled" : "enabled"}});
    std::atomic<bool> stop{false};
    std::thread loop([&] { mon.run(stop); });
    int sig = 0;
    sigwait(&sigs, &sig);
    log::info("monitor", "shutting down", {{"signal", std::to_string(sig)}});
    stop = true;
    client.stop();
    loop.join();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "railyard-monitor: error: %s\n", e.what());
    return 2;
  }
}
