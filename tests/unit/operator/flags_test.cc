// railyard-operator's command line (operator/flags.h): every flag sets its field, and a bad value is refused naming
// the flag and the fix.
#include "operator/flags.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace railyard::op;

namespace {

// The message parse_operator_flags refuses `args` with ("" when it accepts them).
std::string refusal(const std::vector<std::string>& args) {
  try {
    (void)parse_operator_flags(args);
  } catch (const railyard::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("operator flags: the defaults, and every kind of flag sets its field") {
  const OperatorFlags d = parse_operator_flags({});
  CHECK(d.leader_elect);
  CHECK_FALSE(d.metrics_secure);
  CHECK(d.metrics_addr == "127.0.0.1:8080");
  CHECK(d.workers == 2);
  CHECK(d.placement == "rail-aware");
  CHECK(d.network_policy == NetworkPolicyMode::kIngress);
  CHECK(d.rendezvous_tls == RendezvousTlsMode::kAuto);

  const OperatorFlags f = parse_operator_flags({"--namespace",
                                                "team-a",
                                                "--leader-elect=false",
                                                "--metrics-secure",
                                                "--metrics-cert-dir=/certs",
                                                "--lease-duration",
                                                "20",
                                                "--renew-deadline=12.5",
                                                "--workers",
                                                "8",
                                                "--kube-api-qps",
                                                "0",
                                                "--kube-api-burst",
                                                "5",
                                                "--api-parallelism=4",
                                                "--worker-metrics-port",
                                                "0",
                                                "--agent-metrics-port",
                                                "9500",
                                                "--network-policy",
                                                "strict",
                                                "--rendezvous-tls",
                                                "off",
                                                "--rendezvous-tls-names",
                                                "a.example,,10.0.0.1",
                                                "--placement",
                                                "simple",
                                                "--data-root",
                                                "/data",
                                                "--checkpoint-root=/ckpt",
                                                "--cluster-domain",
                                                "corp.local",
                                                "--log-level",
                                                "debug"});
  CHECK(f.ns == "team-a");
  CHECK_FALSE(f.leader_elect);
  CHECK(f.metrics_secure);  // a switch alone means true
  CHECK(f.metrics_cert_dir == "/certs");
  CHECK(f.lease_duration == 20);
  CHECK(f.renew_deadline == 12.5);
  CHECK(f.workers == 8);
  CHECK(f.kube_api_qps == 0);
  CHECK(f.kube_api_burst == 5);
  CHECK(f.api_parallelism == 4);
  CHECK(f.worker_metrics_port == 0);
  CHECK(f.agent_metrics_port == 9500);
  CHECK(f.network_policy == NetworkPolicyMode::kStrict);
  CHECK(f.rendezvous_tls == RendezvousTlsMode::kOff);
  CHECK(f.rendezvous_tls_names == std::vector<std::string>{"a.example", "10.0.0.1"});
  CHECK(f.placement == "simple");
  CHECK(f.data_root == "/data");
  CHECK(f.checkpoint_root == "/ckpt");
  CHECK(f.cluster_domain == "corp.local");
  CHECK(f.log_level == "debug");
  CHECK(parse_operator_flags({"--help"}).help);
}

TEST_CASE("operator flags: bad values are refused naming the flag and the fix") {
  CHECK(refusal({"--api-parallelism", "0"}) == "--api-parallelism '0': use 1 to 1024");
  CHECK(refusal({"--workers", "65"}) == "--workers '65': use 1 to 64");
  CHECK(refusal({"--workers", "3x"}) == "--workers '3x': use 1 to 64");
  CHECK(refusal({"--frobnicate"}) == "unknown flag '--frobnicate'");
  CHECK(refusal({"--namespace"}) == "--namespace needs a value");
  CHECK(refusal({"--leader-elect=maybe"}) == "--leader-elect='maybe': use true or false");
  CHECK(refusal({"--lease-duration", "-1"}) == "--lease-duration '-1': expected a positive number of seconds");
  CHECK(refusal({"--kube-api-qps", "-1"}).find("--kube-api-qps '-1'") == 0);
  CHECK(refusal({"--kube-api-burst", "0"}).find("--kube-api-burst '0'") == 0);
  CHECK(refusal({"--worker-metrics-port", "70000"}).find("--worker-metrics-port '70000'") == 0);
  CHECK(refusal({"--network-policy", "open"}) == "--network-policy 'open': use none, ingress or strict");
  CHECK(refusal({"--rendezvous-tls", "on"}) == "--rendezvous-tls 'on': use auto, files or off");
  CHECK(refusal({"--rendezvous-ca-secret", "ns/"}).find("use NAME or NAMESPACE/NAME") != std::string::npos);
  CHECK(refusal({"--data-root", "data"}) == "--data-root 'data': use an absolute directory");
  CHECK(refusal({"--cluster-domain", "Cluster.Local"}).find("use a lowercase DNS name") != std::string::npos);
  CHECK(refusal({"--placement", "best"}) == "--placement 'best': use rail-aware or simple");
  CHECK(refusal({"--log-level", "loud"}).find("--log-level: ") == 0);
  CHECK(refusal({"--metrics-addr", "8080"}) == "--metrics-addr '8080': expected HOST:PORT");
  CHECK(refusal({"--health-addr", "h:99999"}) == "--health-addr 'h:99999': the port must be a number from 0 to 65535");
}

TEST_CASE("operator flags: pairs that must agree") {
  CHECK(refusal({"--renew-deadline", "15"}) == "--renew-deadline must be shorter than --lease-duration");
  CHECK(refusal({"--rendezvous-tls", "files"}).find("needs --rendezvous-tls-dir") != std::string::npos);
  CHECK(refusal({"--rendezvous-tls-dir", "/tls"}) == "--rendezvous-tls-dir is read only with --rendezvous-tls files");
  CHECK(refusal({"--metrics-cert-dir", "/c"}) == "--metrics-cert-dir is read only with --metrics-secure");
  CHECK(refusal({"--rendezvous-tls", "files", "--rendezvous-tls-dir", "/tls"}).empty());
  CHECK(split_addr("--x", "[::1]:80") == std::pair<std::string, int>{"[::1]", 80});
}

TEST_CASE("--rendezvous-max-threads: 2048 by default, 64..65536, anything else refused naming the flag") {
  CHECK(parse_operator_flags({}).rendezvous_max_threads == 2048);
  CHECK(parse_operator_flags({"--rendezvous-max-threads", "12000"}).rendezvous_max_threads == 12000);
  CHECK(parse_operator_flags({"--rendezvous-max-threads=64"}).rendezvous_max_threads == 64);
  CHECK(refusal({"--rendezvous-max-threads", "63"}).find("--rendezvous-max-threads") != std::string::npos);
  CHECK(refusal({"--rendezvous-max-threads", "70000"}).find("--rendezvous-max-threads") != std::string::npos);
  CHECK(refusal({"--rendezvous-max-threads", "many"}).find("--rendezvous-max-threads") != std::string::npos);
}

TEST_CASE("--agent-silence-seconds: 4 by default, 0 turns it off, a fraction of a second is refused naming the flag") {
  CHECK(parse_operator_flags({}).agent_silence == 4);
  CHECK(parse_operator_flags({"--agent-silence-seconds", "0"}).agent_silence == 0);
  CHECK(parse_operator_flags({"--agent-silence-seconds=2.5"}).agent_silence == 2.5);
  CHECK(refusal({"--agent-silence-seconds", "0.2"}).find("--agent-silence-seconds '0.2': at least 1 s") !=
        std::string::npos);
  CHECK(refusal({"--agent-silence-seconds", "-1"}).find("--agent-silence-seconds") != std::string::npos);
  CHECK(refusal({"--agent-silence-seconds", "soon"}).find("--agent-silence-seconds") != std::string::npos);
}
