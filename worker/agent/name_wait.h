// The agent's wait for the cluster DNS (common/stable_names.h): a pod's record appears in the cluster DNS a moment
// after the pod has its IP (the endpoints controller, then the DNS server's watch), and a replaced pod's name may
// still answer with its predecessor's IP for that moment. Before it starts the ranks with DNS names, the agent waits
// until the names the ranks need first answer with the IPs the rendezvous reported.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace railyard::worker {

struct NameWant {
  std::string name;  // a DNS name, e.g. <pod>.<job>.<namespace>.svc.cluster.local
  std::string ip;    // the address it must resolve to ("" = any address)
};

// The IPv4 and IPv6 addresses `name` resolves to through the system resolver (getaddrinfo: the pod's resolv.conf and
// search path, as the ranks will resolve it); empty when it does not resolve.
std::vector<std::string> resolve_addresses(const std::string& name);

// True once every name resolves to (a list that includes) its ip; false after `limit` or as soon as `stopped()`
// returns true. Tries every 250 ms; the result says nothing about which name was missing: unresolved() does.
bool wait_for_names(const std::vector<NameWant>& want, std::chrono::milliseconds limit,
                    const std::function<bool()>& stopped);

// The names of `want` that do not resolve to their ip now, for the log ("name (got 10.0.0.1)" or "name (none)").
std::vector<std::string> unresolved(const std::vector<NameWant>& want);

}  // namespace railyard::worker
