#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.h"

namespace railyard::plan {

namespace {

// Tiers a ring or a point-to-point transfer runs on, with the switch hops one same-rail message takes.
enum Tier { kNode = 0, kUnit = 1, kLeaf = 2, kSpine = 3 };
constexpr const char* kTierNames[] = {"node", "unit", "leaf", "spine"};
constexpr double kTierHops[] = {0, 1, 3, 5};

// The tier that contains `count` consecutive nodes starting at `start`, the job packed from a unit boundary (what
// the rail-aware scheduler aims for).
Tier tier_of_block(long long start, long long count, const Topology& t) {
  if (count <= 1) return kNode;
  const long long last = start + count - 1;
  const long long unit = t.nodes_per_unit, leaf = unit * t.units_per_leaf;
  if (start / unit == last / unit) return kUnit;
  if (start / leaf == last / leaf) return kLeaf;
  return kSpine;
}

double tier_factor(Tier tier, const Topology& t) {
  if (tier == kLeaf) return t.leaf_bandwidth_factor;
  if (tier == kSpine) return t.spine_bandwidth_factor;
  return 1.0;
}

// A link: bus bandwidth (bytes/s) and latency per ring step.
struct Link {
  double bandwidth = 0;
  double latency = 0;
  Tier tier = kNode;
};

Link nvlink(const DeviceProfile& d) {
  return {d.nvlink_bandwidth * d.nvlink_efficiency, d.collective_latency_s, kNode};
}

Link rail(const DeviceProfile& d, const Topology& t, Tier tier) {
  if (tier == kNode) return nvlink(d);
  return {d.nic_bandwidth * d.nic_efficiency * tier_factor(tier, t),
          d.collective_latency_s + kTierHops[tier] * d.hop_latency_s, tier};
}

// Ring collectives on n members (nccl-tests' bus-bandwidth model).
double all_reduce(double bytes, int n, const Link& l) {
  if (n <= 1 || bytes <= 0) return 0;
  return 2.0 * (n - 1) / n * bytes / l.bandwidth + 2.0 * (n - 1) * l.latency;
}
double reduce_scatter(double bytes, int n, const Link& l) {  // also all-gather
  if (n <= 1 || bytes <= 0) return 0;
  return 1.0 * (n - 1) / n * bytes / l.bandwidth + 1.0 * (n - 1) * l.latency;
}

// One GEMM of M x N x K (batch of them): roofline of a size-dependent efficiency and the operands' traffic.
double gemm_time(const DeviceProfile& d, double M, double N, double K, double batch = 1) {
  const double flops = 2.0 * M * N * K * batch;
  const double eff = d.gemm_efficiency * flops / (flops + d.gemm_half_flops);
  const double compute = flops / (d.peak_flops * eff);
  const double bytes = d.activation_bytes * (M * K + K * N + M * N) * batch;
  const double memory = bytes / (d.memory_bandwidth * d.memory_efficiency);
  return std::max(compute, memory) + d.kernel_overhead_s;
}

double memory_time(const DeviceProfile& d, double bytes, int kernels) {
  return bytes / (d.memory_bandwidth * d.memory_efficiency) + kernels * d.kernel_overhead_s;
}

// Per-GPU times of one transformer layer for one micro-batch.
struct LayerTime {
  double forward = 0, backward = 0, recompute = 0;  // compute
  double tp_comm = 0;                               // incl. the recomputed forward's collectives
};

LayerTime layer_time(const ModelShape& m, const DeviceProfile& d, const Layout& l, const Link& tp_link) {
  const double b = l.micro_batch, s = m.seq, h = m.hidden, a = m.heads, t = l.tp;
  const double n = b * s;
  const double linear = gemm_time(d, n, 3 * h / t, h) + gemm_time(d, n, h, h / t) + gemm_time(d, n, 4 * h / t, h) +
                        gemm_time(d, n, h, 4 * h / t);
  // QK^T and AV over b*a/t heads: 2 * 2 * b * s^2 * h / t FLOPs forward.
  const double attention_flops = 4.0 * b * s * s * h / t;
  const double attention = attention_flops / (d.peak_flops * d.attention_efficiency) + 2 * d.kernel_overhead_s;
  // Scale, mask, softmax (read + write) and dropout (read, write, 1-byte mask) over the b*a/t*s*s scores.
  const double scores = b * (a / t) * s * s;
  const double softmax = d.flash_attention ? 0.0 : memory_time(d, scores * (4 * d.activation_bytes + 1), 2);
  // Two layernorms (read + write h), two bias+dropout+residual (read 2h, write h, mask), bias+GELU on 4h/t.
  const double token_h = l.sequence_parallel ? h / t : h;
  const double elementwise = memory_time(d, n * (d.activation_bytes * (10 * token_h + 8 * h / t) + 2 * token_h), 8);
  LayerTime r;
  r.forward = linear + attention + softmax + elementwise;
  // Backward: data and weight gradients (2x the GEMMs), the attention core twice (flash recomputes the scores in
  // its backward: 2.5x), elementwise passes twice.
  r.backward = 2 * linear + (d.flash_attention ? 2.5 : 2.0) * attention + 2 * softmax + 2 * elementwise;
  if (l.recompute == Recompute::kFull) r.recompute = r.forward;
  if (l.recompute == Recompute::kSelective && !d.flash_attention) r.recompute = attention + softmax;
  if (l.tp > 1) {
    // Two all-reduces forward and two backward (or, with sequence parallelism, the same volume as all-gather +
    // reduce-scatter pairs), of the b*s*h activations; the full recomputation repeats the forward's two.
    const double bytes = n * h * d.activation_bytes;
    const int count = 4 + (l.recompute == Recompute::kFull ? 2 : 0);
    r.tp_comm = count * all_reduce(bytes, l.tp, tp_link);
  }
  return r;
}

// Parameters of one layer held by one tensor-parallel rank: the four weight matrices and the column-parallel
// biases split t ways; the row-parallel biases and the layernorms replicated.
double layer_params_local(const ModelShape& m, int tp) {
  const double h = m.hidden;
  return 12 * h * h / tp + 7 * h / tp + 6 * h;
}

}  // namespace

std::string describe(const Layout& l) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "dp%d tp%d pp%d mb%d zero%d recompute=%s%s v%d%s", l.dp, l.tp, l.pp, l.micro_batch,
                l.zero, to_string(l.recompute), l.sequence_parallel ? " sp" : "", l.interleave,
                l.offload ? " offload" : "");
  return buf;
}

