#include "operator/planner/hetero.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"

namespace railyard::plan {

HeteroEstimate estimate_mixed_dp(const Job& job, const Topology& topology, const std::vector<ReplicaGroup>& groups,
                                 const Layout& replica_layout, bool balanced) {
  if (groups.empty()) throw ConfigError("mixed cluster: no device groups");
  const int mb = replica_layout.micro_batch;
  if (job.global_batch % mb != 0) {
    throw ConfigError("global batch " + std::to_string(job.global_batch) + " is not divisible by micro-batch " +
                      std::to_string(mb));
  }
  const long long total_mb = job.global_batch / mb;
  // Per replica: the time of one micro-batch, the pipeline fill/drain in micro-batch times, and the per-step tail
  // (exposed gradient reduction + optimizer), from a one-micro-batch estimate of its group.
  struct Replica {
    double per_mb = 0, fill = 0, tail = 0;
    int assigned = 0;
  };
  std::vector<Replica> replicas;
  for (const ReplicaGroup& g : groups) {
    if (g.replicas <= 0) throw ConfigError("mixed cluster: group " + g.device.name + " has no replicas");
    Cluster c{g.device, topology, g.replicas * replica_layout.tp * replica_layout.pp};
    Layout l = replica_layout;
    l.dp = g.replicas;
    const Estimate e = estimate(Job{job.model, static_cast<long long>(g.replicas) * mb * l.pp, 0}, c, l);
    Replica r;
    r.per_mb = (e.time.compute + e.time.tp_comm + e.time.pp_comm) / e.micro_batches;
    r.fill = double(l.pp - 1) / l.interleave;
    r.tail = e.time.dp_exposed + e.time.optimizer;
    for (int i = 0; i < g.replicas; ++i) replicas.push_back(r);
  }
  const long long n = static_cast<long long>(replicas.size());
  if (total_mb < n) throw ConfigError("global batch too small: fewer micro-batches than data-parallel replicas");
  auto finish = [](const Replica& r, int m) { return (m + r.fill) * r.per_mb + r.tail; };
  if (!balanced) {
    if (total_mb % n != 0) {
      throw ConfigError("the even split needs the " + std::to_string(total_mb) + " micro-batches to divide over " +
                        std::to_string(n) + " replicas");
    }
    for (auto& r : replicas) r.assigned = static_cast<int>(total_mb / n);
  } else {
    // Water filling: every replica gets one, then each next micro-batch goes to the replica that finishes it first
    // (ties to the lower index: deterministic).
    for (auto& r : replicas) r.assigned = 1;
    for (long long k = n; k < total_mb; ++k) {
      size_t best = 0;
      for (size_t i = 1; i < replicas.size(); ++i) {
        if (finish(replicas[i], replicas[i].assigned + 1) < finish(replicas[best], replicas[best].assigned + 1))
          best = i;
      }
      ++replicas[best].assigned;
    }
  }
  HeteroEstimate out;
  for (const auto& r : replicas) {
    out.micro_batches.push_back(r.assigned);
    out.replica_seconds.push_back(finish(r, r.assigned));
    out.step = std::max(out.step, out.replica_seconds.back());
  }
  return out;
}

StageCut cut_stages(int layers, const std::vector<double>& speeds, const std::vector<double>& memories, bool balanced) {
  const size_t p = speeds.size();
  if (p == 0 || memories.size() != p) throw ConfigError("cut_stages: one speed and one memory per stage");
  if (layers < static_cast<int>(p)) throw ConfigError("cut_stages: fewer layers than stages");
  StageCut cut;
  cut.device.resize(p);
  std::iota(cut.device.begin(), cut.device.end(), 0);
  // Larger memory first; equal memory keeps the given order.
  std::stable_sort(cut.device.begin(), cut.device.end(), [&](int a, int b) { return memories[a] > memories[b]; });
  cut.layers.assign(p, 0);
  if (!balanced) {
    for (size_t k = 0; k < p; ++k) cut.layers[k] = layers / static_cast<int>(p) + (k < layers % p ? 1 : 0);
  } else {
    const double total_speed = std::accumulate(speeds.begin(), speeds.end(), 0.0);
    std::vector<double> share(p);
    int given = 0;
    for (size_t k = 0; k < p; ++k) {
      share[k] = layers * speeds[cut.device[k]] / total_speed;
      cut.layers[k] = std::max(1, static_cast<int>(share[k]));
      given += cut.layers[k];
    }
    // Largest remainders get the layers left over (or give back the excess from the smallest).
    std::vector<size_t> order(p);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return share[a] - cut.layers[a] > share[b] - cut.layers[b]; });
    for (size_t i = 0; given < layers; i = (i + 1) % p, ++given) ++cut.layers[order[i]];
    for (size_t i = p; given > layers; --given) {
      do i = (i == 0 ? p : i) - 1;
      while (cut.layers[order[i]] <= 1);
      --cut.layers[order[i]];
    }
  }
  for (size_t k = 0; k < p; ++k) cut.bottleneck = std::max(cut.bottleneck, cut.layers[k] / speeds[cut.device[k]]);
  return cut;
}

}  // namespace railyard::plan
