// How railyard-node-agent runs (its flags, main.cc): the nodes it simulates and its timings. Apart from the agent
// (node_agent.h) so that its parts (the leases, node_lease.h) read them without including the agent.
#pragma once

#include <chrono>
#include <string>

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
  // false (--no-pods): nodes only (registration, leases, Ready); pods bound to them get no process, status or event.
  // For benchmarks of what creates and binds pods at thousands of nodes, where one agent on a small machine would
  // otherwise fall minutes behind the pods' starts and removals (docs/node-agent.md).
  bool run_pods = true;
};

}  // namespace railyard::node_agent
