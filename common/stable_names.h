// Stable names of a job's pods (docs/programs.md "Stable names"): every TrainingJob has a headless Service named after
// it, and each worker pod has `hostname: <pod>` and `subdomain: <service>`, so that
// `<pod>.<service>.<namespace>.svc.<cluster domain>` resolves in the cluster's DNS. The contract between the operator
// (which sets kPodDomainEnv in a program job's env) and the agent (which reads it, gives the ranks MASTER_ADDR as a
// name and writes the hostfile kHostfileEnv names): both sides include this header, and neither depends on the other.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace railyard::names {

// "<service>.<namespace>.svc.<cluster domain>": set (job-wide, the job's ConfigMap) when a program job names its pods
// by DNS (spec.program.addresses DNS, the default); absent or empty, the agent uses pod IPs.
inline constexpr const char* kPodDomainEnv = "RAILYARD_POD_DOMAIN";
// What each rank gets: the path of a file with one line per pod of the current world, `<host> slots=<procs per pod>`,
// in rank order (DeepSpeed's and Open MPI's hostfile syntax); the host is the pod's DNS name or its IP, as MASTER_ADDR.
inline constexpr const char* kHostfileEnv = "RAILYARD_HOSTFILE";
// How long the agent waits for its own name and the master's to resolve to their current IPs before it starts the
// ranks with names (seconds; default kDefaultDnsWaitSeconds). When they do not, that generation uses pod IPs.
inline constexpr const char* kDnsWaitEnv = "RAILYARD_AGENT_DNS_WAIT_SECONDS";
inline constexpr int kDefaultDnsWaitSeconds = 60;
// The operator's --cluster-domain default, as the kubelet's clusterDomain is almost everywhere.
inline constexpr const char* kDefaultClusterDomain = "cluster.local";

inline constexpr size_t kMaxLabelLength = 63;  // a DNS label, a pod's hostname, a Service's name
inline constexpr size_t kMaxNameLength = 253;  // a whole DNS name (without the final dot)

namespace detail {
inline bool lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
}  // namespace detail

// RFC 1123 label as Kubernetes checks it (a pod's hostname and subdomain): [a-z0-9]([-a-z0-9]*[a-z0-9])?, 1-63.
inline bool is_dns1123_label(std::string_view s) {
  if (s.empty() || s.size() > kMaxLabelLength) return false;
  if (!detail::lower_alnum(s.front()) || !detail::lower_alnum(s.back())) return false;
  for (char c : s)
    if (!detail::lower_alnum(c) && c != '-') return false;
  return true;
}

// RFC 1035 label (a Service's name): a 1123 label that starts with a letter.
inline bool is_dns1035_label(std::string_view s) { return is_dns1123_label(s) && s.front() >= 'a' && s.front() <= 'z'; }

// Lowercase DNS name: 1123 labels joined by '.', at most 253 characters (a cluster domain, a pod domain).
inline bool is_dns_subdomain(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    if (!is_dns1123_label(s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start)))
      return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

// "<service>.<namespace>.svc.<cluster domain>".
inline std::string pod_domain(const std::string& service, const std::string& ns, const std::string& cluster_domain) {
  return service + "." + ns + ".svc." + cluster_domain;
}

// "<pod>.<pod domain>": the name a pod with hostname <pod> and subdomain <service> has in the cluster DNS.
inline std::string pod_fqdn(const std::string& pod, const std::string& domain) { return pod + "." + domain; }

// The hostfile's text: "<host> slots=<slots>\n" per host, in the given (rank) order.
inline std::string hostfile_text(const std::vector<std::string>& hosts, int slots) {
  std::string out;
  for (const std::string& h : hosts) out += h + " slots=" + std::to_string(slots) + "\n";
  return out;
}

}  // namespace railyard::names
