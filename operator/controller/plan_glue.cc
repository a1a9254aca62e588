#include "operator/controller/plan_glue.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

#include "common/error.h"
#include "common/wellknown.h"
#include "planner/calibration.h"
#include "planner/context_parallel.h"
#include "planner/hetero.h"
#include "planner/moe_cost.h"
#include "planner/search.h"

namespace railyard::op {
namespace {

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

// GPU nodes per gpu-type label among the ready, schedulable, selected GPU nodes (empty for a CPU job).
std::map<std::string, int> gpu_types(const JobSpec& spec, const std::vector<NodeInfo>& nodes) {
  std::map<std::string, int> types;
  if (spec.device == "cpu") return types;
  for (const NodeInfo& n : nodes) {
    if (!n.ready || n.unschedulable || n.gpu_allocatable <= 0) continue;
    if (!std::all_of(spec.node_selector.begin(), spec.node_selector.end(),
                     [&n](const auto& kv) { return label_of(n, kv.first.c_str()) == kv.second; }))
      continue;
    types[label_of(n, wellknown::kGpuTypeLabel)]++;
  }
  return types;
}

// The job's pods by type in proportion to the usable nodes of each type (largest remainders), as pod type labels in
// name order: what the pods are expected to land on before they are placed.
std::vector<std::string> expected_pod_types(const std::map<std::string, int>& types, int replicas) {
  int total = 0;
  for (const auto& [t, c] : types) total += c;
  std::vector<std::pair<double, std::string>> rest;
  std::map<std::string, int> take;
  int given = 0;
  for (const auto& [t, c] : types) {
    const double exact = double(replicas) * c / total;
    take[t] = static_cast<int>(exact);
    given += take[t];
    rest.push_back({-(exact - take[t]), t});
  }
  std::sort(rest.begin(), rest.end());
  for (size_t k = 0; given < replicas; ++k, ++given) take[rest[k % rest.size()].second]++;
  std::vector<std::string> out;
  for (const auto& [t, c] : take) out.insert(out.end(), c, t);
  return out;
}

}  // namespace

plan::Job plan_job(const JobSpec& spec) {
  plan::Job job;
  job.model = {
      spec.preset.empty() ? "custom" : spec.preset,         spec.model.layers, spec.model.hidden, spec.model.heads,
      spec.seq_len > 0 ? spec.seq_len : spec.model.seq_len, spec.model.vocab};
  job.model.dropout = false;  // Railyard's worker trains without dropout: no masks among the stored activations
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
    for (const NodeInfo* n : gpu_nodes) types[label_of(*n, wellknown::kGpuTypeLabel)]++;
    type = std::max_element(types.begin(), types.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
    // Mixed types: the layout must fit on every replica, so it is planned on the smallest usable memory (the speeds
    // enter through plan_parallelism's mixed estimate).
    if (types.size() > 1) {
      double smallest = -1;
      for (const auto& [t, count] : types) {
        try {
          const plan::DeviceProfile d = plan::builtin_profile(t);
          const double capacity = d.memory_bytes * d.usable_memory_fraction;
          if (smallest < 0 || capacity < smallest) smallest = capacity, type = t;
        } catch (const ConfigError&) {
          type = t;  // reported below with the fix
          break;
        }
      }
    }
    if (type.empty())
      throw ConfigError(std::string("node label ") + wellknown::kGpuTypeLabel +
                        " is missing on the GPU nodes: label them (e.g. a100-80gb, h100-sxm, h200) so the planner "
                        "knows the device, or give spec.parallelism degrees instead of auto");
    usable = gpu_nodes;
  }
  try {
    c.device = plan::builtin_profile(type);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string("node label ") + wellknown::kGpuTypeLabel + "=" + type + ": " + e.what() +
                      "; or give spec.parallelism degrees instead of auto");
  }
  c.topology.origin = "nodes";
  c.topology.gpu_type = c.device.name;
  // One pod per node, procsPerReplica ranks per pod: the pod is the planner's "node" (tensor groups stay inside it).
  c.topology.gpus_per_node = spec.procs_per_replica;
  c.topology.nodes_per_unit = widest(usable, nullptr, wellknown::kUnitLabel);
  c.topology.units_per_leaf = widest(usable, wellknown::kUnitLabel, wellknown::kLeafLabel);
  c.topology.leaves_per_spine = widest(usable, wellknown::kLeafLabel, wellknown::kSpineLabel);
  c.topology.nodes = replicas;
  c.gpus = replicas * spec.procs_per_replica;
  return c;
}

