// railyard-node-agent's main object: registers the simulated nodes, keeps their leases and Ready condition fresh,
// runs the pods bound to them as local processes and reports their status, and serves fault-injection commands.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/kube/client.h"
#include "deploy/local/node_agent/topology.h"

namespace railyard::node_agent {

struct AgentOptions {
  std::string state_dir;
  Topology topology;
  std::chrono::milliseconds lease_interval{1000};
  int lease_duration_seconds = 40;
  std::chrono::seconds node_status_interval{10};  // Ready=True re-asserted this often for up nodes
  int heartbeat_workers = 8;                      // concurrent lease renewals (and node registrations)
  std::chrono::seconds shutdown_grace{5};         // SIGTERM -> SIGKILL for pods when the agent stops
};

class Agent {
 public:
  Agent(AgentOptions opts, kube::Client& client);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Registers nodes, starts heartbeats, the pod watch and the control endpoint, then blocks until `stop` is set.
  // Throws Error if the nodes cannot be registered (bad credentials, RBAC) so the caller can exit non-zero.
  void run(const std::atomic<bool>& stop);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace railyard::node_agent