void validate(const ModelShape& m) {
  auto positive = [&](int v, const char* field) {
    if (v <= 0) throw ConfigError(std::string("model ") + field + " must be positive (got " + std::to_string(v) + ")");
  };
  positive(m.layers, "layers");
  positive(m.hidden, "hidden");
  positive(m.heads, "heads");
  positive(m.seq, "seq");
  positive(m.vocab, "vocab");
  if (m.hidden % m.heads != 0) {
    throw ConfigError("model hidden " + std::to_string(m.hidden) + " is not divisible by heads " +
                      std::to_string(m.heads) + ": pick heads that divide hidden");
  }
}

double parameter_count(const ModelShape& m) {
  const double L = m.layers, h = m.hidden;
  return L * (12 * h * h + 13 * h) + double(m.vocab) * h + double(m.seq) * h + 2 * h;
}

double model_flops_per_token(const ModelShape& m) {
  const double L = m.layers, h = m.hidden, s = m.seq, V = m.vocab;
  return 72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
}

double offload_update_seconds(const DeviceProfile& d, double params) {
  if (d.host_link_bandwidth <= 0 || d.host_memory_bandwidth <= 0) {
    throw ConfigError("device profile " + d.origin +
                      ": host_link_bandwidth and host_memory_bandwidth must be positive to plan optimizer offload");
  }
  const double copies = params * (d.grad_bytes + d.weight_bytes) / d.host_link_bandwidth;
  return copies + params * d.optimizer_step_bytes / d.host_memory_bandwidth;
}

double offload_exposed_seconds(double update, double first_share, double forward) {
  const double first = update * first_share;
  return first + std::max(0.0, update - first - forward);
}

double bubble_fraction(int pp, int micro_batches, int interleave) {
  if (pp <= 1) return 0;
  const double idle = double(pp - 1) / interleave;
  return idle / (micro_batches + idle);
}

