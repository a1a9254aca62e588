// Rail-aware gang placement: all pods of a gang or none, inside the smallest switch domain that holds the gang, in
// the order that keeps pipeline neighbours and data-parallel rings closest. See docs/scheduler.md.
#pragma once

#include <vector>

#include "operator/scheduler/placement.h"
#include "operator/scheduler/topology.h"

namespace railyard::op::sched {

// Pods of the gang that talk to each other and how much (relative volume per step).
struct CommEdge {
  int a = 0, b = 0;  // replica indices, a < b
  double weight = 0;
};

// The pod-level communication graph of a gang of `pods` replicas with `procs_per_pod` ranks each, laid out as
// tensor (fastest-varying) x data x pipeline: data-parallel rings, pipeline neighbours, and tensor rings when a
// tensor group spans pods. Edges inside one pod (NVLink) are left out. A layout that does not divide the world is
// treated as pure data parallelism.
std::vector<CommEdge> gang_edges(int pods, int procs_per_pod, int tensor, int pipeline);

struct GangCost {
  double cost = 0;       // sum of weight x same-rail hops
  int worst_hops = 0;    // over the edges
  double mean_hops = 0;  // over the edges (0 for a single pod)
};

// `node_of_pod[replica]` is a topology index, or -1 for a replica that is not placed (its edges are skipped).
GangCost gang_cost(const Topology& topo, const std::vector<int>& node_of_pod, const std::vector<CommEdge>& edges);

// The worst tier of the placed gang's groups in the planner's terms (planner PlacedTiers: 0 same pod/node,
// 1 unit, 2 leaf, 3 spine or wider): over the data-parallel groups (the narrowest domain holding all members) and
// over adjacent pipeline stages. Ranks are tensor-fastest, then data, then pipeline; pod r holds ranks r*P..r*P+P-1.
// Unplaced pods (-1) are skipped.
plan::PlacedTiers placed_tiers(const Topology& topo, const std::vector<int>& node_of_pod, int procs_per_pod, int tensor,
                               int pipeline);

// The cost model's step time (seconds) for the gang placed as `node_of_pod`, or a negative value when the model does
// not apply (a tensor group spanning pods, a layout the planner rejects).
double predicted_step(const PlacementStepModel& model, const Topology& topo, const std::vector<int>& node_of_pod,
                      int procs_per_pod);

class RailAwarePlacement : public Placement {
 public:
  PlacementResult place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) override;
};

}  // namespace railyard::op::sched
