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
#include "operator/rendezvous/rendezvous.h"
#include "operator/scheduler/rail_aware.h"

namespace {

using namespace railyard;
constexpr const char* kLog = "operator";

struct Flags {
  std::string kubeconfig, context, ns;
  std::string metrics_addr = "127.0.0.1:8080";
  std::string health_addr = "127.0.0.1:8081";
  bool leader_elect = true;
  std::string le_namespace, le_name = "railyard-operator";
  double lease_duration = 15, renew_deadline = 10, retry_period = 2;
  std::string worker_image = "railyard/worker:latest";
  std::string worker_command = "railyard-worker";
  std::string rendezvous_bind = "127.0.0.1:9090";
  std::string rendezvous_addr;
  double join_timeout = 300;
  int workers = 2;
  double kube_api_qps = 50;
  int kube_api_burst = 1000;
  int api_parallelism = op::ControllerOptions{}.api_parallelism;
  std::string placement = "rail-aware";
  int worker_metrics_port = 9400, agent_metrics_port = 9399;
  std::string data_root, checkpoint_root;
  op::NetworkPolicyMode network_policy = op::NetworkPolicyMode::kIngress;
  std::string cluster_domain = names::kDefaultClusterDomain;
  op::RendezvousTlsMode rendezvous_tls = op::RendezvousTlsMode::kAuto;
  std::string rendezvous_ca_secret = "railyard-rendezvous-ca";  // [NS/]NAME
  std::string rendezvous_tls_dir;
  std::vector<std::string> rendezvous_tls_names;
  std::string leader_endpoints;  // Endpoints the leader writes with its own address (--leader-endpoints)
  bool metrics_secure = false;   // /metrics over HTTPS, readers reviewed by the API server (--metrics-secure)
  std::string metrics_cert_dir;  // tls.crt + tls.key to serve instead of a self-signed certificate
};

const char* kUsage = R"(usage: railyard-operator [flags]
Runs the TrainingJob controller against the cluster of $KUBECONFIG (or --kubeconfig, or the in-cluster config).
  --kubeconfig PATH                 kubeconfig file (default $KUBECONFIG, ~/.kube/config, in-cluster)
  --context NAME                    kubeconfig context (default: current-context)
  --namespace NS                    watch one namespace (default: all)
  --metrics-addr HOST:PORT          Prometheus /metrics (default 127.0.0.1:8080; port 0 picks one)
  --health-addr HOST:PORT           /healthz and /readyz (default 127.0.0.1:8081; port 0 picks one)
  --metrics-secure[=true|false]     serve /metrics over HTTPS and only to a bearer token whose user may `get` the
                                    path (TokenReview, SubjectAccessReview; docs/hardening.md). Default false
  --metrics-cert-dir DIR            with --metrics-secure: serve DIR/tls.crt and DIR/tls.key (default: a
                                    self-signed certificate made at start)
  --leader-elect[=true|false]       elect a leader through a Lease (default true)
  --leader-election-namespace NS    namespace of the Lease (default: the pod's namespace in-cluster, else
                                    railyard-system; the namespace must exist)
  --leader-election-id NAME         Lease name (default railyard-operator)
  --lease-duration S, --renew-deadline S, --retry-period S   leader election timing (15, 10, 2 seconds)
  --worker-image IMAGE              worker image when spec.image is empty (default railyard/worker:latest)
  --worker-command PATH             agent binary run as `PATH agent` (default railyard-worker; on the local
                                    cluster the absolute path of build/bin/railyard-worker)
  --rendezvous-bind HOST:PORT       where the leader's rendezvous service listens (default 127.0.0.1:9090)
  --rendezvous-addr HOST:PORT       what pods are told to dial (default: the bound address)
  --rendezvous-tls auto|files|off   TLS of the rendezvous service (default auto): auto keeps a CA in the Secret
                                    --rendezvous-ca-secret and gives the leader a certificate for the host pods
                                    dial; files serves what --rendezvous-tls-dir holds (tls.crt, tls.key, ca.crt: a
                                    cert-manager Certificate's Secret); off is plain HTTP (job tokens then cross the
                                    pod network in cleartext)
  --rendezvous-ca-secret [NS/]NAME  the CA Secret of auto (default railyard-rendezvous-ca in the operator's
                                    namespace: the pod's in-cluster, else --namespace, else railyard-system)
  --rendezvous-tls-dir DIR          files: the mounted certificate; the operator exits to be restarted when
                                    tls.crt changes (a renewal)
  --rendezvous-tls-names N1,N2      auto: more DNS names or IP addresses for the certificate
  --leader-endpoints NAME           the leader writes the Endpoints NAME in the operator's namespace with its own
                                    pod as the only address (POD_IP, POD_NAME, POD_UID from the downward API): the
                                    rendezvous Service of that name has no selector, so agents reach the leader
                                    and never a standby (default: none)
  --join-timeout S                  how long a joined pod waits for the rest of its generation before the
                                    service reports a join timeout (default 300)
  --workers N                       reconcile threads (default 2)
  --kube-api-qps Q                  client rate limit, requests per second (default 50; 0 = no limit)
  --kube-api-burst B                client burst above the rate (default 1000: one gang of 1,000 pods at once)
  --api-parallelism N               concurrent create/bind requests of one job's reconcile, in slow-start
                                    batches (default 16; the rate limit still applies)
  --placement rail-aware|simple     gang placement: rail-aware (default; docs/scheduler.md) or simple first fit
  --worker-metrics-port P           worker pods serve /metrics on P + local rank (default 9400; 0 = off)
  --agent-metrics-port P            the pods' agents serve /metrics on P (default 9399; 0 = off)
  --data-root DIR                   jobs' spec.data.train/val must lie under DIR (after resolving ".."; the
                                    workers also resolve symlinks); default: no restriction
  --checkpoint-root DIR             the same for spec.checkpoint.path
  --network-policy none|ingress|strict   a NetworkPolicy per job (default ingress): its pods accept connections
                                    only from the job's pods, and on the metrics ports from anyone; strict also
                                    limits where they connect to: the job's pods, the rendezvous port and DNS
  --cluster-domain DOMAIN           the cluster's DNS domain (the kubelets' clusterDomain; default
                                    cluster.local): program pods are named <pod>.<job>.<namespace>.svc.DOMAIN
  --log-level debug|info|warn|error
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "railyard-operator: " << msg << "\n" << kUsage;
  std::exit(2);
}

