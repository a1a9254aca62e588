// `spec.parallelism.auto: true`: the operator asks the planner (operator/planner) for the layout of a job on the
// nodes it can use, restricted to what the worker implements, and writes the choice and its prediction to status.
// Pure: no Kubernetes calls, so the glue is unit-tested without a server.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "operator/controller/job_spec.h"
#include "operator/controller/placement.h"
#include "operator/planner/cost_model.h"

namespace railyard::op {

// The planner's view of a job: the spec's model shape with the training sequence length, and the global batch.
plan::Job plan_job(const JobSpec& spec);

// The planner's view of the nodes: the device profile from the GPU-type label (railyard.dev/gpu-type) of the ready,
// schedulable GPU nodes, or the CPU profile for spec.device cpu (and auto on a cluster without GPUs); one "node" per
// replica with procsPerReplica devices; the unit/leaf/spine structure from the same labels the scheduler reads.
// Throws ConfigError naming the label and the fix when no profile matches.
plan::Cluster plan_cluster(const JobSpec& spec, int replicas, const std::vector<NodeInfo>& nodes);

struct AutoPlan {
  plan::Layout layout;  // what the worker runs (dp, tp, pp, micro_batch, zero; never SP/interleave/ZeRO-3)
  plan::Estimate estimate;
  std::string device;   // profile name
  std::string message;  // the event text: the choice, the prediction and why the runner-up lost
  Json status;          // status.plan
};

struct AutoPlanOutcome {
  std::optional<AutoPlan> plan;
  std::optional<Violation> violation;  // InvalidParallelismAuto with the planner's message
};

// Runs the search for `replicas` pods. Degrees the spec pins (tensor or pipeline other than 1, an explicit data) are
// kept; zero (0-2) and the micro-batch are chosen.
AutoPlanOutcome plan_parallelism(const JobSpec& spec, int replicas, const std::vector<NodeInfo>& nodes);

// Writes the chosen degrees into the spec, so that world_layout() and resolved_config() describe the planned world.
void apply_plan(JobSpec& spec, const plan::Layout& layout);

}  // namespace railyard::op
