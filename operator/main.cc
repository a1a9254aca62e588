// railyard-operator: runs the TrainingJob controller (and, as leader, the rendezvous service). See README.md.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/http_server_bounds.h"
#include "common/kube/client.h"
#include "common/kube/leader_elector.h"
#include "common/kube/request_auth.h"
#include "common/log.h"
#include "common/metrics/metrics.h"
#include "common/tls/pki.h"
#include "operator/controller/controller.h"
#include "operator/controller/leader_endpoints.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/serving_tls.h"
#include "operator/flags.h"
#include "operator/rendezvous/rendezvous.h"
#include "operator/scheduler/rail_aware.h"

namespace {

using namespace railyard;
constexpr const char* kLog = "operator";

using Flags = op::OperatorFlags;

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "railyard-operator: " << msg << "\n" << op::kOperatorUsage;
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  try {
    Flags f = op::parse_operator_flags(std::vector<std::string>(argv + 1, argv + argc));
    if (f.help) {
      std::cout << op::kOperatorUsage;
      std::exit(0);
    }
    if (!f.log_level.empty()) log::set_level(log::parse_level(f.log_level));
    return f;
  } catch (const std::exception& e) {
    usage_error(e.what());
  }
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const std::string& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

// --rendezvous-ca-secret [NS/]NAME: without NS, the operator's own namespace (its pod's in-cluster, else the one
// namespace it watches, else railyard-system).
std::pair<std::string, std::string> ca_secret_ref(const Flags& f) {
  const auto slash = f.rendezvous_ca_secret.find('/');
  if (slash != std::string::npos)
    return {f.rendezvous_ca_secret.substr(0, slash), f.rendezvous_ca_secret.substr(slash + 1)};
  std::string ns = kube::in_cluster_namespace();
  if (ns.empty()) ns = f.ns.empty() ? "railyard-system" : f.ns;
  return {ns, f.rendezvous_ca_secret};
}

std::string default_lease_namespace() {
  const std::string ns = kube::in_cluster_namespace();
  return ns.empty() ? "railyard-system" : ns;
}

// The leader's Endpoints (--leader-endpoints), kept level-triggered: written at once, then checked every 10 s and
// rewritten if anything else changed it, until `stop`. Errors are logged and retried after 1 s: until it is written,
// agents that dial the Service are refused or wait, as with no leader.
std::thread keep_leader_endpoints(kube::Client& client, op::LeaderEndpoint e, const std::atomic<bool>& stop) {
  return std::thread([&client, e, &stop] {
    bool logged_error = false;
    while (!stop) {
      int wait_ms = 10000;
      try {
        if (op::publish_leader_endpoints(client, e))
          log::info(kLog, "the rendezvous Service now names this replica",
                    {{"endpoints", e.ns + "/" + e.name},
                     {"pod", e.pod_name},
                     {"address", e.pod_ip + ":" + std::to_string(e.port)}});
        logged_error = false;
      } catch (const std::exception& ex) {
        if (!logged_error)
          log::error(kLog,
                     "cannot write the rendezvous Endpoints (grant endpoints get, create, update in this namespace)",
                     {{"endpoints", e.ns + "/" + e.name}, {"error", ex.what()}});
        logged_error = true;
        wait_ms = 1000;
      }
      for (int t = 0; t < wait_ms && !stop; t += 100) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

// /metrics: plain HTTP for anyone, or (--metrics-secure) HTTPS for whom the API server says may `get` /metrics.
std::unique_ptr<metrics::Exposer> metrics_exposer(const Flags& flags, const metrics::Registry& registry,
                                                  kube::Client& client, const std::string& host, int port) {
  if (!flags.metrics_secure) return std::make_unique<metrics::Exposer>(registry, host, port);
  tls::CertKey serving;
  if (!flags.metrics_cert_dir.empty()) {
    serving = {read_file(flags.metrics_cert_dir + "/tls.crt", "--metrics-cert-dir certificate"),
               read_file(flags.metrics_cert_dir + "/tls.key", "--metrics-cert-dir key")};
  } else {
    // Self-signed, as controller-runtime's metrics server does without a certificate: scrapers skip verification
    // (what they must not skip is the token, which the reviews below check).
    char hostname[256] = {};
    gethostname(hostname, sizeof(hostname) - 1);
    std::vector<std::string> names{"localhost"};
    if (hostname[0]) names.insert(names.begin(), hostname);
    serving = tls::issue_server_cert(tls::make_ca("railyard-operator metrics", std::chrono::hours(24 * 365)), names,
                                     std::chrono::hours(24 * 365));
  }
  tls::X509Ptr cert = tls::read_cert(serving.cert_pem, "--metrics-cert-dir tls.crt");
  tls::PkeyPtr key = tls::read_key(serving.key_pem, "--metrics-cert-dir tls.key");
  auto server = std::make_unique<httplib::SSLServer>(cert.get(), key.get());  // takes its own references
  if (!server->is_valid()) throw ConfigError("--metrics-secure: cannot serve the certificate");
  auto authorizer = std::make_shared<kube::RequestAuthorizer>(client);
  auto authorize = [authorizer](const std::string& authorization, const std::string& path) {
    const kube::AccessDecision d = authorizer->check(authorization, path, "get");
    if (d.status != 200)
      log::debug(kLog, "metrics request refused", {{"status", std::to_string(d.status)}, {"why", d.reason}});
    return std::make_pair(d.status, d.reason);
  };
  return std::make_unique<metrics::Exposer>(registry, host, port, std::move(server), std::move(authorize));
}

// The API clients. The leader election's own client has its own connections and rate limiter (never queued behind
// the controller's requests), at most one quick retry and a short timeout, so a stalled API connection costs it about
// one retry period per attempt, not the controller's 30 s with retries (kube/leader_elector.h).
struct Clients {
  std::unique_ptr<kube::Client> api, lease;
};
Clients make_clients(const Flags& flags) {
  kube::Config cfg =
      flags.kubeconfig.empty() ? kube::default_config() : kube::load_kubeconfig(flags.kubeconfig, flags.context);
  const kube::Config lease_cfg =
      kube::lease_client_config(cfg, std::chrono::milliseconds(static_cast<int64_t>(flags.retry_period * 1000)));
  cfg.qps = flags.kube_api_qps;
  cfg.burst = flags.kube_api_burst;
  // One connection per concurrent create/bind of a reconcile's slow-start batch (ControllerOptions).
  cfg.max_connections = std::max(cfg.max_connections, flags.api_parallelism);
  Clients c;
  c.api = std::make_unique<kube::Client>(cfg);
  if (flags.leader_elect) c.lease = std::make_unique<kube::Client>(lease_cfg);
  return c;
}

// --leader-endpoints: this pod's identity from the downward API (the port is the rendezvous service's, known later).
op::LeaderEndpoint leader_endpoint_from_env(const Flags& flags, const std::string& lease_ns) {
  if (flags.leader_endpoints.empty()) return {};
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  op::LeaderEndpoint e{lease_ns, flags.leader_endpoints, env("POD_NAME"), env("POD_UID"), env("POD_IP"), 0};
  if (e.pod_ip.empty())
    usage_error(
        "--leader-endpoints: POD_IP is not set (give the container env POD_IP from fieldRef status.podIP, "
        "and POD_NAME, POD_UID from metadata.name, metadata.uid)");
  return e;
}

// A missing Lease namespace would otherwise only show as a candidate that never leads. 0, or the exit code.
int check_lease_namespace(kube::Client& client, const std::string& lease_ns) {
  try {
    if (!client.try_get(kube::resources::namespaces, "", lease_ns)) {
      std::cerr << "railyard-operator: --leader-election-namespace: namespace '" << lease_ns
                << "' does not exist: create it (kubectl create namespace " << lease_ns
                << "), pass another namespace, or run with --leader-elect=false\n";
      return 2;
    }
  } catch (const kube::Forbidden&) {
    // No permission to read namespaces: the Lease calls will tell.
  } catch (const std::exception& e) {
    std::cerr << "railyard-operator: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

op::ControllerOptions controller_options(const Flags& flags) {
  op::ControllerOptions copts;
  copts.ns = flags.ns;
  copts.workers = flags.workers;
  copts.api_parallelism = flags.api_parallelism;
  copts.pod.worker_image = flags.worker_image;
  copts.pod.worker_command = {flags.worker_command};
  copts.pod.rendezvous_addr = flags.rendezvous_addr;
  copts.pod.worker_metrics_port = flags.worker_metrics_port;
  copts.pod.agent_metrics_port = flags.agent_metrics_port;
  copts.pod.roots = {flags.data_root, flags.checkpoint_root};
  copts.pod.cluster_domain = flags.cluster_domain;
  copts.network_policy = flags.network_policy;
  return copts;
}

std::unique_ptr<op::Placement> make_placement(const Flags& flags) {
  std::unique_ptr<op::Placement> placement;
  if (flags.placement == "simple")
    placement = std::make_unique<op::SimplePlacement>();
  else
    placement = std::make_unique<op::sched::RailAwarePlacement>();
  return std::make_unique<op::ReservingPlacement>(std::move(placement));
}

// /metrics and /healthz, /readyz (ready once the informers synced). Stops in the destructor.
struct Endpoints {
  std::unique_ptr<metrics::Exposer> exposer;
  httplib::Server health;
  std::thread health_thread;
  int health_port = -1;
  ~Endpoints() {
    health.stop();
    if (health_thread.joinable()) health_thread.join();
  }
};
void serve_endpoints(const Flags& flags, const metrics::Registry& registry, kube::Client& client,
                     op::Controller& controller, Endpoints& out) {
  auto [hhost, hport] = op::split_addr("--health-addr", flags.health_addr);
  auto [mhost, mport] = op::split_addr("--metrics-addr", flags.metrics_addr);
  out.exposer = metrics_exposer(flags, registry, client, mhost, mport);
  railyard::http::apply(out.health, railyard::http::kSmallRequests);
  out.health.Get("/healthz",
                 [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  out.health.Get("/readyz", [&controller](const httplib::Request&, httplib::Response& res) {
    if (controller.synced()) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content("informers not synced\n", "text/plain");
    }
  });
  if (hport == 0) {
    hport = out.health.bind_to_any_port(hhost);
  } else if (!out.health.bind_to_port(hhost, hport)) {
    hport = -1;
  }
  if (hport < 0) throw Error("--health-addr " + flags.health_addr + ": cannot listen (port in use?)");
  out.health_port = hport;
  out.health_thread = std::thread([&out] { out.health.listen_after_bind(); });
  log::info(kLog, "serving",
            {{"metrics", mhost + ":" + std::to_string(out.exposer->port())},
             {"metrics_tls", flags.metrics_secure ? "on" : "off"},
             {"health", hhost + ":" + std::to_string(hport)}});
}

// What the leader serves for the rendezvous: the certificate of --rendezvous-tls (auto: issued by the operator's CA
// for the host pods dial; files: the mounted one; off: none).
op::ServingTls rendezvous_tls(const Flags& flags, kube::Client& client, const std::string& rhost) {
  if (flags.rendezvous_tls == op::RendezvousTlsMode::kFiles) {
    log::info(kLog, "rendezvous TLS: serving the mounted certificate", {{"dir", flags.rendezvous_tls_dir}});
    return op::serving_tls_from_dir(flags.rendezvous_tls_dir);
  }
  if (flags.rendezvous_tls != op::RendezvousTlsMode::kAuto) {
    log::warn(kLog, "rendezvous TLS is off (--rendezvous-tls off): job tokens cross the pod network in cleartext");
    return {};
  }
  std::string dialled =
      flags.rendezvous_addr.empty() ? rhost : op::split_addr("--rendezvous-addr", flags.rendezvous_addr).first;
  if (dialled.size() > 2 && dialled.front() == '[') dialled = dialled.substr(1, dialled.size() - 2);
  const auto names = op::certificate_names(dialled, rhost, flags.rendezvous_tls_names);
  if (names.empty() || names.front() == "0.0.0.0" || names.front() == "::")
    throw ConfigError(
        "--rendezvous-tls auto: no name for the certificate: set --rendezvous-addr (what pods "
        "dial) or --rendezvous-tls-names");
  const auto [ca_ns, ca_name] = ca_secret_ref(flags);
  log::info(kLog, "rendezvous TLS: certificate issued by the operator's CA",
            {{"ca_secret", ca_ns + "/" + ca_name}, {"names", join(names, ",")}});
  return op::serving_tls_from_secret(client, ca_ns, ca_name, names);
}

// What this replica does when it leads: the rendezvous service, the leader's Endpoints, the reconcile workers. A
// failure to serve ends the process (exit 1), to be restarted by its Deployment.
struct Leadership {
  const Flags& flags;
  kube::Client& client;
  op::Controller& controller;
  metrics::Gauge& leader_gauge;
  op::LeaderEndpoint endpoint;
  const std::atomic<bool>& shutting_down;
  std::atomic<int>& exit_code;
  std::unique_ptr<op::RendezvousService> rdzv{};
  op::ServingTls serving{};        // what the leader serves; the CA goes to the jobs' Secrets
  std::thread endpoints_thread{};  // the leader's Endpoints (--leader-endpoints)

  void start() {
    auto [rhost, rport] = op::split_addr("--rendezvous-bind", flags.rendezvous_bind);
    try {
      op::RendezvousOptions ro;
      ro.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.join_timeout * 1000));
      ro.silence_after = std::chrono::milliseconds(static_cast<int64_t>(flags.agent_silence * 1000));
      ro.max_threads = flags.rendezvous_max_threads;
      serving = rendezvous_tls(flags, client, rhost);
      ro.serving = serving.serving;
      rdzv = std::make_unique<op::RendezvousService>(rhost, rport, ro);
    } catch (const std::exception& e) {
      log::error(kLog, "cannot start the rendezvous service", {{"error", e.what()}});
      exit_code = 1;
      kill(getpid(), SIGTERM);
      return;
    }
    const std::string addr =
        flags.rendezvous_addr.empty() ? rhost + ":" + std::to_string(rdzv->port()) : flags.rendezvous_addr;
    controller.set_rendezvous(rdzv.get(), addr, serving.ca_pem);
    if (!flags.leader_endpoints.empty()) {
      endpoint.port = rdzv->port();
      endpoints_thread = keep_leader_endpoints(client, endpoint, shutting_down);
    }
    controller.start_workers();
    leader_gauge.set(1);
    log::info(kLog, "leading: reconciling", {{"rendezvous", addr}, {"workers", std::to_string(flags.workers)}});
  }
};

// Candidate for the Lease: leads through `leadership`, and exits at once when it loses the lease.
std::unique_ptr<kube::LeaderElector> start_election(const Flags& flags, kube::Client& lease_client,
                                                    const std::string& lease_ns, Leadership& leadership) {
  kube::LeaderElectorOptions lo;
  lo.lease_namespace = lease_ns;
  lo.lease_name = flags.le_name;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  lo.identity = std::string(host) + "_" + op::random_token().substr(0, 10);
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  lo.lease_duration = ms(flags.lease_duration);
  lo.renew_deadline = ms(flags.renew_deadline);
  lo.retry_period = ms(flags.retry_period);
  auto elector = std::make_unique<kube::LeaderElector>(lease_client, lo);
  elector->on_started_leading([&leadership] { leadership.start(); });
  elector->on_stopped_leading([&leadership] {
    leadership.leader_gauge.set(0);
    if (leadership.shutting_down) return;
    // Like controller-runtime: a replica that lost its lease exits, and its restart becomes a candidate again. At
    // once, not after a graceful drain: from the renew deadline on a standby may take the lease, and this replica
    // must neither serve the rendezvous nor write another object by then. The operator may be killed at any line; the
    // next leader redoes from the API server what this one left half done.
    log::error(kLog, "lost the leader lease; exiting at once");
    std::fflush(nullptr);
    std::_Exit(1);
  });
  elector->on_new_leader([](const std::string& id) { log::info(kLog, "leader", {{"identity", id}}); });
  log::info(kLog, "waiting for leadership",
            {{"lease", lo.lease_namespace + "/" + lo.lease_name}, {"identity", lo.identity}});
  elector->start();
  return elector;
}

// --rendezvous-tls files: cert-manager renews the Secret in place; the server keeps the certificate it started with,
// so the operator exits when tls.crt changes and its Deployment restarts it (jobs resume from the API server's state).
std::thread watch_renewal(const Flags& flags, const std::atomic<bool>& shutting_down) {
  if (flags.rendezvous_tls != op::RendezvousTlsMode::kFiles) return {};
  return std::thread([&flags, &shutting_down] {
    const std::string path = flags.rendezvous_tls_dir + "/tls.crt";
    std::string first;
    try {
      first = read_file(path);
    } catch (const std::exception&) {
    }
    for (int s = 1; !shutting_down; ++s) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (s % 30 != 0) continue;
      std::string now;
      try {
        now = read_file(path);
      } catch (const std::exception&) {
        continue;  // mid-update (kubelet swaps the directory atomically, but be patient)
      }
      if (!first.empty() && now != first && !shutting_down) {
        log::info(kLog, "the rendezvous certificate was renewed; exiting to be restarted with it", {{"file", path}});
        kill(getpid(), SIGTERM);
        return;
      }
    }
  });
}

// SIGINT and SIGTERM blocked in every thread (they inherit the mask): main waits for them with sigwait.
sigset_t block_stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return sigs;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  const sigset_t sigs = block_stop_signals();
  Clients clients;
  try {
    clients = make_clients(flags);
  } catch (const std::exception& e) {
    std::cerr << "railyard-operator: " << e.what() << "\n";
    return 2;
  }
  const std::string lease_ns = flags.le_namespace.empty() ? default_lease_namespace() : flags.le_namespace;
  op::LeaderEndpoint leader_endpoint = leader_endpoint_from_env(flags, lease_ns);
  if (flags.leader_elect)
    if (const int rc = check_lease_namespace(*clients.api, lease_ns); rc != 0) return rc;

  metrics::Registry registry;
  auto& leader_gauge = registry.gauge(metrics::names::kOperatorLeader, "1 while this replica is the leader.").add({});
  op::placement_hops(registry);  // exported from the start, observed at each gang placement
  op::Controller controller(*clients.api, registry, controller_options(flags), make_placement(flags));
  Endpoints endpoints;
  try {
    serve_endpoints(flags, registry, *clients.api, controller, endpoints);
  } catch (const std::exception& e) {
    std::cerr << "railyard-operator: " << e.what() << "\n";
    return 2;
  }
  controller.start_informers();
  while (!controller.wait_for_sync(std::chrono::seconds(10)))
    log::warn(
        kLog,
        "informers not synced yet (is the CRD installed? kubectl apply -f deploy/crds/; may the operator list and "
        "watch trainingjobs, pods, services, nodes and priorityclasses? deploy/rbac/operator.yaml)");
  log::info(kLog, "informers synced");

  std::atomic<bool> shutting_down{false};
  std::atomic<int> exit_code{0};
  Leadership leadership{flags, *clients.api, controller, leader_gauge, leader_endpoint, shutting_down, exit_code};
  std::unique_ptr<kube::LeaderElector> elector;
  if (flags.leader_elect)
    elector = start_election(flags, *clients.lease, lease_ns, leadership);
  else
    leadership.start();
  std::thread renewal_watch = watch_renewal(flags, shutting_down);

  int sig = 0;
  sigwait(&sigs, &sig);
  shutting_down = true;
  if (renewal_watch.joinable()) renewal_watch.join();
  log::info(kLog, "shutting down", {{"signal", std::to_string(sig)}});
  controller.stop();
  if (elector) elector->stop();
  // After the elector: a start() that raced the signal has finished (the elector joins it), so the thread it may have
  // started is seen here; it ends on shutting_down.
  if (leadership.endpoints_thread.joinable()) leadership.endpoints_thread.join();
  controller.set_rendezvous(nullptr);
  leadership.rdzv.reset();
  return exit_code.load();
}
