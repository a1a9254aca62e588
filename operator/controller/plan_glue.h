// `spec.parallelism.auto: true`: the operator asks the planner (planner) for the layout of a job on the
// nodes it can use, restricted to what the worker implements, and writes the choice and its prediction to status.
// Pure: no Kubernetes calls, so the glue is unit-tested without a server.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "operator/api.h"
#include "operator/scheduler/placement.h"
#include "planner/cost_model.h"
#include "planner/moe_cost.h"

namespace railyard::op {

// The planner's view of a job: the spec's model shape with the training sequence length, and the global batch.
plan::Job plan_job(const JobSpec& spec);

// The planner's view of the nodes: the device profile from the GPU-type label (railyard.dev/gpu-type) of the ready,
// schedulable GPU nodes, or the CPU profile for spec.device cpu (and auto on a cluster without GPUs); one "node" per
// replica with procsPerReplica devices; the unit/leaf/spine structure from the same labels the scheduler reads.
// Throws ConfigError naming the label and the fix when no profile matches.
plan::Cluster plan_cluster(const JobSpec& spec, int replicas, const std::vector<NodeInfo>& nodes);

// Mixed GPU types (Whale): micro-batches per data-parallel rank in proportion to the speed of each rank's GPU type
// (plan::estimate_mixed_dp, balanced), for a world whose pods sit on nodes of at least two GPU types.
struct MixedSplit {
  std::vector<int> dp_split;  // micro-batches per rank, rank order (the worker's --dp-split); empty: the even split
  std::string why_even;       // why there is no split (dp_split empty)
  double even_step = 0;       // predicted step of the even split (0: the batch does not split evenly)
  double balanced_step = 0;
  Json status;  // status.plan.mixed
};

// Mixture of experts under auto: the expert-parallel degree and the dispatch all-to-all the MoE cost model
// (planner/moe_cost.h) picks for a planned layout.
// The expert-parallel choice of parallelism.auto (planner/moe_cost.h search_experts).
using ExpertPlan = plan::ExpertPlan;

struct AutoPlan {
  // What the worker runs: dp, tp, pp, micro_batch, zero (0-2), recompute (none, selective, full over all layers) and
  // optimizer offload; never interleave or ZeRO-3; sequence parallelism only when the spec asks for it.
  plan::Layout layout;
  std::optional<ExpertPlan> experts;  // MoE models only
  // Context parallelism, searched only when no layout fits without it (dense models): each sequence split over
  // `context` ranks; the layout's dp counts replicas (world = dp x context x tp x pp).
  int context = 1;
  double ring_seconds = 0;  // per step: the ring exchange the attention does not hide (cp_ring_time)
  plan::Estimate estimate;
  std::string device;   // profile name
  std::string message;  // the event text: the choice, the prediction and why the runner-up lost
  Json status;          // status.plan
  // Nodes of two or more GPU types: the split expected for the pods' share of each type (the controller recomputes it
  // from the nodes the pods are bound to).
  std::optional<MixedSplit> mixed;
};

struct AutoPlanOutcome {
  std::optional<AutoPlan> plan;
  std::optional<Violation> violation;  // InvalidParallelismAuto with the planner's message
};

// Runs the search for `replicas` pods. Degrees the spec pins (tensor or pipeline other than 1, an explicit data) are
// kept; zero (0-2) and the micro-batch are chosen.
AutoPlanOutcome plan_parallelism(const JobSpec& spec, int replicas, const std::vector<NodeInfo>& nodes);

// The planner's view of the job as world `w` of `replicas` pods runs it, for the rail-aware scheduler to score
// candidate placements by predicted step time (operator/scheduler). Null when the model cannot describe the job: no
// device profile for the nodes, or a layout the planner rejects (e.g. a tensor group spanning pods).
std::shared_ptr<const PlacementStepModel> placement_step_model(const JobSpec& spec, const WorldLayout& w, int replicas,
                                                               const std::vector<NodeInfo>& nodes);

// `pod_types[i]`: the railyard.dev/gpu-type label of the node of the world's pod i. nullopt when the job is on CPUs
// or on fewer than two GPU types.
std::optional<MixedSplit> mixed_split(const JobSpec& spec, const std::vector<std::string>& pod_types);

// Writes the chosen degrees (and recompute/offload) into the spec, so that world_layout() and resolved_config()
// describe the planned world.
void apply_plan(JobSpec& spec, const plan::Layout& layout);
// apply_plan plus the planned expert degree and all-to-all of a MoE model.
void apply_plan(JobSpec& spec, const AutoPlan& plan);

// The expert degree for a MoE job on the planned layout `e`: the pinned spec.parallelism.expert, else the smallest
// divisor of gcd(experts, dp) whose memory fits (fewer ranks per all-to-all, none at 1); the all-to-all pinned by
// spec.parallelism.expertAllToAll, else the cheaper of flat and hierarchical on the topology. A violation when no
// degree fits.
struct ExpertChoice {
  std::optional<ExpertPlan> plan;
  std::optional<std::string> why_not;
};
// The job's expert-parallel degree and all-to-all on the planned layout `e` (plan::search_experts, with the
// worker's limits: hierarchical only off CUDA and when the pod's ranks tile the group); why_not names the field
// and the fix when none fits.
ExpertChoice choose_experts(const JobSpec& spec, const plan::Job& job, const plan::Cluster& cluster,
                            const plan::Estimate& e);

}  // namespace railyard::op
