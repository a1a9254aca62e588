// Gang placement behind an interface, so the rail-aware scheduler can replace the simple first-fit one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/restart_request.h"
#include "operator/api.h"
#include "planner/cost_model.h"

namespace railyard::op {

inline constexpr const char* kGpuResource = "nvidia.com/gpu";

// A Kubernetes quantity ("250m", "2", "1.5", "512Mi", "1G", "1e9") in thousandths of its unit, rounded up as the
// API server does; nullopt when it is not a quantity.
std::optional<int64_t> parse_quantity_milli(const std::string& q);

// What a pod asks of a node, as kube-scheduler's NodeResourcesFit counts it: the containers' requests summed (a limit
// stands in for a missing request), or the largest init container's if that is larger, per resource, plus the pod's
// spec.overhead (RuntimeClass). Every resource counts: cpu and memory here, GPUs (kGpuResource) by the placements
// themselves, and every other one (ephemeral-storage, hugepages-*, rdma/*, any extended resource) in `scalar`.
struct PodRequests {
  int64_t cpu_milli = 0, memory = 0;
  std::map<std::string, int64_t> scalar{};  // resource name -> request in thousandths of its unit (> 0 only)
};
PodRequests pod_requests(const Json& pod);

// What placement needs to know about one node, built from the Node and the pods bound to it.
struct NodeInfo {
  std::string name;
  bool ready = false;
  bool unschedulable = false;
  std::map<std::string, std::string> labels;
  Json taints = Json::array();
  int64_t gpu_allocatable = 0;
  int64_t gpu_used = 0;  // requested by non-terminated pods bound here
  // NodeResourcesFit, as kube-scheduler counts it: allocatable (status.allocatable, else capacity; a resource the node
  // does not list is 0, except pods: no limit) against the requests of every non-terminated pod bound here, Railyard's
  // or not. CPU in millicores, memory in bytes.
  int64_t cpu_allocatable_milli = 0, memory_allocatable = 0, pods_allocatable = -1;
  int64_t cpu_used_milli = 0, memory_used = 0, pods_used = 0;
  // Every other resource the node lists (ephemeral-storage, hugepages-*, extended resources such as rdma/hca), in
  // thousandths of its unit, and the requests of the pods bound here; a resource it does not list has none.
  std::map<std::string, int64_t> scalar_allocatable, scalar_used;
  int worker_pods = 0;         // Railyard worker pods (any job) bound here
  std::set<std::string> jobs;  // "ns/name" of jobs with a pod here
  // Node annotations for the NCCL settings of GPU pods (operator/scheduler/nccl_env.h), raw.
  std::string rail_hcas;      // railyard.dev/rail-hcas
  std::string socket_ifname;  // railyard.dev/nccl-socket-ifname
};

using railyard::kExcludeNodesAnnotation;  // common/restart_request.h: written by the monitor and the operator

// The job as the planner sees it (planner): the rail-aware scheduler scores candidate placements by the
// step time the cost model predicts for the hop structure of each placement's groups. `cluster.topology` carries the
// bandwidth factors; its node counts are ignored (the placement gives the tiers).
struct PlacementStepModel {
  plan::Job job;
  plan::Cluster cluster;
  plan::Layout layout;
};

struct PlacementRequest {
  std::string job_key;
  int pods = 0;              // pods to place now (the unbound part of the gang)
  int64_t gpus_per_pod = 0;  // 0: CPU pods, one Railyard worker pod per node
  std::map<std::string, std::string> node_selector;
  Json tolerations = Json::array();
  // The pod template's spec.affinity.nodeAffinity (null: none). Its required terms filter nodes.
  Json node_affinity{};
  // Never used: the job's railyard.dev/exclude-nodes (failurePolicy.excludeFailedNodes).
  std::set<std::string> excluded_nodes{};
  // Used only when nothing else fits: nodes that lost one of the job's pods (excludeFailedNodes), so that an elastic
  // job can still grow back onto a node that returned.
  std::set<std::string> avoided_nodes{};
  // The gang as a whole, for the rail-aware cost: replica index of each pod to place (empty: 0..pods-1), the nodes of
  // the replicas already bound, and the world layout (tensor fastest-varying, then data, then pipeline).
  std::vector<int> pod_indices{};
  std::map<int, std::string> bound{};
  int procs_per_pod = 1, tensor = 1, pipeline = 1;
  // Null: candidates are scored by hop counts alone (weights tensor 4, data 1, pipeline 1).
  std::shared_ptr<const PlacementStepModel> step_model{};
  // spec.placement: railAware=false places first-fit; hard keeps the gang inside one domain of the widest topology
  // key; topology_keys (narrowest first) replace railyard.dev/unit, leaf, spine.
  bool rail_aware = true;
  bool hard = false;
  std::vector<std::string> topology_keys{};
  PodRequests requests{};  // CPU and memory of each pod (pod_requests of the worker pod), against NodeResourcesFit
  // Gangs that go before this one (gang_order.h: PriorityClass, then creation order) and wait for nodes. A
  // ReservingPlacement books each of them that fits on what is left, in this order, before it places this gang: a
  // gang of higher priority gets the nodes first whichever job is reconciled first. One that does not fit at all
  // holds nothing (kube-scheduler's queue does the same for pods: a big pending pod does not block smaller ones).
  std::vector<PlacementRequest> ahead{};
};

struct PlacementResult {
  bool ok = false;
  std::vector<std::string> nodes;  // one per requested pod, in order, when ok
  int missing = 0;                 // pods that did not fit, when !ok
  std::string message;             // why (for the Scheduled condition), or on success how (for the event)
  int worst_hops = -1;             // switch hops of the gang's costliest communication edge (-1: not computed)
  double mean_hops = 0;
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

// Wraps a placement so that pods it placed count against their nodes until the informer cache shows them bound
// there, `hold` passes, or the same pod (job and replica index) is placed again (it was replaced): two jobs
// reconciled at the same moment never book the same GPUs twice although neither sees the other's bindings in the
// cache yet. Thread-safe: placements through one wrapper are serialized.
class ReservingPlacement : public Placement {
 public:
  explicit ReservingPlacement(std::unique_ptr<Placement> inner,
                              std::chrono::milliseconds hold = std::chrono::seconds(5));
  PlacementResult place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) override;

