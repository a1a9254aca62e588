// Mixed GPU types (Whale, USENIX ATC'22): give each data-parallel replica a share of the batch in proportion to its
// speed, and cut pipeline stages in proportion to the speed of the GPUs that run them, with the memory-heavier early
// stages on the larger-memory GPUs.
#pragma once

#include <string>
#include <vector>

#include "planner/cost_model.h"

namespace railyard::plan {

// `replicas` data-parallel replicas, each tp*pp GPUs of one device type.
struct ReplicaGroup {
  DeviceProfile device;
  int replicas = 0;
};

struct HeteroEstimate {
  std::vector<int> micro_batches;  // per replica, groups in order
  double step = 0;                 // seconds: slowest replica's pipeline + the reduction and optimizer
  std::vector<double> replica_seconds;
};

// Data parallelism over mixed replicas with the given per-replica layout (dp is ignored: it is the replica count).
// balanced = false splits the global batch evenly (what a type-blind runtime does); balanced = true assigns micro-
// batches one at a time to the replica that would finish first. Throws ConfigError when the layout is invalid for a
// group or the batch does not split into micro-batches.
HeteroEstimate estimate_mixed_dp(const Job& job, const Topology& topology, const std::vector<ReplicaGroup>& groups,
                                 const Layout& replica_layout, bool balanced);

// Layers per pipeline stage for stages run by devices of the given relative speeds and memories: proportional to
// speed (largest remainders, at least one layer each), the stages ordered so that the larger-memory devices take the
// earlier stages (which hold the most micro-batches in flight under 1F1B). Returns {stage order (device indices),
// layers per stage in that order}.
struct StageCut {
  std::vector<int> device;  // device index of stage k
  std::vector<int> layers;  // layers of stage k
  double bottleneck = 0;    // max over stages of layers / speed (relative time per micro-batch)
};
StageCut cut_stages(int layers, const std::vector<double>& speeds, const std::vector<double>& memories, bool balanced);

// A pipeline whose stages run on devices of different types (one device type per stage; tp GPUs per stage, dp
// replicas of the whole pipeline), cut by cut_stages: balanced = layers in proportion to each device's measured
// speed on one layer, else the even cut; both put the larger-memory devices first. Per stage k: time per
// micro-batch = its layers x that device's layer time (+ embedding on the first, LM head and loss on the last, + its
// pipeline send/recv), memory = its parameters, gradients and optimizer state + min(m, p - k) micro-batches of its
// layers' activations in flight (1F1B). Step = sum of the stage times (fill and drain) + (m - 1) x the slowest stage
// + the slowest device's exposed data-parallel reduction and optimizer step (from the homogeneous estimate).
struct MixedPipelineEstimate {
  StageCut cut;
  std::vector<std::string> device;     // profile name of stage k
  std::vector<double> stage_seconds;   // per micro-batch
  std::vector<double> stage_memory;    // bytes per GPU
  std::vector<double> stage_capacity;  // usable bytes per GPU
  bool fits = false;
  double step = 0;
};
MixedPipelineEstimate estimate_mixed_pipeline(const Job& job, const Topology& topology,
                                              const std::vector<DeviceProfile>& stage_devices, const Layout& layout,
                                              bool balanced);

}  // namespace railyard::plan