double layer_activation_bytes(const ModelShape& m, const DeviceProfile& d, const Layout& l) {
  // Korthikanti et al. 2022, bytes per layer at 2-byte activations and 1-byte dropout masks, scaled to this
  // device's activation width.
  // Without dropout the two 1-byte masks of the residual branches (2 of the 10 replicated bytes) and the scores'
  // mask and dropped copy (3 of the 5 a s / h) are not stored.
  const double S = double(m.seq) * l.micro_batch * m.hidden, t = l.tp;
  const double scores = d.flash_attention ? 0.0 : (m.dropout ? 5.0 : 2.0) * m.heads * m.seq / m.hidden;
  const double replicated = m.dropout ? 10 : 8;
  const double scale = d.activation_bytes / 2.0;
  switch (l.recompute) {
    case Recompute::kFull:
      return scale * 2 * S / (l.sequence_parallel ? t : 1);
    case Recompute::kSelective:
      return scale * S * (l.sequence_parallel ? (replicated + 24) / t : replicated + 24 / t);
    case Recompute::kNone:
      break;
  }
  return scale * S * (l.sequence_parallel ? (replicated + 24 + scores) / t : replicated + 24 / t + scores / t);
}

std::string check_layout(const Job& job, const Cluster& c, const Layout& l) {
  const ModelShape& m = job.model;
  auto str = [](auto v) { return std::to_string(v); };
  if (l.dp < 1 || l.tp < 1 || l.pp < 1) return "dp, tp and pp must be at least 1";
  if (l.micro_batch < 1) return "micro-batch must be at least 1";
  if (l.interleave < 1) return "interleave must be at least 1";
  if (l.zero < 0 || l.zero > 3) return "ZeRO stage " + str(l.zero) + " is not 0, 1, 2 or 3";
  if (static_cast<long long>(l.dp) * l.tp * l.pp != c.gpus) {
    return "dp*tp*pp = " + str(static_cast<long long>(l.dp) * l.tp * l.pp) + " but the cluster has " + str(c.gpus) +
           " GPUs";
  }
  if (m.heads % l.tp != 0) return "tp " + str(l.tp) + " does not divide the " + str(m.heads) + " attention heads";
  const int gpn = c.topology.gpus_per_node;
  if (l.tp > gpn || gpn % l.tp != 0) {
    return "tp " + str(l.tp) + " does not fit a node of " + str(gpn) + " GPUs (tensor parallelism stays on NVLink)";
  }
  // Stages may be uneven (the slowest, with ceil(L/(p v)) layers per chunk, sets the pace).
  if (static_cast<long long>(l.pp) * l.interleave > m.layers) {
    return "pp " + str(l.pp) + (l.interleave > 1 ? " x interleave " + str(l.interleave) : "") + " exceeds the " +
           str(m.layers) + " layers";
  }
  if (job.global_batch % (static_cast<long long>(l.dp) * l.micro_batch) != 0) {
    return "global batch " + str(job.global_batch) +
           " is not divisible by dp*micro-batch = " + str(static_cast<long long>(l.dp) * l.micro_batch);
  }
  const long long micro_batches = job.global_batch / (static_cast<long long>(l.dp) * l.micro_batch);
  if (l.zero >= 2 && l.pp > 1) {
    return "ZeRO-" + str(l.zero) +
           " shards the gradients that pipeline micro-batches accumulate: use zero <= 1 with pp > 1";
  }
  if (l.sequence_parallel && l.tp == 1) return "sequence parallelism needs tp > 1";
  if (l.offload && (l.zero > 0 || l.tp > 1 || l.pp > 1)) {
    return "optimizer offload runs with zero 0, tp 1 and pp 1 (the worker offloads the plain and data-parallel model)";
  }
  if (l.interleave > 1 && l.pp == 1) return "interleaving needs pp > 1";
  if (l.interleave > 1 && micro_batches % l.pp != 0) {
    return "the interleaved schedule needs the " + str(micro_batches) + " micro-batches to be a multiple of pp " +
           str(l.pp);
  }
  const long long nodes_needed = (c.gpus + gpn - 1) / gpn;
  if (c.topology.nodes > 0 && nodes_needed > c.topology.nodes) {
    return str(c.gpus) + " GPUs need " + str(nodes_needed) + " nodes of " + str(gpn) + " but the topology (" +
           c.topology.origin + ") has " + str(c.topology.nodes);
  }
  return "";
}

