// railyard-monitor: health rules over the workers' metrics; a verdict becomes a checkpoint-restart request.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/kube/client.h"
#include "common/kube/leader_elector.h"
#include "common/log.h"
#include "common/pod_env.h"
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
  --leader-elect[=true|false]  run as one of several replicas: only the holder of a Lease evaluates and takes the
                             webhook (standbys answer 503); a replica that loses the Lease exits to be restarted
                             (default false: one replica)
  --leader-election-namespace NS  namespace of the Lease (default: the pod's in-cluster, else railyard-system)
  --leader-election-id NAME  Lease name (default railyard-monitor)
  --lease-duration S, --renew-deadline S, --retry-period S   leader election timing (15, 10, 2 seconds)
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
    bool leader_elect = false;
    std::string le_namespace, le_name = "railyard-monitor";
    double lease_duration = 15, renew_deadline = 10, retry_period = 2;
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
      } else if (a == "--leader-elect") {
        const std::string v = has_value ? value : "true";
        if (v != "true" && v != "false") throw ConfigError("--leader-elect='" + v + "': use true or false");
        leader_elect = v == "true";
      } else if (a == "--leader-election-namespace") {
        le_namespace = next();
      } else if (a == "--leader-election-id") {
        le_name = next();
      } else if (a == "--lease-duration") {
        lease_duration = to_double(a, next());
      } else if (a == "--renew-deadline") {
        renew_deadline = to_double(a, next());
      } else if (a == "--retry-period") {
        retry_period = to_double(a, next());
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
      opts.webhook_token = env_or(pod_env::kMonitorWebhookToken, "");
    }
    monitor::parse_listen(opts.listen);

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    if (leader_elect && !(retry_period > 0 && renew_deadline > retry_period && lease_duration > renew_deadline))
      throw ConfigError("leader election timing: want 0 < --retry-period < --renew-deadline < --lease-duration");
    const kube::Config cfg = kubeconfig.empty() ? kube::default_config() : kube::load_kubeconfig(kubeconfig);
    kube::Client client(cfg);
    monitor::Monitor mon(client, opts);
    if (leader_elect) mon.set_leading(false);
    int port = mon.start_server();
    log::info("monitor", "started",
              {{"listen", opts.listen.substr(0, opts.listen.rfind(':')) + ":" + std::to_string(port)},
               {"mode", opts.prometheus_url.empty() ? "embedded" : "prometheus " + opts.prometheus_url},
               {"interval", std::to_string(opts.interval_s)},
               {"webhook", opts.webhook_token.empty() ? "disabled" : "enabled"}});
    std::atomic<bool> stop{false};
    std::thread loop;
    std::unique_ptr<kube::Client> lease_client;
    std::unique_ptr<kube::LeaderElector> elector;
    if (!leader_elect) {
      loop = std::thread([&] { mon.run(stop); });
    } else {
      // Like the operator: the Lease on a client of its own; evaluation starts when this replica leads, and a replica
      // that loses the Lease exits at once (its restart is a candidate again), so two replicas never act together.
      auto ms = [](double sec) { return std::chrono::milliseconds(static_cast<int64_t>(sec * 1000)); };
      lease_client = std::make_unique<kube::Client>(kube::lease_client_config(cfg, ms(retry_period)));
      kube::LeaderElectorOptions lo;
      lo.lease_namespace = le_namespace.empty() ? kube::in_cluster_namespace() : le_namespace;
      if (lo.lease_namespace.empty()) lo.lease_namespace = "railyard-system";
      lo.lease_name = le_name;
      char host[256] = {0};
      gethostname(host, sizeof host - 1);
      lo.identity = std::string(host) + "_" + std::to_string(getpid());
      lo.lease_duration = ms(lease_duration);
      lo.renew_deadline = ms(renew_deadline);
      lo.retry_period = ms(retry_period);
      elector = std::make_unique<kube::LeaderElector>(*lease_client, lo);
      const std::string lease =
          lo.lease_namespace + "/" + lo.lease_name;  // lo ends with this block; the callbacks don't
      elector->on_started_leading([&, lease] {
        log::info("monitor", "leading: evaluating", {{"lease", lease}});
        mon.set_leading(true);
        loop = std::thread([&] { mon.run(stop); });
      });
      elector->on_stopped_leading([&] {
        mon.set_leading(false);
        if (stop) return;
        log::error("monitor", "lost the leader lease; exiting at once");
        std::fflush(nullptr);
        std::_Exit(1);
      });
      log::info("monitor", "waiting for leadership",
                {{"lease", lo.lease_namespace + "/" + lo.lease_name}, {"identity", lo.identity}});
      elector->start();
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    log::info("monitor", "shutting down", {{"signal", std::to_string(sig)}});
    stop = true;
    if (elector) elector->stop();
    client.stop();
    if (loop.joinable()) loop.join();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "railyard-monitor: error: %s\n", e.what());
    return 2;
  }
}
