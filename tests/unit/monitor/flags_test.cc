// railyard-monitor's command line (monitor/flags.h): every flag sets its field, and a bad value is refused naming
// the flag and the fix.
#include "monitor/flags.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace railyard::monitor;

namespace {

// The message parse_monitor_flags and then check_monitor_flags refuse `args` with ("" when they accept them).
std::string refusal(const std::vector<std::string>& args) {
  try {
    check_monitor_flags(parse_monitor_flags(args));
  } catch (const railyard::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("monitor flags: the defaults, and every kind of flag sets its field") {
  const MonitorFlags d = parse_monitor_flags({});
  CHECK_FALSE(d.help);
  CHECK_FALSE(d.leader_elect);
  CHECK(d.le_name == "railyard-monitor");
  CHECK(d.opts.listen == "127.0.0.1:9402");
  CHECK(d.opts.interval_s == 1);
  CHECK(d.opts.metrics_port == 9400);
  CHECK(d.lease_duration == 15);
  CHECK(d.renew_deadline == 10);
  CHECK(d.retry_period == 2);

  const MonitorFlags f = parse_monitor_flags({"--kubeconfig",
                                              "/kc",
                                              "--prometheus-url=http://p:9090",
                                              "--interval",
                                              "0.5",
                                              "--listen",
                                              "0.0.0.0:0",
                                              "--webhook-token-file",
                                              "/tok",
                                              "--namespace=team-a",
                                              "--metrics-port",
                                              "9500.7",
                                              "--stall-floor",
                                              "7",
                                              "--stopped-seconds",
                                              "0",
                                              "--idle-seconds",
                                              "20",
                                              "--stall-factor",
                                              "3.5",
                                              "--unreachable",
                                              "40",
                                              "--straggler-window",
                                              "50",
                                              "--debounce",
                                              "3",
                                              "--leader-elect",
                                              "--leader-election-namespace",
                                              "mon",
                                              "--leader-election-id=lease-a",
                                              "--lease-duration",
                                              "20",
                                              "--renew-deadline",
                                              "12.5",
                                              "--retry-period=1"});
  CHECK(f.kubeconfig == "/kc");
  CHECK(f.opts.prometheus_url == "http://p:9090");
  CHECK(f.opts.interval_s == 0.5);
  CHECK(f.opts.listen == "0.0.0.0:0");
  CHECK(f.token_file == "/tok");
  CHECK(f.opts.ns == "team-a");
  CHECK(f.opts.metrics_port == 9500);  // truncated
  CHECK(f.opts.defaults.stall_floor_s == 7);
  CHECK(f.opts.defaults.stopped_s == 0);
  CHECK(f.opts.defaults.idle_s == 20);
  CHECK(f.opts.defaults.stall_factor == 3.5);
  CHECK(f.opts.defaults.unreachable_s == 40);
  CHECK(f.opts.defaults.straggler_window_s == 50);
  CHECK(f.opts.defaults.debounce_evals == 3);
  CHECK(f.leader_elect);  // a switch alone means true
  CHECK(f.le_namespace == "mon");
  CHECK(f.le_name == "lease-a");
  CHECK(f.lease_duration == 20);
  CHECK(f.renew_deadline == 12.5);
  CHECK(f.retry_period == 1);
  CHECK(refusal({"--leader-elect", "--lease-duration", "20", "--renew-deadline", "12.5", "--retry-period=1"}).empty());

  CHECK(parse_monitor_flags({"--debounce", "0"}).opts.defaults.debounce_evals == 1);  // at least one evaluation
  CHECK_FALSE(parse_monitor_flags({"--leader-elect=false"}).leader_elect);
  CHECK(parse_monitor_flags({"--help"}).help);
  CHECK(parse_monitor_flags({"-h", "--frobnicate"}).help);  // help wins over what follows it
}

TEST_CASE("monitor flags: bad values are refused naming the flag and the fix") {
  CHECK(refusal({"--frobnicate"}) == "unknown flag '--frobnicate' (see --help)");
  CHECK(refusal({"-x=1"}) == "unknown flag '-x=1' (see --help)");  // only --flag=value splits
  CHECK(refusal({"--namespace"}) == "--namespace needs a value (see --help)");
  CHECK(refusal({"--interval", "-1"}) == "--interval '-1' is not a non-negative number");
  CHECK(refusal({"--debounce=2x"}) == "--debounce '2x' is not a non-negative number");
  CHECK(refusal({"--leader-elect=maybe"}) == "--leader-elect='maybe': use true or false");
  CHECK(refusal({"--leader-elect", "false"}) == "unknown flag 'false' (see --help)");  // a switch takes no next value
}

TEST_CASE("monitor flags: what must agree") {
  CHECK(refusal({"--listen", "9402"}).find("9402") != std::string::npos);
  const std::string timing = "leader election timing: want 0 < --retry-period < --renew-deadline < --lease-duration";
  CHECK(refusal({"--leader-elect", "--renew-deadline", "15"}) == timing);
  CHECK(refusal({"--leader-elect", "--retry-period", "0"}) == timing);
  CHECK(refusal({"--renew-deadline", "15"}).empty());  // the timings are read only with --leader-elect
}
