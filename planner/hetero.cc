#include "planner/hetero.h"

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

MixedPipelineEstimate estimate_mixed_pipeline(const Job& job, const Topology& topology,
                                              const std::vector<DeviceProfile>& stage_devices, const Layout& layout,
                                              bool balanced) {
  const int p = static_cast<int>(stage_devices.size());
  if (p < 2) throw ConfigError("mixed pipeline: at least two stages");
  const ModelShape& m = job.model;
  const Layout& l = layout;
  if (l.interleave != 1 || l.zero >= 2) throw ConfigError("mixed pipeline: plain 1F1B with ZeRO 0 or 1 only");
  if (job.global_batch % (static_cast<long long>(l.dp) * l.micro_batch) != 0)
    throw ConfigError("mixed pipeline: the global batch is not divisible by dp x micro-batch");
  const long long mb = job.global_batch / (static_cast<long long>(l.dp) * l.micro_batch);
  // Per device: one layer's time and the embedding + head, from homogeneous one-stage estimates of 1 and 2 layers
  // (the model is linear in the layer count), and the per-micro-batch send/recv and the step's tail from the
  // homogeneous pipeline on that device.
  struct PerDevice {
    double layer = 0, ends = 0, send = 0, tail = 0, layer_params = 0;
  };
  auto per_device = [&](const DeviceProfile& d) {
    PerDevice out;
    Cluster one{d, topology, l.dp * l.tp};
    Layout flat = l;
    flat.pp = 1;
    auto micro_time = [&](int layers) {
      ModelShape s = m;
      s.layers = layers;
      const Estimate e = estimate(Job{s, static_cast<long long>(l.dp) * l.micro_batch, 0}, one, flat);
      return (e.time.compute + e.time.tp_comm) / e.micro_batches;
    };
    const double t1 = micro_time(1), t2 = micro_time(2);
    out.layer = t2 - t1;
    out.ends = t1 - out.layer;
    Cluster piped{d, topology, l.dp * l.tp * p};
    Layout homo = l;
    homo.pp = p;
    const Estimate e = estimate(job, piped, homo);
    out.send = e.time.pp_comm / e.micro_batches;
    out.tail = e.time.dp_exposed + e.time.optimizer;
    ModelShape one_layer = m, two_layers = m;
    one_layer.layers = 1;
    two_layers.layers = 2;
    out.layer_params = (parameter_count(two_layers) - parameter_count(one_layer)) / l.tp;
    return out;
  };
  std::vector<PerDevice> dev;
  std::vector<double> speeds, memories;
  for (const DeviceProfile& d : stage_devices) {
    dev.push_back(per_device(d));
    speeds.push_back(1.0 / dev.back().layer);
    memories.push_back(d.memory_bytes * d.usable_memory_fraction);
  }
  MixedPipelineEstimate out;
  out.cut = cut_stages(m.layers, speeds, memories, balanced);
  const double h = m.hidden, V = m.vocab;
  double sum = 0, slowest = 0, tail = 0;
  out.fits = true;
  for (int k = 0; k < p; ++k) {
    const int i = out.cut.device[k];
    const DeviceProfile& d = stage_devices[i];
    const double ends_share = (k == 0 || k == p - 1) ? 0.5 * dev[i].ends : 0;  // embedding first, head last
    const double t = out.cut.layers[k] * dev[i].layer + ends_share + dev[i].send;
    out.device.push_back(d.name);
    out.stage_seconds.push_back(t);
    sum += t;
    slowest = std::max(slowest, t);
    tail = std::max(tail, dev[i].tail);
    // Memory: parameters (+ the embedding on the first stage and its tied copy on the last), ZeRO-1 shards the
    // optimizer state over dp; activations of min(m, p - k) micro-batches in flight.
    double params = out.cut.layers[k] * dev[i].layer_params;
    if (k == 0) params += V * h / l.tp + double(m.seq) * h;
    if (k == p - 1) params += V * h / l.tp + 2 * h;
    const double in_flight = std::min<double>(mb, p - k);
    double bytes = params * (d.weight_bytes + d.grad_bytes + d.optimizer_bytes / (l.zero >= 1 ? l.dp : 1)) +
                   out.cut.layers[k] * layer_activation_bytes(m, d, l) * in_flight + d.workspace_bytes;
    if (k == p - 1) bytes += double(l.micro_batch) * m.seq * V / l.tp * (d.activation_bytes + 4);  // logits
    out.stage_memory.push_back(bytes);
    out.stage_capacity.push_back(d.memory_bytes * d.usable_memory_fraction);
    out.fits = out.fits && bytes <= out.stage_capacity.back();
  }
  out.step = sum + (mb - 1) * slowest + tail;
  return out;
}

}  // namespace railyard::plan
