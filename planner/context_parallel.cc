#include "planner/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "common/error.h"
#include "planner/search.h"

namespace railyard::plan {

namespace {

void check_cp(const ModelShape& m, int cp) {
  if (cp < 1 || m.seq % cp != 0) {
    throw ConfigError("context parallelism cp=" + std::to_string(cp) + " must be >= 1 and divide the sequence " +
                      std::to_string(m.seq));
  }
}

}  // namespace

double cp_activation_bytes(const Job& job, const Cluster& cluster, const Layout& layout, int cp) {
  check_cp(job.model, cp);
  if (cp == 1) return estimate(job, cluster, layout).memory.activations;
  Job local = job;
  local.model.seq = job.model.seq / cp;
  Cluster c = cluster;
  c.device.flash_attention = true;  // the ring keeps no probabilities
  const double base = estimate(local, c, layout).memory.activations;
  // one fp32 log-sum-exp per (sequence, local head, local position) per stored layer and micro-batch in flight
  const double per_layer_lse = 4.0 * layout.micro_batch * (double(job.model.heads) / layout.tp) * local.model.seq;
  const double layers = double(job.model.layers) / layout.pp;
  const long long m = job.global_batch / (static_cast<long long>(layout.dp) * layout.micro_batch);
  const double in_flight = layout.pp == 1 ? 1.0 : double(std::min<long long>(m, layout.pp));  // 1F1B, first stage
  return base + (layout.recompute == Recompute::kNone ? layers * per_layer_lse * in_flight : 0);
}

RingTime cp_ring_time(const ModelShape& m, const Cluster& cluster, const Layout& layout, int cp) {
  check_cp(m, cp);
  RingTime r;
  if (cp == 1) return r;
  const DeviceProfile& d = cluster.device;
  const double sl = double(m.seq) / cp, b = layout.micro_batch, ht = double(m.hidden) / layout.tp;
  r.bytes_per_hop = 2 * b * sl * ht * d.activation_bytes;
  const int gpn = cluster.topology.gpus_per_node > 0 ? cluster.topology.gpus_per_node : d.gpus_per_node;
  const bool in_node = static_cast<long long>(layout.tp) * cp <= gpn;
  const double bw = in_node ? d.nvlink_bandwidth * d.nvlink_efficiency : d.nic_bandwidth * d.nic_efficiency;
  const double lat = in_node ? d.collective_latency_s : d.collective_latency_s + d.hop_latency_s;
  const double hop = r.bytes_per_hop / bw + lat;
  r.forward = (cp - 1) * hop;
  r.backward = (cp - 1) * hop + cp * hop;
  // the attention core of one (sl x sl) block on the local heads: QK^T and AV, 4 b sl^2 ht FLOPs forward, twice
  // that backward; a hop overlaps one block (the causal diagonal block is half, ignored: an upper bound on hiding)
  const double block_fwd = 4 * b * sl * sl * ht / (d.peak_flops * d.attention_efficiency);
  r.forward_exposed = (cp - 1) * std::max(0.0, hop - block_fwd);
  r.backward_exposed = (cp - 1) * std::max(0.0, hop - 2 * block_fwd) + cp * hop;  // the gradient hop waits
  return r;
}

std::optional<ContextPlan> search_context(const Job& job, const Cluster& cluster, SearchOptions o) {
  o.offload = false;  // the worker does not offload with context parallelism
  o.sequence_parallel = false;
  for (int cp = 2; cp <= job.model.seq && cp <= cluster.gpus; ++cp) {
    if (job.model.seq % cp != 0 || cluster.gpus % cp != 0) continue;
    Job local = job;
    local.model.seq = job.model.seq / cp;
    Cluster c = cluster;
    c.gpus = cluster.gpus / cp;
    c.topology.nodes = 0;
    c.device.flash_attention = true;
    std::optional<ContextPlan> best;
    for (int zero = 0; zero <= 2; ++zero) {
      o.zero = zero;
      SearchResult r;
      try {
        r = search(local, c, o);
      } catch (const Error&) {
        continue;
      }
      for (const RankedPlan& rp : r.plans) {
        const Estimate& e = rp.estimate;
        Cluster real = cluster;
        real.gpus = c.gpus;
        real.topology.nodes = 0;
        const double mem = e.memory.total() - e.memory.activations + cp_activation_bytes(job, real, e.layout, cp);
        if (mem > e.memory_capacity) continue;
        const RingTime ring = cp_ring_time(job.model, cluster, e.layout, cp);
        const double ring_s = (ring.forward_exposed + ring.backward_exposed) *
                              (double(job.model.layers) / e.layout.pp) * std::max(1, e.micro_batches);
        if (best && best->estimate.time.step + best->ring_seconds <= e.time.step + ring_s) continue;
        ContextPlan p;
        p.estimate = e;
        p.estimate.memory.activations = mem - (e.memory.total() - e.memory.activations);
        p.context = cp;
        p.ring_seconds = ring_s;
        best = p;
      }
    }
    if (best) return best;
  }
  return std::nullopt;
}

}  // namespace railyard::plan
