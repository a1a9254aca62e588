// Gang placement behind an interface, so the rail-aware scheduler can replace the simple first-fit one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "operator/controller/job_spec.h"

namespace railyard::op {

inline constexpr const char* kGpuResource = "nvidia.com/gpu";

// What placement needs to know about one node, built from the Node and the pods bound to it.
struct NodeInfo {
  std::string name;
  bool ready = false;
  bool unschedulable = false;
  std::map<std::string, std::string> labels;
  Json taints = Json::array();
  int64_t gpu_allocatable = 0;
  int64_t gpu_used = 0;        // requested by non-terminated pods bound here
  int worker_pods = 0;         // Railyard worker pods (any job) bound here
  std::set<std::string> jobs;  // "ns/name" of jobs with a pod here
};

struct PlacementRequest {
  std::string job_key;
  int pods = 0;              // pods to place now (the unbound part of the gang)
  int64_t gpus_per_pod = 0;  // 0: CPU pods, one Railyard worker pod per node
  std::map<std::string, std::string> node_selector;
  Json tolerations = Json::array();
};

struct PlacementResult {
  bool ok = false;
  std::vector<std::string> nodes;  // one per requested pod, in order, when ok
  int missing = 0;                 // pods that did not fit, when !ok
  std::string message;             // why, for the Scheduled condition
};

class Placement {
 public:
  virtual ~Placement() = default;
  // All of the request or nothing: either every pod gets a node, or ok is false and nodes is empty.
  virtual PlacementResult place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) = 0;
};

// First fit over nodes in name order: Ready, schedulable, matching the selector, taints tolerated, enough free GPUs,
// and at most one pod of the job per node.
class SimplePlacement : public Placement {
 public:
  PlacementResult place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) override;
};

// The inventory from Node objects and pods (pods of other nodes or unbound pods are ignored).
std::vector<NodeInfo> build_inventory(const std::vector<Json>& nodes, const std::vector<Json>& pods);

bool node_ready(const Json& node);
// A pod's request of an extended resource (limits win, as for extended resources they must be equal).
int64_t pod_resource(const Json& pod, const std::string& resource);
// True when `tolerations` tolerate a NoSchedule/NoExecute taint.
bool tolerates(const Json& tolerations, const Json& taint);

}  // namespace railyard::op
