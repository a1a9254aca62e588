// The fault-injection actions behind the control endpoint (see control.h for the protocol): kill/freeze/thaw a
// pod's process, take a node down or up, report status. Runs on the loop thread only (the coordinator queues each
// request there), so it reads and changes the pod records without a lock.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "deploy/local/node_agent/node_lease.h"
#include "deploy/local/node_agent/pod_record.h"
#include "deploy/local/node_agent/supervisor.h"

namespace railyard::node_agent {

// What node-up needs from the pod lifecycle, which the coordinator owns.
struct PodLifecycleHooks {
  std::function<void(PodRec&)> start;  // start a pod that has not run yet
  // A running pod's process ended as `s` (applies the restart policy and reports it).
  std::function<void(PodRec&, const ExitStatus& s, const std::string& reason, const std::string& message)> terminated;
};

class ControlActions {
 public:
  ControlActions(std::map<std::string, PodRec>& pods, NodeLeases& nodes, Supervisor& supervisor,
                 PodLifecycleHooks hooks)
      : pods_(pods), nodes_(nodes), supervisor_(supervisor), hooks_(std::move(hooks)) {}

  // Returns the reply ({"message": ..., ...}); throws ControlError for an unknown action, pod or node.
  nlohmann::json handle(const std::string& action, const nlohmann::json& args);

 private:
  PodRec& find_running_pod(const nlohmann::json& args);
  std::string find_node(const nlohmann::json& args) const;
  nlohmann::json signal_pod(const std::string& action, const nlohmann::json& args);
  nlohmann::json node_down(const nlohmann::json& args);
  nlohmann::json node_up(const nlohmann::json& args);
  nlohmann::json status() const;

  std::map<std::string, PodRec>& pods_;  // by uid
  NodeLeases& nodes_;
  Supervisor& supervisor_;
  PodLifecycleHooks hooks_;
};

}  // namespace railyard::node_agent