namespace {

plan::SearchOptions search_options(const JobSpec& spec, const plan::Cluster& cluster) {
  // What the worker implements: dp/tp/pp with plain 1F1B, ZeRO 0-2, no interleaving, recomputation of all layers or
  // none, optimizer offload on the host. The search pins one ZeRO stage at a time so that stage 3 is never a
  // candidate; recompute and offload cost time, so the search picks them only when a layout does not fit without.
  plan::SearchOptions o;
  o.top = 3;
  o.sequence_parallel = spec.sequence_parallel;  // the spec's choice (the worker's SP has its own constraints)
  o.interleaves = {1};
  o.interleave = 1;
  if (auto r = recompute_from_string(spec.recompute)) o.recompute = *r;
  // The planner picks the offloaded update by itself on the CPU only: the worker runs it on a GPU too (2026-11-27), but
  // its copy costs there are unmeasured. A spec that asks for it gets it.
  if (!spec.offload.empty())
    o.offload = spec.offload == "optimizer";
  else if (cluster.device.name != "cpu")
    o.offload = false;
  o.power_of_two_accumulation = spec.deterministic;
  if (spec.tensor > 1) o.tp = spec.tensor;
  if (spec.pipeline > 1) o.pp = spec.pipeline;
  // Experts compose with data and expert parallelism only (worker/main.cc): tensor and pipeline stay 1.
  if (spec.moe.experts > 0) o.tp = o.tp.value_or(1), o.pp = o.pp.value_or(1);
  if (spec.data) o.dp = *spec.data;
  return o;
}

// The message and status of a context-parallel plan (nothing fits without).
AutoPlan described_context_plan(AutoPlan p, const JobSpec& spec, const plan::Job& job, const plan::Cluster& cluster,
                                int replicas) {
  p.device = cluster.device.name;
  const double step = p.estimate.time.step + p.ring_seconds;
  p.message = "planned dp=" + std::to_string(p.layout.dp) + " context=" + std::to_string(p.context) +
              " tp=" + std::to_string(p.layout.tp) + " pp=" + std::to_string(p.layout.pp) +
              " microBatch=" + std::to_string(p.layout.micro_batch) + " zero=" + std::to_string(p.layout.zero) +
              " recompute=" + railyard::to_string(p.layout.recompute) + " on " + std::to_string(cluster.gpus) + " x " +
              p.device + " (no layout fits without context parallelism): predicted step " + seconds_text(step) + ", " +
              bytes_text(p.estimate.memory.total()) + " per device";
  p.status = {{"device", p.device},
              {"data", p.layout.dp},
              {"tensor", p.layout.tp},
              {"pipeline", p.layout.pp},
              {"context", p.context},
              {"microBatch", p.layout.micro_batch},
              {"zero", p.layout.zero},
              {"replicas", replicas},
              {"recompute", railyard::to_string(p.layout.recompute)},
              {"offload", "none"},
              {"predictedStepSeconds", step},
              {"predictedTokensPerSecond", double(spec.global_batch) * job.model.seq / step},
              {"predictedMemoryBytesPerDevice", p.estimate.memory.total()},
              {"predictedRingSeconds", p.ring_seconds}};
  return p;
}

void plan_mixed_types(const JobSpec& spec, const std::vector<NodeInfo>& nodes, const plan::Job& job,
                      const plan::Cluster& cluster, const plan::SearchOptions& o, int replicas, AutoPlan& p,
                      std::optional<MixedSplit>& mixed, double& mixed_step) {
  // Mixed GPU types: the best layout above runs with the even split, paced by the slowest type; plain data
  // parallelism (what the worker's --dp-split runs) can split the batch in proportion to speed instead. Keep the
  // faster of the two predictions.
  if (const auto types = gpu_types(spec, nodes); types.size() > 1) {
    const std::vector<std::string> pod_types = expected_pod_types(types, replicas);
    double even = 0;
    for (const auto& [t, c] : types) {
      plan::Cluster typed = cluster;
      typed.device = plan::builtin_profile(t);  // plan_cluster checked every type
      even = std::max(even, plan::estimate(job, typed, p.layout).time.step);
    }
    mixed_step = even;
    if (!spec.data && spec.tensor <= 1 && spec.pipeline <= 1 && !spec.deterministic && !p.experts) {
      plan::SearchOptions dp_only = o;
      dp_only.tp = 1, dp_only.pp = 1, dp_only.zero = 0;
      std::optional<plan::Estimate> best_dp;
      MixedSplit best_split;
      try {
        for (const plan::RankedPlan& r : plan::search(job, cluster, dp_only).plans) {
          JobSpec trial = spec;
          apply_plan(trial, r.estimate.layout);
          std::optional<MixedSplit> ms = mixed_split(trial, pod_types);
          if (ms && !ms->dp_split.empty() && (!best_dp || ms->balanced_step < best_split.balanced_step))
            best_dp = r.estimate, best_split = *ms;
        }
      } catch (const Error&) {
      }
      if (best_dp && best_split.balanced_step < even) {
        p.estimate = *best_dp;
        p.layout = best_dp->layout;
        mixed = best_split;
        mixed_step = best_split.balanced_step;
      }
    }
    if (!mixed) {
      JobSpec chosen = spec;
      apply_plan(chosen, p);  // with a MoE plan's expert degree: no uneven split then
      mixed = mixed_split(chosen, pod_types);
      if (mixed && mixed->dp_split.empty()) mixed->status["evenStepSeconds"] = even;
    }
    if (mixed) mixed->status["expectedPods"] = pod_types;
  }
}

// The message and status of the chosen plan: prediction, runner-up, experts, mixed GPU types.
void describe_plan(const JobSpec& spec, const plan::Job& job, const plan::Cluster& cluster,
                   const std::vector<plan::RankedPlan>& plans, int replicas, const std::optional<MixedSplit>& mixed,
                   double mixed_step, AutoPlan& p) {
  p.device = cluster.device.name;
  const plan::Estimate& e = p.estimate;
  p.message = "planned dp=" + std::to_string(p.layout.dp) + " tp=" + std::to_string(p.layout.tp) +
              " pp=" + std::to_string(p.layout.pp) + " microBatch=" + std::to_string(p.layout.micro_batch) +
              " zero=" + std::to_string(p.layout.zero) + " recompute=" + railyard::to_string(p.layout.recompute) +
              (p.layout.offload ? " offload=optimizer" : "") +
              (p.experts ? " expert=" + std::to_string(p.experts->expert) + " expertAllToAll=" + p.experts->all_to_all
                         : std::string()) +
              " on " + std::to_string(cluster.gpus) + " x " + p.device + ": predicted step " +
              seconds_text(e.time.step) + ", " + fmt("%.0f", e.tokens_per_s) + " tokens/s, " +
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
              {"predictedMfu", e.mfu},
              {"recompute", railyard::to_string(p.layout.recompute)},
              {"offload", p.layout.offload ? "optimizer" : "none"}};
  if (p.experts) {
    // The dense estimate above plus the MoE terms: the experts' memory and the dispatch/combine all-to-alls (not
    // overlapped with compute in the worker).
    p.status["expert"] = p.experts->expert;
    p.status["expertAllToAll"] = p.experts->all_to_all;
    p.status["predictedAllToAllSeconds"] = p.experts->all_to_all_seconds;
    p.status["predictedStepSeconds"] = e.time.step + p.experts->all_to_all_seconds;
    p.status["predictedTokensPerSecond"] =
        double(spec.global_batch) * job.model.seq / (e.time.step + p.experts->all_to_all_seconds);
    p.status["predictedMemoryBytesPerDevice"] = p.experts->memory_bytes;
  }
  p.mixed = mixed;
  if (mixed) {
    // The prediction of the mixed world replaces the homogeneous one (planned on the smallest-memory type).
    const double tokens = double(spec.global_batch) * job.model.seq;
    p.status["predictedStepSeconds"] = mixed_step;
    p.status["predictedTokensPerSecond"] = tokens / mixed_step;
    p.status["mixed"] = mixed->status;
    p.message += "; mixed GPU types " + mixed->status["ranksByDevice"].dump() + ": " +
                 (mixed->dp_split.empty() ? "even split (" + mixed->why_even + ")"
                                          : "batch split by speed, predicted step " + seconds_text(mixed_step));
  }
}

}  // namespace

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
  plan::SearchOptions o = search_options(spec, cluster);
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
  // Nothing fits: long sequences may still run with each split over `cp` ranks (ring attention, no stored
  // probabilities), where the worker runs it (dense, not deterministic, no sequence parallelism or offload).
  std::optional<AutoPlan> context_plan;
  if (plans.empty() && spec.moe.experts == 0 && !spec.deterministic && !spec.sequence_parallel &&
      spec.offload != "optimizer" && !spec.data)
    if (std::optional<plan::ContextPlan> c = plan::search_context(job, cluster, o)) {
      AutoPlan p;
      p.estimate = c->estimate;
      p.layout = c->estimate.layout;
      p.context = c->context;
      p.ring_seconds = c->ring_seconds;
      context_plan = p;
    }
  if (plans.empty() && context_plan) {
    AutoPlan p = described_context_plan(*context_plan, spec, job, cluster, replicas);
    JobSpec planned = spec;
    apply_plan(planned, p);
    if (std::optional<Violation> v = check_family(planned, replicas)) {
      out.violation = *v;
      return out;
    }
    out.plan = std::move(p);
    return out;
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
  if (spec.moe.experts > 0) {
    ExpertChoice ec = choose_experts(spec, job, cluster, p.estimate);
    if (!ec.plan) return invalid(*ec.why_not);
    p.experts = ec.plan;
  }
  std::optional<MixedSplit> mixed;
  double mixed_step = 0;
  plan_mixed_types(spec, nodes, job, cluster, o, replicas, p, mixed, mixed_step);
  describe_plan(spec, job, cluster, plans, replicas, mixed, mixed_step, p);
  // What the worker refuses (e.g. sequenceParallel's token split) on the planned world.
  JobSpec planned = spec;
  apply_plan(planned, p);
  if (std::optional<Violation> v = check_family(planned, replicas)) {
    out.violation = Violation{v->field, v->reason, v->message + " (with the planned " + describe(p.layout) + ")"};
    return out;
  }
  out.plan = std::move(p);
  return out;
}

