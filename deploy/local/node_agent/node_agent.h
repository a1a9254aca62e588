// railyard-node-agent's main object: registers the simulated nodes, keeps their leases and Ready condition fresh,
// runs the pods bound to them as local processes and reports their status, and serves fault-injection commands.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/kube/client.h"
#include "deploy/local/node_agent/agent_options.h"
#include "deploy/local/node_agent/topology.h"

namespace railyard::node_agent {

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