Estimate estimate(const Job& job, const Cluster& c, const Layout& l) { return estimate(job, c, l, PlacedTiers{}); }

namespace {

// The tiers the data-parallel and the pipeline rings run on.
struct RingTiers {
  Tier dp = kNode, pp = kNode;
};

// Placement: tensor ranks fastest, then data, then pipeline (rank = (pp_rank*dp + dp_rank)*tp + tp_rank), packed
// from a unit boundary. A stage is dp*tp GPUs. `placed` (the scheduler's actual placement) overrides each tier.
RingTiers ring_tiers(const Layout& l, const Topology& topo, const PlacedTiers& placed) {
  const int gpn = topo.gpus_per_node;
  const long long stage_gpus = static_cast<long long>(l.dp) * l.tp;
  const long long stage_nodes = (stage_gpus + gpn - 1) / gpn;
  RingTiers r;
  if (stage_gpus > gpn) {
    for (int k = 0; k < l.pp; ++k) r.dp = std::max(r.dp, tier_of_block(k * stage_nodes, stage_nodes, topo));
  }
  if (l.pp > 1 && 2 * stage_gpus > gpn) {
    for (int k = 0; k + 1 < l.pp; ++k) {
      r.pp = std::max(r.pp, tier_of_block(k * stage_nodes, std::max<long long>(2, 2 * stage_nodes), topo));
    }
  }
  if (placed.dp >= 0) r.dp = static_cast<Tier>(std::min<int>(placed.dp, kSpine));
  if (placed.pp >= 0) r.pp = static_cast<Tier>(std::min<int>(placed.pp, kSpine));
  return r;
}

// The bottleneck stage, per micro-batch: what the time, parameter and memory steps share.
struct Stage {
  double layers = 0;  // v chunks of ceil(L/(p v)) layers
  LayerTime lt;
  double n = 0, h = 0, V = 0, t = 0;  // tokens per micro-batch, hidden size, vocabulary, tensor degree
  double head = 0, embed = 0;         // LM head + loss (last stage), embedding (first stage)
};

Stage stage_of(const ModelShape& m, const DeviceProfile& d, const Layout& l, const Link& tp_link) {
  Stage st;
  // The bottleneck stage's layers: v chunks of ceil(L/(p v)) (chunks differ by at most one layer).
  const int chunks = l.pp * l.interleave;
  st.layers = double(l.interleave) * ((m.layers + chunks - 1) / chunks);
  st.lt = layer_time(m, d, l, tp_link);
  st.n = double(l.micro_batch) * m.seq;
  st.h = m.hidden;
  st.V = m.vocab;
  st.t = l.tp;
  const double n = st.n, h = st.h, V = st.V, t = st.t;
  st.head = 3 * gemm_time(d, n, V / t, h) + memory_time(d, n * V / t * 4 * 4, 4);
  st.embed = memory_time(d, 3 * n * h * d.activation_bytes, 2);
  return st;
}

// Compute per micro-batch of the first and the last stage (embedding on the first, LM head + loss on the last),
// their collectives and the bubble: e.time's compute, tp_comm, pp_comm and bubble, and e.bubble_fraction. Returns
// the pipeline's time per step.
double pipeline_time(Estimate& e, const Stage& st, const Layout& l, const DeviceProfile& d, const Link& pp_link,
                     long long mb) {
  const double n = st.n, h = st.h, t = st.t;
  const double layers_compute = st.layers * (st.lt.forward + st.lt.backward + st.lt.recompute);
  const double first = layers_compute + st.embed + (l.pp == 1 ? st.head : 0);
  const double last = layers_compute + st.head;
  const double stage_compute = std::max(first, last);
  const double stage_tp = st.layers * st.lt.tp_comm;
  // Send activations forward, gradients backward; Megatron's scatter-gather sends 1/t of them per tensor rank.
  double stage_pp = 0;
  if (l.pp > 1) {
    const double bytes = n * h * d.activation_bytes / t;
    stage_pp = 2.0 * l.interleave * (bytes / pp_link.bandwidth + pp_link.latency);
  }
  const double per_micro_batch = stage_compute + stage_tp + stage_pp;
  e.time.compute = mb * stage_compute;
  e.time.tp_comm = mb * stage_tp;
  e.time.pp_comm = mb * stage_pp;
  e.time.bubble = l.pp > 1 ? double(l.pp - 1) / l.interleave * per_micro_batch : 0;
  const double pipeline = mb * per_micro_batch + e.time.bubble;
  e.bubble_fraction = pipeline > 0 ? e.time.bubble / pipeline : 0;
  return pipeline;
}

// Parameters per GPU of the first and last stages, and of this GPU (the larger).
struct StageParams {
  double first = 0, last = 0, local = 0;
};

// The last stage holds the tied LM head's copy of the embedding.
StageParams stage_params(const ModelShape& m, const Layout& l, const Stage& st) {
  const double h = st.h, V = st.V, t = st.t;
  const double layer_local = st.layers * layer_params_local(m, l.tp);
  StageParams p;
  p.first = layer_local + V * h / t + double(m.seq) * h + (l.pp == 1 ? 2 * h : 0);
  p.last = layer_local + V * h / t + 2 * h;
  p.local = l.pp == 1 ? p.first : std::max(p.first, p.last);
  return p;
}

// Data-parallel reduction of this GPU's gradients (ring on the dp group's tier): e.time's dp_comm and dp_exposed.
void dp_time(Estimate& e, const DeviceProfile& d, const Layout& l, const Link& dp_link, const Stage& st,
             double local_params, long long mb) {
  const double grad_bytes = local_params * d.grad_bytes, weight_bytes = local_params * d.weight_bytes;
  double reduce = 0, gather = 0;
  if (l.zero == 0) {
    reduce = all_reduce(grad_bytes, l.dp, dp_link);
  } else {
    reduce = reduce_scatter(grad_bytes, l.dp, dp_link);
    gather = reduce_scatter(weight_bytes, l.dp, dp_link);  // all-gather of the updated weights
    if (l.zero == 3) gather = 2.0 * mb * gather;           // weights gathered for every forward and backward
  }
  e.time.dp_comm = reduce + gather;
  const double window = d.overlap_dp ? st.lt.backward * st.layers : 0;
  e.time.dp_exposed = std::max(0.0, reduce - window) + gather;
}

// The optimizer step's exposed time (e.time.optimizer) and, offloaded, its host update (e.time.offload).
void optimizer_time(Estimate& e, const ModelShape& m, const DeviceProfile& d, const Layout& l, const Stage& st,
                    double local_params) {
  const double h = st.h, V = st.V;
  const double optimizer_params = local_params / (l.zero >= 1 ? l.dp : 1);
  e.time.optimizer = memory_time(d, optimizer_params * d.optimizer_step_bytes, 4);
  if (l.offload) {
    // The update of step k runs on the host while step k+1's first forward reads the groups it has finished.
    e.time.offload = offload_update_seconds(d, optimizer_params);
    const double embedding_share = (V * h + double(m.seq) * h) / local_params;
    const double forward = st.layers * st.lt.forward + st.embed;
    e.time.optimizer = offload_exposed_seconds(e.time.offload, embedding_share, forward);
  }
}

// Activation bytes of the first stage (most micro-batches in flight) and the last (LM head logits).
struct StageActivations {
  double first = 0, last = 0;
};

StageActivations stage_activations(const ModelShape& m, const DeviceProfile& d, const Layout& l, const Stage& st,
                                   long long mb) {
  const double n = st.n, h = st.h, V = st.V, t = st.t;
  const double layer_act = layer_activation_bytes(m, d, l);
  const double in_flight = l.pp == 1 ? 1.0
                           : l.interleave == 1
                               ? std::min<double>(mb, l.pp)
                               : std::min<double>(mb * l.interleave, l.pp + double(l.pp - 1) / l.interleave);
  // The layer being recomputed holds its full activations during its backward.
  Layout no_recompute = l;
  no_recompute.recompute = Recompute::kNone;
  const double working = l.recompute == Recompute::kFull ? layer_activation_bytes(m, d, no_recompute) : 0;
  const double embed_act = n * h * d.activation_bytes / (l.sequence_parallel ? t : 1);
  // Narrow (16-bit) logits get an fp32 copy for the loss; fp32 logits are used as they are.
  const double logits = n * V / t * (d.activation_bytes + (d.activation_bytes < 4 ? 4 : 0));
  StageActivations a;
  a.first = st.layers * layer_act * in_flight + working + in_flight * embed_act + (l.pp == 1 ? logits : 0);
  a.last = st.layers * layer_act + working + logits;
  return a;
}

// A stage's memory: weights, gradients and optimizer state, sharded by ZeRO from the stage that shards each.
MemoryBreakdown memory_of(const DeviceProfile& d, const Layout& l, double params, double act) {
  auto sharded = [&](double per_param, int from_stage) { return per_param / (l.zero >= from_stage ? l.dp : 1); };
  MemoryBreakdown mem;
  mem.params = sharded(params * d.weight_bytes, 3);
  mem.grads = sharded(params * d.grad_bytes, 2);
  mem.optimizer = sharded(params * d.optimizer_bytes, 1);
  if (l.offload) {
    // The state moves to the host, with a gradient copy to update from (zero 0 only: nothing is sharded).
    mem.host = mem.optimizer + params * d.grad_bytes;
    mem.optimizer = 0;
  }
  mem.activations = act;
  mem.workspace = d.workspace_bytes;
  return mem;
}

// Tokens per second, model and hardware FLOP/s per GPU, MFU and days to the token budget.
void throughput(Estimate& e, const Job& job, const Cluster& c, const Layout& l) {
  const ModelShape& m = job.model;
  const DeviceProfile& d = c.device;
  const double h = m.hidden;
  const double tokens_per_step = double(job.global_batch) * m.seq;
  e.tokens_per_s = tokens_per_step / e.time.step;
  const double model_flops = model_flops_per_token(m);
  double extra = 0;  // recomputation, per token
  if (l.recompute == Recompute::kFull) extra = m.layers * (24 * h * h + 4.0 * m.seq * h);
  if (l.recompute == Recompute::kSelective) extra = m.layers * 4.0 * m.seq * h;
  e.model_flops_per_gpu = model_flops * e.tokens_per_s / c.gpus;
  e.hardware_flops_per_gpu = (model_flops + extra) * e.tokens_per_s / c.gpus;
  e.mfu = e.model_flops_per_gpu / d.peak_flops;
  e.days = job.tokens > 0 ? job.tokens / e.tokens_per_s / 86400.0 : 0;
}

}  // namespace