ExpertChoice choose_experts(const JobSpec& spec, const plan::Job& job, const plan::Cluster& cluster,
                            const plan::Estimate& e) {
  plan::ExpertRequest r;
  r.moe = {spec.moe.experts, spec.moe.top_k, spec.moe.capacity_factor};
  if (spec.expert_given) r.pinned = spec.expert;
  r.all_to_all = spec.expert_all_to_all;
  // The worker's hierarchical exchange needs host memory (not on CUDA) and the pod's ranks to tile the group
  // (check_family); the tiling depends on the degree the search picks, so it is checked after it.
  r.hierarchical_allowed = spec.device != "cuda";
  const plan::Layout& l = e.layout;
  ExpertChoice out;
  plan::ExpertSearch s = plan::search_experts(job, cluster, e, r);
  if (s.plan && s.plan->expert > 1 && s.plan->all_to_all == "hierarchical" && spec.expert_all_to_all.empty()) {
    const int ep = s.plan->expert;
    if (!(spec.procs_per_replica >= ep || ep % spec.procs_per_replica == 0)) {
      s.plan->all_to_all = "flat";
      s.plan->all_to_all_seconds = s.plan->flat_seconds;
    }
  }
  if (s.pinned_does_not_divide) {
    out.why_not = "spec.parallelism.expert " + std::to_string(spec.expert) + " does not divide both the " +
                  std::to_string(spec.moe.experts) + " experts and the planned data-parallel degree " +
                  std::to_string(l.dp) + " (" + describe(l) +
                  "): leave expert out so the planner picks it, or change replicas";
    return out;
  }
  if (s.plan) {
    out.plan = *s.plan;
    return out;
  }
  out.why_not =
      "the mixture-of-experts model (" + std::to_string(spec.moe.experts) + " experts) needs " +
      bytes_text(std::max(0.0, s.smallest_memory)) + " per device at best (" + describe(l) + ") of " +
      bytes_text(e.memory_capacity) +
      ": add replicas (a larger data-parallel degree splits the experts further), fewer experts, or a smaller "
      "globalBatch";
  return out;
}

