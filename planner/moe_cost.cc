#include "planner/moe_cost.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/error.h"

namespace railyard::plan {

namespace {
// Same-rail hops per tier, as in cost_model.cc (Topology's comment): node 0, unit 1, leaf 3, spine 5.
constexpr double kHops[] = {0, 1, 3, 5};
constexpr const char* kTiers[] = {"node", "unit", "leaf", "spine"};

void check_moe(const MoeShape& moe) {
  if (moe.experts < 0) throw ConfigError("moe experts must be >= 0 (got " + std::to_string(moe.experts) + ")");
  if (moe.experts > 0 && (moe.top_k < 1 || moe.top_k > moe.experts)) {
    throw ConfigError("moe top_k " + std::to_string(moe.top_k) + " must be in 1..experts");
  }
}
}  // namespace

double moe_parameter_count(const ModelShape& m, const MoeShape& moe) {
  check_moe(moe);
  const double h = m.hidden, L = m.layers;
  if (moe.experts == 0) return parameter_count(m);
  const double mlp = 8 * h * h + 5 * h;
  return parameter_count(m) + L * ((moe.experts - 1) * mlp + moe.experts * h);
}

double moe_parameters_per_gpu(const ModelShape& m, const MoeShape& moe, int ep) {
  check_moe(moe);
  if (ep < 1 || (moe.experts > 0 && moe.experts % ep != 0)) {
    throw ConfigError("expert parallelism " + std::to_string(ep) + " must be >= 1 and divide the experts");
  }
  if (moe.experts == 0) return parameter_count(m);
  const double h = m.hidden, L = m.layers, mlp = 8 * h * h + 5 * h;
  const double experts = L * moe.experts * mlp;
  return moe_parameter_count(m, moe) - experts + experts / ep;
}

double moe_dispatch_bytes(const ModelShape& m, const MoeShape& moe, const DeviceProfile& d, double tokens) {
  check_moe(moe);
  if (moe.experts == 0) return 0;
  double cap = tokens;
  if (moe.capacity_factor > 0) {
    cap = std::min(tokens, std::max(1.0, std::ceil(moe.capacity_factor * moe.top_k * tokens / moe.experts)));
  }
  return moe.experts * cap * m.hidden * d.activation_bytes;
}

double moe_layer_activation_bytes(const ModelShape& m, const MoeShape& moe, const DeviceProfile& d, const Layout& l) {
  check_moe(moe);
  const double dense = layer_activation_bytes(m, d, l);
  if (moe.experts == 0 || l.recompute == Recompute::kFull) return dense;
  if (l.tp > 1) throw ConfigError("experts with tensor parallelism are not modelled: use tp 1");
  const double n = double(m.seq) * l.micro_batch, h = m.hidden;
  const double R = moe_dispatch_bytes(m, moe, d, n) / (h * d.activation_bytes);  // E cap rows
  return dense + d.activation_bytes * (8 * h * (R - n) + R * h + n * moe.experts);
}

MoeStateBytes moe_state_bytes(const ModelShape& m, const MoeShape& moe, const DeviceProfile& d, int dp, int ep,
                              int zero) {
  if (dp < 1 || ep < 1 || dp % ep != 0) {
    throw ConfigError("expert parallelism " + std::to_string(ep) + " must divide the data-parallel degree " +
                      std::to_string(dp));
  }
  const double per_gpu = moe_parameters_per_gpu(m, moe, ep);
  const double experts =
      moe.experts == 0 ? 0 : double(m.layers) * moe.experts * (8.0 * m.hidden * m.hidden + 5.0 * m.hidden) / ep;
  MoeStateBytes b;
  for (auto [p, group] : {std::pair{per_gpu - experts, double(dp)}, std::pair{experts, double(dp / ep)}}) {
    b.params += p * d.weight_bytes / (zero >= 3 ? group : 1);
    b.grads += p * d.grad_bytes / (zero >= 2 ? group : 1);
    b.optimizer += p * d.optimizer_bytes / (zero >= 1 ? group : 1);
  }
  return b;
}

AllToAllCost all_to_all_cost(const Cluster& c, int ranks, double bytes) {
  const DeviceProfile& d = c.device;
  const Topology& t = c.topology;
  AllToAllCost out;
  const int gpn = std::max(1, t.gpus_per_node);
  out.local = std::min(ranks, gpn);
  if (ranks % out.local != 0) {
    throw ConfigError("all-to-all over " + std::to_string(ranks) + " GPUs: not whole nodes of " + std::to_string(gpn));
  }
  out.nodes = ranks / out.local;
  const double P = ranks, G = out.local, N = out.nodes;
  // Tier of the N nodes (packed from a unit boundary, as the rail-aware scheduler places a job).
  const long long unit = t.nodes_per_unit, leaf = unit * t.units_per_leaf;
  int tier = 0;
  if (out.nodes > 1) tier = out.nodes <= unit ? 1 : out.nodes <= leaf ? 2 : 3;
  out.tier = kTiers[tier];
  const double factor = tier == 2 ? t.leaf_bandwidth_factor : tier == 3 ? t.spine_bandwidth_factor : 1.0;
  const double lat = d.collective_latency_s, hop = d.hop_latency_s;
  const double b_nvl = d.nvlink_bandwidth * d.nvlink_efficiency;
  const double b_rail = d.nic_bandwidth * d.nic_efficiency * factor;
  // Rail changes go through the leaf layer, or the spine when the job already spans leaves.
  const int xtier = std::max(tier, 2);
  const double b_x =
      d.nic_bandwidth * d.nic_efficiency * (xtier == 3 ? t.spine_bandwidth_factor : t.leaf_bandwidth_factor);
  const double chunk = bytes / P;
  out.flat = (G - 1) * (chunk / b_nvl + lat);
  if (N > 1) {
    out.flat +=
        (N - 1) * ((chunk / b_rail + lat + kHops[tier] * hop) + (G - 1) * (chunk / b_x + lat + kHops[xtier] * hop));
  }
  out.hierarchical = (G - 1) * (bytes / G / b_nvl + lat);
  if (N > 1) out.hierarchical += (N - 1) * (bytes / N / b_rail + lat + kHops[tier] * hop);
  out.use_hierarchical = out.nodes > 1 && out.local > 1 && out.hierarchical < out.flat;
  return out;
}

MoeCommEstimate moe_comm_estimate(const ModelShape& m, const MoeShape& moe, const Cluster& c, int ep, int micro_batch,
                                  int micro_batches) {
  MoeCommEstimate e;
  if (moe.experts == 0 || ep <= 1) return e;
  e.bytes_per_all_to_all = moe_dispatch_bytes(m, moe, c.device, double(micro_batch) * m.seq);
  e.per_all_to_all = all_to_all_cost(c, ep, e.bytes_per_all_to_all);
  e.all_to_alls = 5 * m.layers * micro_batches;
  e.seconds = e.all_to_alls * e.per_all_to_all.best();
  return e;
}

ExpertSearch search_experts(const Job& job, const Cluster& cluster, const Estimate& e, const ExpertRequest& r) {
  ExpertSearch out;
  const Layout& l = e.layout;
  const double dense_states = e.memory.params + e.memory.grads + e.memory.optimizer;
  const double extra_act =
      l.offload ? 0
                : double(job.model.layers) * (moe_layer_activation_bytes(job.model, r.moe, cluster.device, l) -
                                              layer_activation_bytes(job.model, cluster.device, l));
  std::vector<int> degrees;
  if (r.pinned > 0) {
    if (r.moe.experts % r.pinned != 0 || l.dp % r.pinned != 0) {
      out.pinned_does_not_divide = true;
      return out;
    }
    degrees = {r.pinned};
  } else {
    for (int d = 1; d <= std::gcd(r.moe.experts, l.dp); ++d)
      if (r.moe.experts % d == 0 && l.dp % d == 0) degrees.push_back(d);
  }
  for (int ep : degrees) {
    const MoeStateBytes st = moe_state_bytes(job.model, r.moe, cluster.device, l.dp, ep, l.zero);
    // With offload the optimizer state lives in host memory (the dense estimate counts none of it on the device).
    const double states = st.params + st.grads + (l.offload ? 0 : st.optimizer);
    const double mem = e.memory.total() - dense_states + (l.offload ? e.memory.optimizer : 0) + states + extra_act;
    if (out.smallest_memory < 0 || mem < out.smallest_memory) out.smallest_memory = mem;
    if (mem > e.memory_capacity) continue;
    ExpertPlan p;
    p.expert = ep;
    p.memory_bytes = mem;
    const MoeCommEstimate c =
        moe_comm_estimate(job.model, r.moe, cluster, ep, l.micro_batch, std::max(1, e.micro_batches));
    if (ep > 1) {
      const double per = std::max(1, c.all_to_alls);
      p.flat_seconds = c.per_all_to_all.flat * per;
      p.hierarchical_seconds = c.per_all_to_all.hierarchical * per;
      p.all_to_all = !r.all_to_all.empty()                                         ? r.all_to_all
                     : c.per_all_to_all.use_hierarchical && r.hierarchical_allowed ? "hierarchical"
                                                                                   : "flat";
      p.all_to_all_seconds = p.all_to_all == "hierarchical" ? p.hierarchical_seconds : p.flat_seconds;
    }
    out.plan = p;
    return out;
  }
  return out;
}

}  // namespace railyard::plan
