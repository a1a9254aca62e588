#include "operator/flags.h"

#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "common/log.h"

namespace railyard::op {

const char* const kOperatorUsage = R"(usage: railyard-operator [flags]
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
  --agent-silence-seconds S         a pod whose agent sent no request for S seconds (at least 3 of its
                                    heartbeats) while a peer's did is taken as lost and replaced at once,
                                    without waiting for its node to turn NotReady (default 4; 0 = off; half
                                    of it once a survivor reported losing a peer; docs/rendezvous.md "A pod
                                    that falls silent")
  --rendezvous-max-threads N        most request threads of the rendezvous service (default 2048, 64..65536): a
                                    pod's join holds one while its world forms, so a job of more pods than this
                                    forms over several join holds; each held join costs 30-75 KiB of memory
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

namespace {

[[noreturn]] void refuse(const std::string& what) { throw ConfigError(what); }

// The value's parsers: each names the flag and what it takes.
// A decimal number of at least `min` (above it when `strict`); `fix` ends the message.
double decimal(const std::string& flag, const std::string& v, double min, bool strict, const std::string& fix) {
  try {
    size_t used = 0;
    const double d = std::stod(v, &used);
    if (used == v.size() && (strict ? d > min : d >= min)) return d;
  } catch (const std::exception&) {
  }
  refuse(flag + " '" + v + "': " + fix);
}

double seconds(const std::string& flag, const std::string& v) {
  return decimal(flag, v, 0, true, "expected a positive number of seconds");
}

// A whole number in [lo, hi]; `fix` ends the message.
int whole(const std::string& flag, const std::string& v, int lo, int hi, const std::string& fix) {
  try {
    size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used == v.size() && n >= lo && n <= hi) return n;
  } catch (const std::exception&) {
  }
  refuse(flag + " '" + v + "': " + fix);
}

bool boolean(const std::string& flag, const std::string& v) {
  if (v != "true" && v != "false") refuse(flag + "='" + v + "': use true or false");
  return v == "true";
}

using Setter = std::function<void(OperatorFlags& f, const std::string& flag, const std::string& v)>;
struct FlagSpec {
  bool is_switch = false;  // --flag alone means true; a value only as --flag=true|false
  Setter set;
};

// A flag that copies its value into a string field.
FlagSpec text(std::string OperatorFlags::*field) {
  return {false, [field](OperatorFlags& f, const std::string&, const std::string& v) { f.*field = v; }};
}

// A flag whose value is an absolute directory.
FlagSpec directory(std::string OperatorFlags::*field) {
  return {false, [field](OperatorFlags& f, const std::string& a, const std::string& v) {
            if (v.empty() || v.front() != '/') refuse(a + " '" + v + "': use an absolute directory");
            f.*field = v;
          }};
}

// A flag whose value is a port, 0 turning the endpoint off.
FlagSpec port(int OperatorFlags::*field) {
  return {false, [field](OperatorFlags& f, const std::string& a, const std::string& v) {
            f.*field = whole(a, v, 0, 65535, "use a port number, or 0 to turn it off");
          }};
}

// A flag whose value names a mode: `parse` reads it (nullopt: no such name), `names` lists the ones there are.
template <class Mode>
FlagSpec mode(Mode OperatorFlags::*field, std::optional<Mode> (*parse)(const std::string&), const char* names) {
  return {false, [field, parse, names](OperatorFlags& f, const std::string& a, const std::string& v) {
            const std::optional<Mode> m = parse(v);
            if (!m) refuse(a + " '" + v + "': use " + names);
            f.*field = *m;
          }};
}

const std::map<std::string, FlagSpec>& flag_table() {
  using F = OperatorFlags;
  using S = const std::string&;
  static const std::map<std::string, FlagSpec> table = {
      {"--kubeconfig", text(&F::kubeconfig)},
      {"--context", text(&F::context)},
      {"--namespace", text(&F::ns)},
      {"--metrics-addr", text(&F::metrics_addr)},
      {"--health-addr", text(&F::health_addr)},
      {"--metrics-secure", {true, [](F& f, S a, S v) { f.metrics_secure = boolean(a, v); }}},
      {"--metrics-cert-dir", text(&F::metrics_cert_dir)},
      {"--leader-elect", {true, [](F& f, S a, S v) { f.leader_elect = boolean(a, v); }}},
      {"--leader-election-namespace", text(&F::le_namespace)},
      {"--leader-election-id", text(&F::le_name)},
      {"--lease-duration", {false, [](F& f, S a, S v) { f.lease_duration = seconds(a, v); }}},
      {"--renew-deadline", {false, [](F& f, S a, S v) { f.renew_deadline = seconds(a, v); }}},
      {"--retry-period", {false, [](F& f, S a, S v) { f.retry_period = seconds(a, v); }}},
      {"--join-timeout", {false, [](F& f, S a, S v) { f.join_timeout = seconds(a, v); }}},
      {"--agent-silence-seconds",
       {false,
        [](F& f, S a, S v) {
          f.agent_silence = decimal(a, v, 0, false, "expected seconds, 0 (off) or more (at least 1 s when on)");
          if (f.agent_silence > 0 && f.agent_silence < 1) refuse(a + " '" + v + "': at least 1 s when on (0 = off)");
        }}},
      {"--rendezvous-max-threads",
       {false, [](F& f, S a, S v) { f.rendezvous_max_threads = whole(a, v, 64, 65536, "use 64 to 65536 threads"); }}},
      {"--worker-image", text(&F::worker_image)},
      {"--worker-command", text(&F::worker_command)},
      {"--rendezvous-bind", text(&F::rendezvous_bind)},
      {"--rendezvous-addr", text(&F::rendezvous_addr)},
      {"--rendezvous-tls", mode(&F::rendezvous_tls, rendezvous_tls_mode_from_string, "auto, files or off")},
      {"--rendezvous-ca-secret",
       {false,
        [](F& f, S a, S v) {
          if (v.empty() || v.back() == '/') refuse(a + " '" + v + "': use NAME or NAMESPACE/NAME");
          f.rendezvous_ca_secret = v;
        }}},
      {"--leader-endpoints",
       {false,
        [](F& f, S a, S v) {
          if (v.empty()) refuse(a + ": name the rendezvous Service");
          f.leader_endpoints = v;
        }}},
      {"--rendezvous-tls-dir", text(&F::rendezvous_tls_dir)},
      {"--rendezvous-tls-names",
       {false,
        [](F& f, S, S v) {
          std::stringstream ss(v);
          for (std::string n; std::getline(ss, n, ',');)
            if (!n.empty()) f.rendezvous_tls_names.push_back(n);
        }}},
      {"--data-root", directory(&F::data_root)},
      {"--checkpoint-root", directory(&F::checkpoint_root)},
      {"--worker-metrics-port", port(&F::worker_metrics_port)},
      {"--agent-metrics-port", port(&F::agent_metrics_port)},
      {"--network-policy", mode(&F::network_policy, network_policy_mode_from_string, "none, ingress or strict")},
      {"--cluster-domain",
       {false,
        [](F& f, S a, S v) {
          if (!names::is_dns_subdomain(v)) refuse(a + " '" + v + "': use a lowercase DNS name such as cluster.local");
          f.cluster_domain = v;
        }}},
      {"--placement",
       {false,
        [](F& f, S a, S v) {
          if (v != "rail-aware" && v != "simple") refuse(a + " '" + v + "': use rail-aware or simple");
          f.placement = v;
        }}},
      {"--workers", {false, [](F& f, S a, S v) { f.workers = whole(a, v, 1, 64, "use 1 to 64"); }}},
      {"--kube-api-qps",
       {false,
        [](F& f, S a, S v) {
          f.kube_api_qps = decimal(a, v, 0, false, "expected a number of requests per second >= 0 (0 = no limit)");
        }}},
      {"--kube-api-burst",
       {false, [](F& f, S a,
                  S v) { f.kube_api_burst = whole(a, v, 1, 1 << 30, "expected a whole number of requests >= 1"); }}},
      {"--api-parallelism", {false, [](F& f, S a, S v) { f.api_parallelism = whole(a, v, 1, 1024, "use 1 to 1024"); }}},
      {"--log-level",
       {false,
        [](F& f, S a, S v) {
          try {
            (void)log::parse_level(v);
          } catch (const std::exception& e) {
            refuse(a + ": " + e.what());
          }
          f.log_level = v;
        }}},
  };
  return table;
}

// What no single flag can check: pairs that must agree.
void check_together(const OperatorFlags& f) {
  if (f.renew_deadline >= f.lease_duration) refuse("--renew-deadline must be shorter than --lease-duration");
  split_addr("--metrics-addr", f.metrics_addr);
  split_addr("--health-addr", f.health_addr);
  split_addr("--rendezvous-bind", f.rendezvous_bind);
  if (!f.rendezvous_addr.empty()) split_addr("--rendezvous-addr", f.rendezvous_addr);
  if (f.rendezvous_tls == RendezvousTlsMode::kFiles && f.rendezvous_tls_dir.empty())
    refuse("--rendezvous-tls files needs --rendezvous-tls-dir DIR (where tls.crt, tls.key and ca.crt are)");
  if (f.rendezvous_tls != RendezvousTlsMode::kFiles && !f.rendezvous_tls_dir.empty())
    refuse("--rendezvous-tls-dir is read only with --rendezvous-tls files");
  if (!f.metrics_secure && !f.metrics_cert_dir.empty()) refuse("--metrics-cert-dir is read only with --metrics-secure");
}

}  // namespace

std::pair<std::string, int> split_addr(const std::string& flag, const std::string& addr) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0) refuse(flag + " '" + addr + "': expected HOST:PORT");
  try {
    size_t used = 0;
    const int port = std::stoi(addr.substr(colon + 1), &used);
    if (used == addr.size() - colon - 1 && port >= 0 && port <= 65535) return {addr.substr(0, colon), port};
  } catch (const std::exception&) {
  }
  refuse(flag + " '" + addr + "': the port must be a number from 0 to 65535");
}

OperatorFlags parse_operator_flags(const std::vector<std::string>& args) {
  OperatorFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    const auto eq = a.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    if (a == "-h" || a == "--help") {
      f.help = true;
      return f;
    }
    const auto it = flag_table().find(a);
    if (it == flag_table().end()) refuse("unknown flag '" + a + "'");
    if (!has_value && it->second.is_switch) {
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) refuse(a + " needs a value");
      value = args[++i];
    }
    it->second.set(f, a, value);
  }
  check_together(f);
  return f;
}

}  // namespace railyard::op
