#include "operator/controller/plan_glue.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "common/error.h"
#include "operator/planner/calibration.h"
#include "operator/planner/search.h"

namespace railyard::op {
namespace {

// Same labels as the scheduler (operator/scheduler/topology.h); repeated here because the controller library does
// not link the scheduler.
constexpr const char* kGpuTypeLabel = "railyard.dev/gpu-type";
constexpr const char* kUnitLabel = "railyard.dev/unit";
constexpr const char* kLeafLabel = "railyard.dev/leaf";
constexpr const char* kSpineLabel = "railyard.dev/spine";

std::string label_of(const NodeInfo& n, const char* key) {
  auto it = n.labels.find(key);
  return it == n.labels.end() ? "" : it->second;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string bytes_text(double b) { return fmt("%.2f GiB", b / (1024.0 * 1024 * 1024)); }

std::string seconds_text(double s) { return s < 1 ? fmt("%.1f ms", s * 1e3) : fmt("%.2f s", s); }

// Largest count of nodes sharing one value of `inner` (within one value of `outer`), at least 1.
int widest(const std::vector<const NodeInfo*>& nodes, const char* inner, const char* outer) {
  std::map<std::string, std::set<std::string>> members;  // outer domain -> inner domains (or node names)
  for (const NodeInfo* n : nodes) {
    std::string in = inner ? label_of(*n, inner) : n->name;
    if (in.empty()) continue;
    members[outer ? label_of(*n, outer) : ""].insert(in);
  }
  size_t best = 0;
  for (const auto& [k, v] : members) best = std::max(best, v.size());
  return std::max<int>(1, static_cast<int>(best));
}

}  // namespace

plan::Job plan_job(const JobSpec& spec) {
  plan::Job job;
  job.model = {
      spec.preset.empty() ? "custom" : spec.preset,         spec.model.layers, spec.model.hidden, spec.model.heads,
      spec.seq_len > 0 ? spec.seq_len : spec.model.seq_len, spec.model.vocab};
  job.global_batch = spec.global_batch;
  return job;
}

plan::Cluster plan_cluster(const JobSpec& spec, int replicas, const std::vector<NodeInfo>& nodes) {
  std::vector<const NodeInfo*> usable, gpu_nodes;
  for (const NodeInfo& n : nodes) {
    if (!n.ready || n.unschedulable) continue;
    bool selected = std::all_of(spec.node_selector.begin(), spec.node_selector.end(),
                                [&n](const auto& kv) { return label_of(n, kv.first.c_str()) == kv.second; });
    if (!selected) continue;
    usable.push_back(&n);
    if (n.gpu_allocatable > 0) gpu_nodes.push_back(&n);
  }
  plan::Cluster c;
  const bool cpu = spec.device == "cpu" || (spec.device == "auto" && gpu_nodes.empty());
  std::string type = "cpu";
  if (!cpu) {
    if (gpu_nodes.empty())
      throw ConfigError(
          std::string("spec.device cuda: no ready node with nvidia.com/gpu matches the job: add GPU "
                      "nodes or set spec.device to cpu"));
    std::map<std::string, int> types;  // the most common GPU type among the usable GPU nodes
    for (const NodeInfo* n : gpu_nodes) types[label_of(*n, kGpuTypeLabel)]++;
    type = std::max_element(types.begin(), types.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
    if (type.empty())
      throw ConfigError(std::string("node label ") + kGpuTypeLabel +
                        " is missing on the GPU nodes: label them (e.g. a100-80gb, h100-sxm, h200) so the planner "
                        "knows the device, or give spec.parallelism degrees instead of auto");
    usable = gpu_nodes;
  }
  try {
    c.device = plan::builtin_profile(type);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("node label ") + kGpuTypeLabel + "=" + type + ": " + e.what() +
                      "; or give spec.parallelism degrees instead of auto");
  }
  c.topology.origin = "nodes";
  c.topology.gpu_type = c.device.name;
  // One pod per node, procsPerReplica ranks per pod: the pod is the planner's "node" (tensor groups stay inside it).
  c.topology.gpus_per_node = spec.procs_per_replica;
  c.topology.nodes_per_unit = widest(usable, nullptr, kUnitLabel);
  c.topology.units_per_leaf = widest(usable, kUnitLabel, kLeafLabel);
  c.topology.leaves_per_spine = widest(usable, kLeafLabel, kSpineLabel);
  c.topology.nodes = replicas;
  c.gpus = replicas * spec.procs_per_replica;
  return c;
}

AutoPlanOutcome plan_parallelism(const JobSpec& spec, int replicas, const std::vector<NodeInfo>& nodes) {
  AutoPlanOutcome out;
  auto invalid = [&out](const std::string& what) {
    out.violation = Violation{"spec.parallelism.auto", "InvalidParallelismAuto", "spec.parallelism.auto: " + what};
    return out;
  };
  plan::Job job = plan_job(spec);
  plan::Cluster cluster;
  try {
    cluster = plan_cluster(spec, replicas, nodes);
  } catch (const Error& e) {
    return invalid(e.what());
  }
  // What the worker implements: dp/tp/pp with plain 1F1B, ZeRO 0-2, no sequence parallelism, no interleaving, no
  // recomputation. The search pins one ZeRO stage at a time so that stage 3 is never a candidate.
  plan::SearchOptions o;
  o.top = 3;
  o.sequence_parallel = false;
  o.interleaves = {1};
  o.interleave = 1;
  o.recompute = plan::Recompute::kNone;
  o.offload = false;  // the pods are not started with --offload (yet): never plan it here
  o.power_of_two_accumulation = spec.deterministic;
  if (spec.tensor > 1) o.tp = spec.tensor;
  if (spec.pipeline > 1) o.pp = spec.pipeline;
  if (spec.data) o.dp = *spec.data;
  std::vector<plan::RankedPlan> plans;
  std::optional<plan::Estimate> closest;
  try {
    for (int zero = 0; zero <= 2; ++zero) {
      o.zero = zero;
      plan::SearchResult r = plan::search(job, cluster, o);
      plans.insert(plans.end(), r.plans.begin(), r.plans.end());
      if (r.smallest_nonfitting && (!closest || r.smallest_nonfitting->memory.total() < closest->memory.total()))
        closest = r.smallest_nonfitting;
    }
  } catch (const Error& e) {
    return invalid(e.what());
  }
  if (plans.empty()) {
    std::string why = "no layout of " + std::to_string(cluster.gpus) + " x " + cluster.device.name + " (" +
                      std::to_string(replicas) + " pods x " + std::to_string(spec.procs_per_replica) +
                      " procs) runs this model with globalBatch " + std::to_string(spec.global_batch) +
                      " using dp/tp/pp and ZeRO 0-2" +
                      (spec.deterministic ? " with a power-of-two accumulation per rank (deterministic)" : "");
    if (closest)
      why += "; the closest (" + plan::describe(closest->layout) + ") needs " + bytes_text(closest->memory.total()) +
             " per device of " + bytes_text(closest->memory_capacity);
    else
      why += "; no layout is valid (degrees must divide heads, layers, the world and the batch)";
    return invalid(why + ": add replicas, use a smaller model or a different globalBatch, or give the degrees");
  }
  // Stable: equal step times keep the lower ZeRO stage (less communication for the same prediction).
  std::stable_sort(plans.begin(), plans.end(), [](const plan::RankedPlan& a, const plan::RankedPlan& b) {
    return a.estimate.time.step < b.estimate.time.step;
  });
  AutoPlan p;
  p.estimate = plans[0].estimate;
  p.layout = p.estimate.layout;
  p.device = cluster.device.name;
  const plan::Estimate& e = p.estimate;
  p.message = "planned dp=" + std::to_string(p.layout.dp) + " tp=" + std::to_string(p.layout.tp) +
              " pp=" + std::to_string(p.layout.pp) + " microBatch=" + std::to_string(p.layout.micro_batch) +
              " zero=" + std::to_string(p.layout.zero) + " on " + std::to_string(cluster.gpus) + " x " + p.device +
              ": predicted step " + seconds_text(e.time.step) + ", " + fmt("%.0f", e.tokens_per_s) + " tokens/s, " +
              bytes_text(e.memory.total()) + " per device";
  for (size_t i = 1; i < plans.size(); ++i) {
    const auto& l = plans[i].estimate.layout;
    if (l.dp == p.layout.dp && l.tp == p.layout.tp && l.pp == p.layout.pp && l.micro_batch == p.layout.micro_batch)
      continue;  // the same shape with another ZeRO stage says nothing new
    p.message += "; runner-up " + plan::describe(l) + " is slower: " + plan::why_slower(plans[i].estimate, e);
    break;
  }
  p.status = {{"device", p.device},
              {"data", p.layout.dp},
              {"tensor", p.layout.tp},
              {"pipeline", p.layout.pp},
              {"microBatch", p.layout.micro_batch},
              {"zero", p.layout.zero},
              {"replicas", replicas},
              {"predictedStepSeconds", e.time.step},
              {"predictedTokensPerSecond", e.tokens_per_s},
              {"predictedMemoryBytesPerDevice", e.memory.total()},
              {"predictedMfu", e.mfu}};
  out.plan = std::move(p);
  return out;
}

void apply_plan(JobSpec& spec, const plan::Layout& layout) {
  spec.tensor = layout.tp;
  spec.pipeline = layout.pp;
  spec.zero = layout.zero;
  spec.micro_batch = layout.micro_batch;
}

}  // namespace railyard::op
