// The per-job NetworkPolicy (pure: no API calls): who may reach a job's worker pods, and in strict mode where they
// may connect to. docs/hardening.md "Network policy".
#pragma once

#include <optional>
#include <string>

#include "operator/controller/pod_builder.h"

namespace railyard::op {

enum class NetworkPolicyMode {
  kNone,     // no policy: the namespace's own policies (if any) apply
  kIngress,  // worker pods accept connections only from their job's pods, and on the metrics ports from anyone
  kStrict,   // kIngress, and they connect only to their job's pods, the rendezvous port and DNS
};

// "none" | "ingress" | "strict"; nullopt for anything else.
std::optional<NetworkPolicyMode> network_policy_mode_from_string(const std::string& s);
const char* to_string(NetworkPolicyMode m);

std::string network_policy_name(const std::string& job_name);

// The job's NetworkPolicy, owned by the job (garbage-collected with it). Its pod selector is the job's label, so
// it covers every generation's pods. Ports come from `opts`: the metrics ports (worker port + local ranks, agent
// port) and, in strict mode, the rendezvous port of opts.rendezvous_addr. Not to be called with kNone.
Json build_network_policy(const Json& job, const JobSpec& spec, NetworkPolicyMode mode, const PodOptions& opts);

}  // namespace railyard::op