std::pair<std::string, int> split_addr(const std::string& flag, const std::string& addr) {
  auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0) usage_error(flag + " '" + addr + "': expected HOST:PORT");
  try {
    size_t used = 0;
    int port = std::stoi(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1 || port < 0 || port > 65535) throw std::invalid_argument("port");
    return {addr.substr(0, colon), port};
  } catch (const std::exception&) {
    usage_error(flag + " '" + addr + "': the port must be a number from 0 to 65535");
  }
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto number = [&](const std::string& v) {
      try {
        size_t used = 0;
        double d = std::stod(v, &used);
        if (used != v.size() || d <= 0) throw std::invalid_argument("");
        return d;
      } catch (const std::exception&) {
        usage_error(a + " '" + v + "': expected a positive number of seconds");
      }
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--kubeconfig") {
      f.kubeconfig = next();
    } else if (a == "--context") {
      f.context = next();
    } else if (a == "--namespace") {
      f.ns = next();
    } else if (a == "--metrics-addr") {
      f.metrics_addr = next();
    } else if (a == "--health-addr") {
      f.health_addr = next();
    } else if (a == "--metrics-secure") {
      std::string v = has_value ? value : "true";
      if (v != "true" && v != "false") usage_error("--metrics-secure='" + v + "': use true or false");
      f.metrics_secure = v == "true";
    } else if (a == "--metrics-cert-dir") {
      f.metrics_cert_dir = next();
    } else if (a == "--leader-elect") {
      std::string v = has_value ? value : "true";
      if (v != "true" && v != "false") usage_error("--leader-elect='" + v + "': use true or false");
      f.leader_elect = v == "true";
    } else if (a == "--leader-election-namespace") {
      f.le_namespace = next();
    } else if (a == "--leader-election-id") {
      f.le_name = next();
    } else if (a == "--lease-duration") {
      f.lease_duration = number(next());
    } else if (a == "--renew-deadline") {
      f.renew_deadline = number(next());
    } else if (a == "--retry-period") {
      f.retry_period = number(next());
    } else if (a == "--worker-image") {
      f.worker_image = next();
    } else if (a == "--worker-command") {
      f.worker_command = next();
    } else if (a == "--rendezvous-bind") {
      f.rendezvous_bind = next();
    } else if (a == "--rendezvous-addr") {
      f.rendezvous_addr = next();
    } else if (a == "--rendezvous-tls") {
      const std::string v = next();
      auto m = op::rendezvous_tls_mode_from_string(v);
      if (!m) usage_error("--rendezvous-tls '" + v + "': use auto, files or off");
      f.rendezvous_tls = *m;
    } else if (a == "--rendezvous-ca-secret") {
      f.rendezvous_ca_secret = next();
      if (f.rendezvous_ca_secret.empty() || f.rendezvous_ca_secret.back() == '/')
        usage_error("--rendezvous-ca-secret '" + f.rendezvous_ca_secret + "': use NAME or NAMESPACE/NAME");
    } else if (a == "--leader-endpoints") {
      f.leader_endpoints = next();
      if (f.leader_endpoints.empty()) usage_error("--leader-endpoints: name the rendezvous Service");
    } else if (a == "--rendezvous-tls-dir") {
      f.rendezvous_tls_dir = next();
    } else if (a == "--rendezvous-tls-names") {
      std::stringstream ss(next());
      for (std::string n; std::getline(ss, n, ',');)
        if (!n.empty()) f.rendezvous_tls_names.push_back(n);
    } else if (a == "--data-root" || a == "--checkpoint-root") {
      std::string v = next();
      if (v.empty() || v.front() != '/') usage_error(a + " '" + v + "': use an absolute directory");
      (a == "--data-root" ? f.data_root : f.checkpoint_root) = v;
    } else if (a == "--join-timeout") {
      f.join_timeout = number(next());
    } else if (a == "--worker-metrics-port" || a == "--agent-metrics-port") {
      const std::string v = next();
      int port = -1;
      try {
        port = std::stoi(v);
      } catch (const std::exception&) {
      }
      if (port < 0 || port > 65535) usage_error(a + " '" + v + "': use a port number, or 0 to turn it off");
      (a == "--worker-metrics-port" ? f.worker_metrics_port : f.agent_metrics_port) = port;
    } else if (a == "--network-policy") {
      const std::string v = next();
      auto m = op::network_policy_mode_from_string(v);
      if (!m) usage_error("--network-policy '" + v + "': use none, ingress or strict");
      f.network_policy = *m;
    } else if (a == "--cluster-domain") {
      f.cluster_domain = next();
      if (!names::is_dns_subdomain(f.cluster_domain))
        usage_error("--cluster-domain '" + f.cluster_domain + "': use a lowercase DNS name such as cluster.local");
    } else if (a == "--placement") {
      f.placement = next();
      if (f.placement != "rail-aware" && f.placement != "simple")
        usage_error("--placement '" + f.placement + "': use rail-aware or simple");
    } else if (a == "--workers") {
      std::string v = next();
      try {
        f.workers = std::stoi(v);
      } catch (const std::exception&) {
        f.workers = 0;
      }
      if (f.workers < 1 || f.workers > 64) usage_error("--workers '" + v + "': use 1 to 64");
    } else if (a == "--kube-api-qps") {
      const std::string v = next();
      try {
        size_t used = 0;
        f.kube_api_qps = std::stod(v, &used);
        if (used != v.size() || f.kube_api_qps < 0) throw std::invalid_argument("");
      } catch (const std::exception&) {
        usage_error("--kube-api-qps '" + v + "': expected a number of requests per second >= 0 (0 = no limit)");
      }
    } else if (a == "--kube-api-burst") {
      const std::string v = next();
      try {
        size_t used = 0;
        f.kube_api_burst = std::stoi(v, &used);
        if (used != v.size() || f.kube_api_burst < 1) throw std::invalid_argument("");
      } catch (const std::exception&) {
        usage_error("--kube-api-burst '" + v + "': expected a whole number of requests >= 1");
      }
    } else if (a == "--api-parallelism") {
      const std::string v = next();
      try {
        size_t used = 0;
        f.api_parallelism = std::stoi(v, &used);
        if (used != v.size()) throw std::invalid_argument("");
      } catch (const std::exception&) {
        f.api_parallelism = 0;
      }
      if (f.api_parallelism < 1 || f.api_parallelism > 1024)
        usage_error("--api-parallelism '" + v + "': use 1 to 1024");
    } else if (a == "--log-level") {
      std::string v = next();
      try {
        log::set_level(log::parse_level(v));
      } catch (const std::exception& e) {
        usage_error(std::string("--log-level: ") + e.what());
      }
    } else {
      usage_error("unknown flag '" + a + "'");
    }
  }
  if (f.renew_deadline >= f.lease_duration) usage_error("--renew-deadline must be shorter than --lease-duration");
  split_addr("--metrics-addr", f.metrics_addr);
  split_addr("--health-addr", f.health_addr);
  split_addr("--rendezvous-bind", f.rendezvous_bind);
  if (!f.rendezvous_addr.empty()) split_addr("--rendezvous-addr", f.rendezvous_addr);
  if (f.rendezvous_tls == op::RendezvousTlsMode::kFiles && f.rendezvous_tls_dir.empty())
    usage_error("--rendezvous-tls files needs --rendezvous-tls-dir DIR (where tls.crt, tls.key and ca.crt are)");
  if (f.rendezvous_tls != op::RendezvousTlsMode::kFiles && !f.rendezvous_tls_dir.empty())
    usage_error("--rendezvous-tls-dir is read only with --rendezvous-tls files");
  if (!f.metrics_secure && !f.metrics_cert_dir.empty())
    usage_error("--metrics-cert-dir is read only with --metrics-secure");
  return f;
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

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parse_flags(argc, argv);
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // every thread inherits this; main waits for them below
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<kube::Client> client;
  // The leader election's own client: its own connections and rate limiter (never queued behind the controller's
  // requests), at most one quick retry and a short timeout, so a stalled API connection costs it about one retry period
  // per attempt, not the controller's 30 s with retries (kube/leader_elector.h).
  std::unique_ptr<kube::Client> lease_client;
  try {
    kube::Config cfg =
        flags.kubeconfig.empty() ? kube::default_config() : kube::load_kubeconfig(flags.kubeconfig, flags.context);
    const kube::Config lease_cfg =
        kube::lease_client_config(cfg, std::chrono::milliseconds(static_cast<int64_t>(flags.retry_period * 1000)));
    cfg.qps = flags.kube_api_qps;
    cfg.burst = flags.kube_api_burst;
    // One connection per concurrent create/bind of a reconcile's slow-start batch (ControllerOptions).
    cfg.max_connections = std::max(cfg.max_connections, flags.api_parallelism);
    client = std::make_unique<kube::Client>(cfg);
    if (flags.leader_elect) lease_client = std::make_unique<kube::Client>(lease_cfg);
  } catch (const std::exception& e) {
    std::cerr << "railyard-operator: " << e.what() << "\n";
    return 2;
  }

  const std::string lease_ns = flags.le_namespace.empty() ? default_lease_namespace() : flags.le_namespace;
  op::LeaderEndpoint leader_endpoint;
  if (!flags.leader_endpoints.empty()) {
    auto env = [](const char* k) {
      const char* v = std::getenv(k);
      return std::string(v ? v : "");
    };
    leader_endpoint = {lease_ns, flags.leader_endpoints, env("POD_NAME"), env("POD_UID"), env("POD_IP"), 0};
    if (leader_endpoint.pod_ip.empty())
      usage_error(
          "--leader-endpoints: POD_IP is not set (give the container env POD_IP from fieldRef status.podIP, "
          "and POD_NAME, POD_UID from metadata.name, metadata.uid)");
  }
  if (flags.leader_elect) {
    // A missing namespace would otherwise only show as a candidate that never leads.
    try {
      if (!client->try_get(kube::resources::namespaces, "", lease_ns)) {
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
  }

  metrics::Registry registry;
  auto& leader_gauge = registry.gauge(metrics::names::kOperatorLeader, "1 while this replica is the leader.").add({});
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
  op::placement_hops(registry);  // exported from the start, observed at each gang placement
  std::unique_ptr<op::Placement> placement;
  if (flags.placement == "simple")
    placement = std::make_unique<op::SimplePlacement>();
  else
    placement = std::make_unique<op::sched::RailAwarePlacement>();
  op::Controller controller(*client, registry, copts, std::make_unique<op::ReservingPlacement>(std::move(placement)));

  std::unique_ptr<metrics::Exposer> exposer;
  httplib::Server health;
  std::thread health_thread;
  auto [hhost, hport] = split_addr("--health-addr", flags.health_addr);
  auto [mhost, mport] = split_addr("--metrics-addr", flags.metrics_addr);
  try {
    exposer = metrics_exposer(flags, registry, *client, mhost, mport);
    railyard::http::apply(health, railyard::http::kSmallRequests);
    health.Get("/healthz",
               [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
    health.Get("/readyz", [&controller](const httplib::Request&, httplib::Response& res) {
      if (controller.synced()) {
        res.set_content("ok\n", "text/plain");
      } else {
        res.status = 503;
        res.set_content("informers not synced\n", "text/plain");
      }
    });
    if (hport == 0) {
      hport = health.bind_to_any_port(hhost);
    } else if (!health.bind_to_port(hhost, hport)) {
      hport = -1;
    }
    if (hport < 0) throw Error("--health-addr " + flags.health_addr + ": cannot listen (port in use?)");
    health_thread = std::thread([&health] { health.listen_after_bind(); });
  } catch (const std::exception& e) {
    std::cerr << "railyard-operator: " << e.what() << "\n";
    return 2;
  }
  log::info(kLog, "serving",
            {{"metrics", mhost + ":" + std::to_string(exposer->port())},
             {"metrics_tls", flags.metrics_secure ? "on" : "off"},
             {"health", hhost + ":" + std::to_string(hport)}});

  controller.start_informers();
  while (!controller.wait_for_sync(std::chrono::seconds(10)))
    log::warn(
        kLog,
        "informers not synced yet (is the CRD installed? kubectl apply -f deploy/crds/; may the operator list and "
        "watch trainingjobs, pods, services, nodes and priorityclasses? deploy/rbac/operator.yaml)");
  log::info(kLog, "informers synced");

  std::unique_ptr<op::RendezvousService> rdzv;
  std::atomic<bool> shutting_down{false};
  std::atomic<int> exit_code{0};
  op::ServingTls serving;        // what the leader serves; the CA goes to the jobs' Secrets
  std::thread endpoints_thread;  // the leader's Endpoints (--leader-endpoints)
  auto start_leading = [&] {
    auto [rhost, rport] = split_addr("--rendezvous-bind", flags.rendezvous_bind);
    try {
      op::RendezvousOptions ro;
      ro.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.join_timeout * 1000));
      if (flags.rendezvous_tls == op::RendezvousTlsMode::kAuto) {
        std::string dialled =
            flags.rendezvous_addr.empty() ? rhost : split_addr("--rendezvous-addr", flags.rendezvous_addr).first;
        if (dialled.size() > 2 && dialled.front() == '[') dialled = dialled.substr(1, dialled.size() - 2);
        const auto names = op::certificate_names(dialled, rhost, flags.rendezvous_tls_names);
        if (names.empty() || names.front() == "0.0.0.0" || names.front() == "::")
          throw ConfigError(
              "--rendezvous-tls auto: no name for the certificate: set --rendezvous-addr (what pods "
              "dial) or --rendezvous-tls-names");
        const auto [ca_ns, ca_name] = ca_secret_ref(flags);
        serving = op::serving_tls_from_secret(*client, ca_ns, ca_name, names);
        log::info(kLog, "rendezvous TLS: certificate issued by the operator's CA",
                  {{"ca_secret", ca_ns + "/" + ca_name}, {"names", join(names, ",")}});
      } else if (flags.rendezvous_tls == op::RendezvousTlsMode::kFiles) {
        serving = op::serving_tls_from_dir(flags.rendezvous_tls_dir);
        log::info(kLog, "rendezvous TLS: serving the mounted certificate", {{"dir", flags.rendezvous_tls_dir}});
      } else {
        log::warn(kLog, "rendezvous TLS is off (--rendezvous-tls off): job tokens cross the pod network in cleartext");
      }
      ro.serving = serving.serving;
      rdzv = std::make_unique<op::RendezvousService>(rhost, rport, ro);
    } catch (const std::exception& e) {
      log::error(kLog, "cannot start the rendezvous service", {{"error", e.what()}});
      exit_code = 1;
      kill(getpid(), SIGTERM);
      return;
    }
    std::string addr =
        flags.rendezvous_addr.empty() ? rhost + ":" + std::to_string(rdzv->port()) : flags.rendezvous_addr;
    controller.set_rendezvous(rdzv.get(), addr, serving.ca_pem);
    if (!flags.leader_endpoints.empty()) {
      leader_endpoint.port = rdzv->port();
      endpoints_thread = keep_leader_endpoints(*client, leader_endpoint, shutting_down);
    }
    controller.start_workers();
    leader_gauge.set(1);
    log::info(kLog, "leading: reconciling", {{"rendezvous", addr}, {"workers", std::to_string(flags.workers)}});
  };

  std::unique_ptr<kube::LeaderElector> elector;
  if (flags.leader_elect) {
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
    elector = std::make_unique<kube::LeaderElector>(*lease_client, lo);
    elector->on_started_leading(start_leading);
    elector->on_stopped_leading([&] {
      leader_gauge.set(0);
      if (shutting_down) return;
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
  } else {
    start_leading();
  }

  // files: cert-manager renews the Secret in place; the server keeps the certificate it started with, so the
  // operator exits when tls.crt changes and its Deployment restarts it (jobs resume from the API server's state).
  std::thread renewal_watch;
  if (flags.rendezvous_tls == op::RendezvousTlsMode::kFiles) {
    renewal_watch = std::thread([&] {
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

  int sig = 0;
  sigwait(&sigs, &sig);
  shutting_down = true;
  if (renewal_watch.joinable()) renewal_watch.join();
  log::info(kLog, "shutting down", {{"signal", std::to_string(sig)}});
  controller.stop();
  if (elector) elector->stop();
  // After the elector: a start_leading that raced the signal has finished (the elector joins it), so the thread it may
  // have started is seen here; it ends on shutting_down.
  if (endpoints_thread.joinable()) endpoints_thread.join();
  controller.set_rendezvous(nullptr);
  rdzv.reset();
  health.stop();
  if (health_thread.joinable()) health_thread.join();
  return exit_code.load();
}
