#include "monitor/flags.h"

#include <algorithm>
#include <functional>
#include <map>

namespace railyard::monitor {

const char* const kMonitorUsage = R"(usage: railyard-monitor [flags]
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

namespace {

[[noreturn]] void refuse(const std::string& what) { throw ConfigError(what); }

// Every numeric flag takes a non-negative decimal; the integer ones truncate it.
double to_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used == v.size() && d >= 0) return d;
  } catch (const std::exception&) {
  }
  refuse(flag + " '" + v + "' is not a non-negative number");
}

using Setter = std::function<void(MonitorFlags& f, const std::string& flag, const std::string& v)>;
struct FlagSpec {
  bool is_switch = false;  // --flag alone means true; a value only as --flag=true|false
  Setter set;
};

// A flag that copies its value into a string field.
FlagSpec text(std::string MonitorFlags::*field) {
  return {false, [field](MonitorFlags& f, const std::string&, const std::string& v) { f.*field = v; }};
}

// A flag that sets a number of the struct (the leader election timings).
FlagSpec number(double MonitorFlags::*field) {
  return {false, [field](MonitorFlags& f, const std::string& a, const std::string& v) { f.*field = to_double(a, v); }};
}

// A flag that sets a threshold of the rules' default policy.
FlagSpec threshold(double Policy::*field) {
  return {false, [field](MonitorFlags& f, const std::string& a, const std::string& v) {
            f.opts.defaults.*field = to_double(a, v);
          }};
}

const std::map<std::string, FlagSpec>& flag_table() {
  using F = MonitorFlags;
  using S = const std::string&;
  static const std::map<std::string, FlagSpec> table = {
      {"--kubeconfig", text(&F::kubeconfig)},
      {"--prometheus-url", {false, [](F& f, S, S v) { f.opts.prometheus_url = v; }}},
      {"--interval", {false, [](F& f, S a, S v) { f.opts.interval_s = to_double(a, v); }}},
      {"--listen", {false, [](F& f, S, S v) { f.opts.listen = v; }}},
      {"--webhook-token-file", text(&F::token_file)},
      {"--namespace", {false, [](F& f, S, S v) { f.opts.ns = v; }}},
      {"--metrics-port", {false, [](F& f, S a, S v) { f.opts.metrics_port = static_cast<int>(to_double(a, v)); }}},
      {"--stall-floor", threshold(&Policy::stall_floor_s)},
      {"--stopped-seconds", threshold(&Policy::stopped_s)},
      {"--idle-seconds", threshold(&Policy::idle_s)},
      {"--stall-factor", threshold(&Policy::stall_factor)},
      {"--unreachable", threshold(&Policy::unreachable_s)},
      {"--straggler-window", threshold(&Policy::straggler_window_s)},
      {"--leader-elect",
       {true,
        [](F& f, S, S v) {
          if (v != "true" && v != "false") refuse("--leader-elect='" + v + "': use true or false");
          f.leader_elect = v == "true";
        }}},
      {"--leader-election-namespace", text(&F::le_namespace)},
      {"--leader-election-id", text(&F::le_name)},
      {"--lease-duration", number(&F::lease_duration)},
      {"--renew-deadline", number(&F::renew_deadline)},
      {"--retry-period", number(&F::retry_period)},
      {"--debounce",
       {false,
        [](F& f, S a, S v) { f.opts.defaults.debounce_evals = std::max(1, static_cast<int>(to_double(a, v))); }}},
  };
  return table;
}

}  // namespace

MonitorFlags parse_monitor_flags(const std::vector<std::string>& args) {
  MonitorFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    bool has_value = false;
    // --flag=value as well as --flag value: the chart (and every Kubernetes manifest convention) uses the former.
    if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    if (a == "-h" || a == "--help") {
      f.help = true;
      return f;
    }
    const auto it = flag_table().find(a);
    if (it == flag_table().end()) refuse("unknown flag '" + a + "' (see --help)");
    if (!has_value && it->second.is_switch) {
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) refuse(a + " needs a value (see --help)");
      value = args[++i];
    }
    it->second.set(f, a, value);
  }
  return f;
}

void check_monitor_flags(const MonitorFlags& f) {
  parse_listen(f.opts.listen);
  if (f.leader_elect &&
      !(f.retry_period > 0 && f.renew_deadline > f.retry_period && f.lease_duration > f.renew_deadline))
    refuse("leader election timing: want 0 < --retry-period < --renew-deadline < --lease-duration");
}

}  // namespace railyard::monitor
