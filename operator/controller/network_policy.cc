#include "operator/controller/network_policy.h"

#include <algorithm>

#include "common/wellknown.h"

namespace railyard::op {

std::optional<NetworkPolicyMode> network_policy_mode_from_string(const std::string& s) {
  if (s == "none") return NetworkPolicyMode::kNone;
  if (s == "ingress") return NetworkPolicyMode::kIngress;
  if (s == "strict") return NetworkPolicyMode::kStrict;
  return std::nullopt;
}

const char* to_string(NetworkPolicyMode m) {
  switch (m) {
    case NetworkPolicyMode::kNone:
      return "none";
    case NetworkPolicyMode::kIngress:
      return "ingress";
    case NetworkPolicyMode::kStrict:
      return "strict";
  }
  return "?";
}

std::string network_policy_name(const std::string& job_name) { return job_name + "-workers"; }

Json build_network_policy(const Json& job, const JobSpec& spec, NetworkPolicyMode mode, const PodOptions& opts) {
  const std::string job_name = job["metadata"].value("name", "");
  const Json job_pods = {{"podSelector", {{"matchLabels", {{wellknown::kJobLabel, job_name}}}}}};
  auto tcp = [](int port) { return Json{{"protocol", "TCP"}, {"port", port}}; };
  // Anyone may scrape the metrics (Prometheus and railyard-monitor live wherever the platform put them): the worker
  // ports (one per local rank) and the agent's. Everything else (Gloo/NCCL pairs, the bootstrap store, peer copies of
  // the in-memory checkpoint tier) only from the job's own pods.
  Json metrics = Json::array();
  if (opts.worker_metrics_port > 0)
    for (int l = 0; l < std::max(1, spec.procs_per_replica); ++l) metrics.push_back(tcp(opts.worker_metrics_port + l));
  if (opts.agent_metrics_port > 0) metrics.push_back(tcp(opts.agent_metrics_port));
  Json ingress = Json::array({{{"from", Json::array({job_pods})}}});
  if (!metrics.empty()) ingress.push_back({{"ports", metrics}});
  Json spec_json = {{"podSelector", {{"matchLabels", {{wellknown::kJobLabel, job_name}}}}}, {"ingress", ingress}};
  Json types = Json::array({"Ingress"});
  if (mode == NetworkPolicyMode::kStrict) {
    // Out: the job's pods, the rendezvous (by port: the operator's pods and namespace carry labels this builder
    // cannot know; through a Service the port is the target port, the same in the chart) and DNS, nothing else.
    Json egress = Json::array({{{"to", Json::array({job_pods})}}});
    const auto colon = opts.rendezvous_addr.rfind(':');
    if (colon != std::string::npos)
      egress.push_back({{"ports", Json::array({tcp(std::stoi(opts.rendezvous_addr.substr(colon + 1)))})}});
    egress.push_back({{"ports", Json::array({{{"protocol", "UDP"}, {"port", 53}}, tcp(53)})}});
    spec_json["egress"] = egress;
    types.push_back("Egress");
  }
  spec_json["policyTypes"] = types;
  return {{"apiVersion", "networking.k8s.io/v1"},
          {"kind", "NetworkPolicy"},
          {"metadata",
           {{"name", network_policy_name(job_name)},
            {"namespace", job["metadata"].value("namespace", "")},
            {"labels", {{wellknown::kJobLabel, job_name}}},
            {"annotations", {{"railyard.dev/network-policy", to_string(mode)}}},
            {"ownerReferences", Json::array({owner_reference(job)})}}},
          {"spec", spec_json}};
}

}  // namespace railyard::op
