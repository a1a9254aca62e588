// The agent's simulated nodes as the API server sees them: registration, lease renewals and the Ready condition
// (on a heartbeat thread of their own, so a slow pod-status call never delays a lease), and the down/up state
// that fault injection sets.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/kube/client.h"
#include "deploy/local/node_agent/agent_options.h"
#include "deploy/local/node_agent/topology.h"

namespace railyard::node_agent {

class NodeLeases {
 public:
  NodeLeases(const AgentOptions& opts, kube::Client& client);
  ~NodeLeases();  // stop() and join()
  NodeLeases(const NodeLeases&) = delete;
  NodeLeases& operator=(const NodeLeases&) = delete;

  const std::vector<SimNode>& nodes() const { return nodes_; }
  const std::set<std::string>& names() const { return names_; }
  bool has(const std::string& node) const { return names_.count(node) > 0; }

  // Creates (or brings in line with the topology) every Node and its lease, several at a time. Throws the first
  // failure (bad credentials, RBAC) so the agent can exit non-zero.
  void register_all();

  // Starts the heartbeat thread: each up node's lease every lease_interval, its Ready=True every
  // node_status_interval (and at once after node-up). stop() wakes it and makes it return; join() waits for it.
  void start_heartbeats();
  void stop();
  void join();

  bool is_down(const std::string& node) const;
  // Fault injection. mark_down: heartbeats stop for the node; false if it was down already. mark_up: false if it
  // was up already; otherwise the lease and Ready=True are sent now (or by the heartbeat thread if that fails).
  bool mark_down(const std::string& node);
  bool mark_up(const std::string& node);

 private:
  void parallel_for(size_t count, const std::function<void(size_t)>& fn);
  void register_node(const SimNode& n);
  void renew_lease(const std::string& node);
  void patch_ready(const std::string& node, bool transition);
  void heartbeat_loop();
  void heartbeat(const std::string& node, bool status_due, bool transition);

  const AgentOptions& opts_;
  kube::Client& client_;
  std::vector<SimNode> nodes_;
  std::set<std::string> names_;

  // Lease renewals run on several heartbeat workers and (node-up) the loop thread; the lock covers the maps below,
  // never an API call, so renewals of different nodes overlap.
  std::mutex lease_mu_;
  std::map<std::string, std::string> node_uids_;  // guarded by lease_mu_
  std::map<std::string, bool> lease_ok_;          // last renewal result per node (for log-on-change); lease_mu_

  mutable std::mutex nodes_mu_;
  std::set<std::string> down_;        // guarded by nodes_mu_
  std::set<std::string> ready_asap_;  // nodes whose Ready=True must be patched now; guarded by nodes_mu_

  std::atomic<bool> stopping_{false};
  std::mutex sleep_mu_;  // interruptible sleeps of the heartbeat thread
  std::condition_variable sleep_cv_;
  std::thread heartbeat_;
};

}  // namespace railyard::node_agent
