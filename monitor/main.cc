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
#include <vector>

#include "common/error.h"
#include "common/kube/client.h"
#include "common/kube/leader_elector.h"
#include "common/log.h"
#include "common/pod_env.h"
#include "monitor/flags.h"
#include "monitor/monitor.h"

namespace {

using namespace railyard;

// The webhook's bearer token: --webhook-token-file (trailing newlines and spaces dropped), else the environment.
void read_webhook_token(monitor::MonitorFlags& f) {
  monitor::Options& opts = f.opts;
  if (!f.token_file.empty()) {
    opts.webhook_token = read_file(f.token_file, "--webhook-token-file");
    while (!opts.webhook_token.empty() && (opts.webhook_token.back() == '\n' || opts.webhook_token.back() == ' '))
      opts.webhook_token.pop_back();
    if (opts.webhook_token.empty()) throw ConfigError("--webhook-token-file " + f.token_file + " is empty");
  } else {
    opts.webhook_token = env_or(pod_env::kMonitorWebhookToken, "");
  }
}

void log_started(const monitor::Options& opts, int port) {
  log::info("monitor", "started",
            {{"listen", opts.listen.substr(0, opts.listen.rfind(':')) + ":" + std::to_string(port)},
             {"mode", opts.prometheus_url.empty() ? "embedded" : "prometheus " + opts.prometheus_url},
             {"interval", std::to_string(opts.interval_s)},
             {"webhook", opts.webhook_token.empty() ? "disabled" : "enabled"}});
}

std::chrono::milliseconds ms(double sec) { return std::chrono::milliseconds(static_cast<int64_t>(sec * 1000)); }

// The evaluation loop and, with --leader-elect, what runs it: main's until the signal; the callbacks refer to it.
struct Evaluation {
  std::atomic<bool> stop{false};
  std::thread loop;
  std::unique_ptr<kube::Client> lease_client;
  std::unique_ptr<kube::LeaderElector> elector;
};

kube::LeaderElectorOptions lease_options(const monitor::MonitorFlags& f) {
  kube::LeaderElectorOptions lo;
  lo.lease_namespace = f.le_namespace.empty() ? kube::in_cluster_namespace() : f.le_namespace;
  if (lo.lease_namespace.empty()) lo.lease_namespace = "railyard-system";
  lo.lease_name = f.le_name;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  lo.identity = std::string(host) + "_" + std::to_string(getpid());
  lo.lease_duration = ms(f.lease_duration);
  lo.renew_deadline = ms(f.renew_deadline);
  lo.retry_period = ms(f.retry_period);
  return lo;
}

// Like the operator: the Lease on a client of its own; evaluation starts when this replica leads, and a replica
// that loses the Lease exits at once (its restart is a candidate again), so two replicas never act together.
void start_leader_election(const monitor::MonitorFlags& f, const kube::Config& cfg, monitor::Monitor& mon,
                           Evaluation& ev) {
  ev.lease_client = std::make_unique<kube::Client>(kube::lease_client_config(cfg, ms(f.retry_period)));
  const kube::LeaderElectorOptions lo = lease_options(f);
  ev.elector = std::make_unique<kube::LeaderElector>(*ev.lease_client, lo);
  const std::string lease =
      lo.lease_namespace + "/" + lo.lease_name;  // lo ends with this function; the callbacks don't
  ev.elector->on_started_leading([&mon, &ev, lease] {
    log::info("monitor", "leading: evaluating", {{"lease", lease}});
    mon.set_leading(true);
    ev.loop = std::thread([&mon, &ev] { mon.run(ev.stop); });
  });
  ev.elector->on_stopped_leading([&mon, &ev] {
    mon.set_leading(false);
    if (ev.stop) return;
    log::error("monitor", "lost the leader lease; exiting at once");
    std::fflush(nullptr);
    std::_Exit(1);
  });
  log::info("monitor", "waiting for leadership",
            {{"lease", lo.lease_namespace + "/" + lo.lease_name}, {"identity", lo.identity}});
  ev.elector->start();
}

// Waits for SIGINT or SIGTERM, then stops the loop, the election and the client's watches.
void wait_and_stop(const sigset_t& sigs, Evaluation& ev, kube::Client& client) {
  int sig = 0;
  sigwait(&sigs, &sig);
  log::info("monitor", "shutting down", {{"signal", std::to_string(sig)}});
  ev.stop = true;
  if (ev.elector) ev.elector->stop();
  client.stop();
  if (ev.loop.joinable()) ev.loop.join();
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  try {
    monitor::MonitorFlags flags = monitor::parse_monitor_flags(std::vector<std::string>(argv + 1, argv + argc));
    if (flags.help) {
      std::cout << monitor::kMonitorUsage;
      return 0;
    }
    read_webhook_token(flags);
    monitor::check_monitor_flags(flags);

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    const monitor::Options& opts = flags.opts;
    const kube::Config cfg =
        flags.kubeconfig.empty() ? kube::default_config() : kube::load_kubeconfig(flags.kubeconfig);
    kube::Client client(cfg);
    monitor::Monitor mon(client, opts);
    if (flags.leader_elect) mon.set_leading(false);
    log_started(opts, mon.start_server());
    Evaluation ev;
    if (!flags.leader_elect) {
      ev.loop = std::thread([&] { mon.run(ev.stop); });
    } else {
      start_leader_election(flags, cfg, mon, ev);
    }
    wait_and_stop(sigs, ev, client);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "railyard-monitor: error: %s\n", e.what());
    return 2;
  }
}