 private:
  // Books the gangs of req.ahead that fit onto `view` (placed by inner_, no reservation kept); their keys, in order.
  std::vector<std::string> book_ahead(const PlacementRequest& req, std::vector<NodeInfo>& view);
  struct Reservation {
    std::string job_key, node;
    int index;
    int64_t gpus;
    PodRequests requests;
    std::chrono::steady_clock::time_point until;
  };
  std::unique_ptr<Placement> inner_;
  std::chrono::milliseconds hold_;
  std::mutex mu_;
  std::vector<Reservation> reserved_;
};

// Fills the request's placement options from a TrainingJob: spec.placement (railAware, mode, topologyKeys), the
// template's node affinity, and with failurePolicy.excludeFailedNodes (default true) the exclude-nodes annotation and
// the node of a NodeLost restart (status.lastRestart).
void apply_job_options(const Json& job, PlacementRequest& req);

// True when the node passes the required terms of `node_affinity` (spec.affinity.nodeAffinity): any term matches,
// every expression of a term holds (In, NotIn, Exists, DoesNotExist, Gt, Lt; matchFields on metadata.name).
bool matches_node_affinity(const Json& node_affinity, const NodeInfo& node);

// The sum of the weights of the preferred terms of `node_affinity` (preferredDuringSchedulingIgnoredDuringExecution)
// that the node matches: the rail-aware placement's tie-break after the communication cost.
int64_t preferred_affinity_score(const Json& node_affinity, const NodeInfo& node);

// railyard_operator_placement_hops: the worst same-rail switch hops of each gang placed (registered once; the
// operator's main registers it at start so it is exported before the first placement).
metrics::Family<metrics::Histogram>& placement_hops(metrics::Registry& registry);

// Counts one more pod of `job_key` (`gpus` GPUs, `requests`) against the node, as a bound pod would.
void add_pod(NodeInfo& node, const std::string& job_key, int64_t gpus, const PodRequests& requests);

// "" when the node has room for one more pod with `requests` (pod count, CPU, memory, every other resource), else the
// first resource short ("pods", "cpu", "memory", or its name, e.g. "rdma/hca"), as kube-scheduler's NodeResourcesFit
// decides. GPUs are checked by the placements.
std::string resource_shortfall(const NodeInfo& node, const PodRequests& requests);

// The inventory from Node objects and the pods bound to them, Railyard's and every other (pods of unknown nodes,
// unbound and terminated pods are ignored). build_inventory_of reads the objects in place (the informers' own).
std::vector<NodeInfo> build_inventory(const std::vector<Json>& nodes, const std::vector<Json>& pods);
std::vector<NodeInfo> build_inventory_of(const std::vector<const Json*>& nodes, const std::vector<const Json*>& pods);

bool node_ready(const Json& node);
// A pod's request of an extended resource (limits win, as for extended resources they must be equal).
int64_t pod_resource(const Json& pod, const std::string& resource);
// True when `tolerations` tolerate a NoSchedule/NoExecute taint.
bool tolerates(const Json& tolerations, const Json& taint);

}  // namespace railyard::op