Estimate estimate(const Job& job, const Cluster& c, const Layout& l, const PlacedTiers& placed) {
  const std::string why = check_layout(job, c, l);
  if (!why.empty()) throw ConfigError("layout " + describe(l) + ": " + why);
  const ModelShape& m = job.model;
  const DeviceProfile& d = c.device;
  const Topology& topo = c.topology;
  Estimate e;
  e.layout = l;
  const long long mb = job.global_batch / (static_cast<long long>(l.dp) * l.micro_batch);
  e.micro_batches = static_cast<int>(mb);
  e.params_total = parameter_count(m);

  const RingTiers tiers = ring_tiers(l, topo, placed);
  e.dp_tier = l.dp == 1 ? "none" : kTierNames[tiers.dp];
  const Link tp_link = nvlink(d), dp_link = rail(d, topo, tiers.dp), pp_link = rail(d, topo, tiers.pp);

  const Stage st = stage_of(m, d, l, tp_link);
  const double pipeline = pipeline_time(e, st, l, d, pp_link, mb);
  const StageParams params = stage_params(m, l, st);
  e.params_per_gpu = params.local;
  dp_time(e, d, l, dp_link, st, params.local, mb);
  optimizer_time(e, m, d, l, st, params.local);
  e.time.step = pipeline + e.time.dp_exposed + e.time.optimizer;

  // Memory of the first stage and the last; keep the larger.
  const StageActivations act = stage_activations(m, d, l, st, mb);
  const MemoryBreakdown mf = memory_of(d, l, params.first, act.first);
  const MemoryBreakdown ml = memory_of(d, l, params.last, act.last);
  e.memory = (l.pp == 1 || mf.total() >= ml.total()) ? mf : ml;
  e.memory_capacity = d.memory_bytes * d.usable_memory_fraction;
  e.fits = e.memory.total() <= e.memory_capacity;

  throughput(e, job, c, l);
  return e;
}

}  // namespace railyard::plan