std::shared_ptr<const PlacementStepModel> placement_step_model(const JobSpec& spec, const WorldLayout& w, int replicas,
                                                               const std::vector<NodeInfo>& nodes) {
  auto m = std::make_shared<PlacementStepModel>();
  m->job = plan_job(spec);
  try {
    plan::validate(m->job.model);
    m->cluster = plan_cluster(spec, replicas, nodes);
  } catch (const Error&) {
    return nullptr;  // placement falls back to hop counts; spec validation reports bad shapes
  }
  m->cluster.topology.nodes = 0;
  m->layout.dp = w.data;
  m->layout.tp = w.tensor;
  m->layout.pp = w.pipeline;
  m->layout.micro_batch = std::max(1, spec.micro_batch);
  m->layout.zero = spec.zero;
  m->layout.recompute = recompute_from_string(spec.recompute).value_or(Recompute::kNone);
  m->layout.sequence_parallel = spec.sequence_parallel;
  if (!plan::check_layout(m->job, m->cluster, m->layout).empty()) return nullptr;
  return m;
}

std::optional<MixedSplit> mixed_split(const JobSpec& spec, const std::vector<std::string>& pod_types) {
  if (spec.device == "cpu" || pod_types.empty()) return std::nullopt;
  std::map<std::string, int> ranks_by_type;
  for (const std::string& t : pod_types) ranks_by_type[t] += spec.procs_per_replica;
  if (ranks_by_type.size() < 2) return std::nullopt;
  MixedSplit out;
  out.status = {{"ranksByDevice", ranks_by_type}};
  const WorldLayout w = world_layout(spec, static_cast<int>(pod_types.size()));
  // The worker splits unevenly only under plain data parallelism with replicated optimizer state (trainer.cc).
  if (w.tensor > 1 || w.pipeline > 1 || w.context > 1 || w.expert > 1 || spec.zero > 0 || spec.deterministic) {
    out.why_even =
        "the worker splits the batch unevenly only under plain data parallelism (tensor 1, pipeline 1, context 1, "
        "expert 1, zero 0, not deterministic)";
    out.status["split"] = "even";
    out.status["why"] = out.why_even;
    return out;
  }
  // Ranks in order, grouped into runs of one type (estimate_mixed_dp returns the split group by group, in order).
  std::vector<plan::ReplicaGroup> groups;
  try {
    for (const std::string& t : pod_types) {
      if (groups.empty() || groups.back().device.name != plan::builtin_profile(t).name)
        groups.push_back({plan::builtin_profile(t), 0});
      groups.back().replicas += spec.procs_per_replica;
    }
  } catch (const ConfigError& e) {
    out.why_even = std::string("no device profile: ") + e.what();
    out.status["split"] = "even";
    out.status["why"] = out.why_even;
    return out;
  }
  const plan::Job job = plan_job(spec);
  plan::Topology topo;
  topo.gpus_per_node = spec.procs_per_replica;
  plan::Layout l;
  l.micro_batch = std::max(1, spec.micro_batch);
  try {
    out.balanced_step = plan::estimate_mixed_dp(job, topo, groups, l, true).step;
    out.dp_split = plan::estimate_mixed_dp(job, topo, groups, l, true).micro_batches;
  } catch (const Error& e) {
    out.why_even = e.what();
    out.status["split"] = "even";
    out.status["why"] = out.why_even;
    return out;
  }
  try {
    out.even_step = plan::estimate_mixed_dp(job, topo, groups, l, false).step;
  } catch (const Error&) {
    out.even_step = 0;  // the batch does not divide evenly: only the balanced split runs
  }
  out.status["split"] = "balanced";
  out.status["dpSplit"] = out.dp_split;
  out.status["balancedStepSeconds"] = out.balanced_step;
  if (out.even_step > 0) out.status["evenStepSeconds"] = out.even_step;
  return out;
}

void apply_plan(JobSpec& spec, const plan::Layout& layout) {
  spec.tensor = layout.tp;
  spec.pipeline = layout.pp;
  spec.zero = layout.zero;
  spec.micro_batch = layout.micro_batch;
  spec.recompute = railyard::to_string(layout.recompute);
  spec.offload = layout.offload ? "optimizer" : "none";
  spec.sequence_parallel = layout.sequence_parallel;
}

void apply_plan(JobSpec& spec, const AutoPlan& plan) {
  apply_plan(spec, plan.layout);
  spec.context = plan.context;
  if (plan.experts) {
    spec.expert = plan.experts->expert;
    spec.expert_all_to_all = plan.experts->all_to_all;
  }
}

}  // namespace railyard::op
