// railyard-operator's command line: one typed struct with its defaults, the usage text, and a parser that either
// fills the struct or names the flag and the fix (exit 2). Pure, so every flag is unit-tested
// (tests/unit/operator/flags_test.cc) without starting an operator.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/stable_names.h"
#include "operator/controller/controller.h"
#include "operator/controller/network_policy.h"
#include "operator/controller/serving_tls.h"

namespace railyard::op {

struct OperatorFlags {
  bool help = false;  // -h/--help: print kOperatorUsage and exit 0
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
  double agent_silence = 4;  // --agent-silence-seconds (0 = off)
  int rendezvous_max_threads = RendezvousOptions{}.max_threads;  // --rendezvous-max-threads
  int workers = 2;
  double kube_api_qps = 50;
  int kube_api_burst = 1000;
  int api_parallelism = ControllerOptions{}.api_parallelism;
  std::string placement = "rail-aware";
  int worker_metrics_port = 9400, agent_metrics_port = 9399;
  std::string data_root, checkpoint_root;
  NetworkPolicyMode network_policy = NetworkPolicyMode::kIngress;
  std::string cluster_domain = names::kDefaultClusterDomain;
  RendezvousTlsMode rendezvous_tls = RendezvousTlsMode::kAuto;
  std::string rendezvous_ca_secret = "railyard-rendezvous-ca";  // [NS/]NAME
  std::string rendezvous_tls_dir;
  std::vector<std::string> rendezvous_tls_names;
  std::string leader_endpoints;  // Endpoints the leader writes with its own address (--leader-endpoints)
  bool metrics_secure = false;   // /metrics over HTTPS, readers reviewed by the API server (--metrics-secure)
  std::string metrics_cert_dir;  // tls.crt + tls.key to serve instead of a self-signed certificate
  std::string log_level;         // "" = RAILYARD_LOG_LEVEL or info
};

extern const char* const kOperatorUsage;

// args: argv[1..]. Throws ConfigError naming the flag and the fix; never exits.
OperatorFlags parse_operator_flags(const std::vector<std::string>& args);

// "HOST:PORT" -> (HOST, PORT); ConfigError naming `flag` otherwise.
std::pair<std::string, int> split_addr(const std::string& flag, const std::string& addr);

}  // namespace railyard::op
