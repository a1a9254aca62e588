// The planner's MoE terms (planner/moe_cost.h) against hand calculations with the h100 profile's numbers:
// NVLink 450e9 x 0.80 = 360 GB/s, NIC 50e9 x 0.90 = 45 GB/s, 8 us per message, 1 us per switch hop.
#include "planner/moe_cost.h"

#include <doctest/doctest.h>

#include "common/error.h"
#include "planner/calibration.h"

using namespace railyard::plan;

namespace {

Cluster h100(int gpus, double leaf_factor = 1) {
  Cluster c;
  c.device = builtin_profile("h100");
  c.gpus = gpus;
  c.topology.origin = "test";
  c.topology.gpus_per_node = 8;
  c.topology.leaf_bandwidth_factor = leaf_factor;
  return c;
}

}  // namespace

TEST_CASE("flat vs hierarchical all-to-all on the rail topology (hand calculation)") {
  REQUIRE(builtin_profile("h100").nvlink_bandwidth * builtin_profile("h100").nvlink_efficiency ==
          doctest::Approx(360e9));
  REQUIRE(builtin_profile("h100").nic_bandwidth * builtin_profile("h100").nic_efficiency == doctest::Approx(45e9));
  // 2 nodes x 8 GPUs, 16 MiB per rank (chunk 1 MiB). Flat: 7 NVLink chunks, 1 same-rail chunk (1 hop), 7 rail-changing
  // chunks (3 hops through the leaf): 7 (2^20/360e9 + 8e-6) + (2^20/45e9 + 9e-6) + 7 (2^20/45e9 + 11e-6) = 348.80 us.
  // Hierarchical: 7 (2 MiB/360e9 + 8e-6) + (8 MiB/45e9 + 9e-6) = 292.19 us: fewer, larger network messages win.
  AllToAllCost a = all_to_all_cost(h100(16), 16, 16.0 * (1 << 20));
  CHECK(a.nodes == 2);
  CHECK(a.local == 8);
  CHECK(a.tier == "unit");
  CHECK(a.flat == doctest::Approx(348.8025e-6).epsilon(1e-6));
  CHECK(a.hierarchical == doctest::Approx(292.1915e-6).epsilon(1e-6));
  CHECK(a.use_hierarchical);
  // 1 GiB per rank, full bisection: the network bytes are the same (1/2 GiB), the extra NVLink pass costs more than
  // the saved latency: flat 13.377 ms < hierarchical 14.605 ms, flat is kept.
  a = all_to_all_cost(h100(16), 16, 1073741824.0);
  CHECK(a.flat == doctest::Approx(13.37736e-3).epsilon(1e-5));
  CHECK(a.hierarchical == doctest::Approx(14.60525e-3).epsilon(1e-5));
  CHECK_FALSE(a.use_hierarchical);
  // The same with rail changes at half bandwidth (leaf factor 0.5, a 2:1 oversubscribed leaf): flat 23.817 ms, the
  // hierarchical scheme never changes rail and stays at 14.605 ms.
  a = all_to_all_cost(h100(16, 0.5), 16, 1073741824.0);
  CHECK(a.flat == doctest::Approx(23.81652e-3).epsilon(1e-5));
  CHECK(a.hierarchical == doctest::Approx(14.60525e-3).epsilon(1e-5));
  CHECK(a.use_hierarchical);
  // 8 nodes, 1 MiB per rank: 56 rail-changing messages per rank against 7: 678.7 us vs 141.9 us (4.8x).
  a = all_to_all_cost(h100(64), 64, 1048576.0);
  CHECK(a.flat == doctest::Approx(678.7076e-6).epsilon(1e-5));
  CHECK(a.hierarchical == doctest::Approx(141.9376e-6).epsilon(1e-5));
  // Inside one node the two coincide (no network phase): flat is kept.
  a = all_to_all_cost(h100(8), 4, 1048576.0);
  CHECK(a.nodes == 1);
  CHECK(a.flat == doctest::Approx(a.hierarchical));
  CHECK_FALSE(a.use_hierarchical);
  CHECK_THROWS_AS(all_to_all_cost(h100(16), 12, 1.0), railyard::ConfigError);
}

TEST_CASE("MoE parameters, per-GPU parameters under expert parallelism, dispatch bytes") {
  // L2 h8 s4 V10 dense: 2 * 872 + 80 + 32 + 16 = 1872 (cost_model_test). E=4: each layer's MLP (8*64 + 5*8 = 552)
  // three more times and a router of 4*8: 1872 + 2 * (3 * 552 + 32) = 5248.
  const ModelShape small{"small", 2, 8, 2, 4, 10};
  const MoeShape moe{4, 2, 1.25};
  CHECK(moe_parameter_count(small, MoeShape{}) == doctest::Approx(1872));
  CHECK(moe_parameter_count(small, moe) == doctest::Approx(5248));
  // ep=4: one expert per layer held: 5248 - 2 * 4 * 552 + 2 * 552 = 1936; ep=2: 3040.
  CHECK(moe_parameters_per_gpu(small, moe, 4) == doctest::Approx(1936));
  CHECK(moe_parameters_per_gpu(small, moe, 2) == doctest::Approx(3040));
  CHECK_THROWS_AS(moe_parameters_per_gpu(small, moe, 3), railyard::ConfigError);
  // 1024 tokens, E=4 top-2 F=1.25: capacity ceil(1.25 * 2 * 1024 / 4) = 640 rows per expert, 4 * 640 * 8 * 2 bytes.
  CHECK(moe_dispatch_bytes(small, moe, builtin_profile("h100"), 1024) == doctest::Approx(40960));
  // Per step: 5 all-to-alls per layer and micro-batch; with the 16-GPU group at 16 MiB the hierarchical time.
  const ModelShape big{"big", 4, 4096, 32, 2048, 50257};
  const MoeShape m8{8, 2, 1.0};
  // tokens 2048 (micro-batch 1), cap = 512, bytes = 8 * 512 * 4096 * 2 = 32 MiB
  const MoeCommEstimate e = moe_comm_estimate(big, m8, h100(16), 8, 1, 4);
  CHECK(e.bytes_per_all_to_all == doctest::Approx(32.0 * (1 << 20)));
  CHECK(e.all_to_alls == 5 * 4 * 4);
  CHECK(e.per_all_to_all.nodes == 1);  // ep 8 fits in one node: no network
  CHECK(e.seconds == doctest::Approx(80 * e.per_all_to_all.flat));
  const MoeCommEstimate e16 = moe_comm_estimate(big, MoeShape{16, 2, 1.0}, h100(16), 16, 1, 4);
  CHECK(e16.per_all_to_all.nodes == 2);
  CHECK(e16.seconds == doctest::Approx(80 * e16.per_all_to_all.best()));
}

TEST_CASE("MoE activation memory per layer and model states under expert parallelism (hand calculation)") {
  // L2 h8 a2 s4, micro-batch 2 (n = 8 tokens), no dropout, fp32 activations (the CPU worker's case), E=4 top-2 F=1:
  // cap = ceil(2 * 8 / 4) = 4, R = 16 rows. Dense: 2 * S * (8 + 24 + 2 a s / h) = 2 * 64 * 34 = 4352 bytes.
  // MoE: + 4 (8 * 8 * (16 - 8) + 16 * 8 + 8 * 4) = + 4 * 672 = 2688 -> 7040. In floats: the worker's MoE layer
  // 7NC + 4N + 8RC + NE + RC = 448 + 32 + 1024 + 32 + 128 = 1664 minus its dense 15NC + 4N = 992 is 672 too.
  ModelShape small{"small", 2, 8, 2, 4, 10};
  small.dropout = false;
  DeviceProfile d = builtin_profile("h100");
  d.activation_bytes = 4;
  d.flash_attention = false;
  Layout l;
  l.micro_batch = 2;
  const MoeShape moe{4, 2, 1.0};
  CHECK(layer_activation_bytes(small, d, l) == doctest::Approx(4352));
  CHECK(moe_layer_activation_bytes(small, moe, d, l) == doctest::Approx(7040));
  l.recompute = Recompute::kFull;
  CHECK(moe_layer_activation_bytes(small, moe, d, l) == doctest::Approx(layer_activation_bytes(small, d, l)));
  l.recompute = Recompute::kNone;
  l.tp = 2;
  CHECK_THROWS_AS(moe_layer_activation_bytes(small, moe, d, l), railyard::ConfigError);
  // States, h100 bytes per parameter (weights, grads, optimizer) = (2, 4, 12): dense part 5248 - 2*4*552 = 832,
  // experts 4416 / ep. dp 4, ep 2, ZeRO-1: experts 2208 over the 2 ranks holding them.
  const DeviceProfile h = builtin_profile("h100");
  REQUIRE(h.weight_bytes == 2);
  REQUIRE(h.grad_bytes == 4);
  REQUIRE(h.optimizer_bytes == 12);
  MoeStateBytes b = moe_state_bytes(small, moe, h, 4, 2, 1);
  CHECK(b.params == doctest::Approx((832 + 2208) * 2));
  CHECK(b.grads == doctest::Approx((832 + 2208) * 4));
  CHECK(b.optimizer == doctest::Approx(832 * 12 / 4.0 + 2208 * 12 / 2.0));
  b = moe_state_bytes(small, moe, h, 4, 4, 0);  // ep 4: one expert per layer, no ZeRO
  CHECK(b.total() == doctest::Approx((832 + 1104) * 18));
  CHECK_THROWS_AS(moe_state_bytes(small, moe, h, 4, 3, 0), railyard::ConfigError);
}

TEST_CASE("search_experts: the smallest degree dividing experts and dp that fits; a pinned one that does not divide") {
  // gpt2-124m-sized with 64 experts top-2 on 8 x h100, dp 8: a device's memory decides how far the experts split.
  const ModelShape m{"m", 12, 768, 12, 1024, 50257};
  Job job;
  job.model = m;
  job.global_batch = 64;
  Cluster c = h100(8);
  Layout l;
  l.dp = 8;
  l.micro_batch = 1;
  Estimate e = estimate(job, c, l);
  ExpertRequest r;
  r.moe = {64, 2, 1.25};
  ExpertSearch all = search_experts(job, c, e, r);
  REQUIRE(all.plan);
  CHECK(all.plan->expert == 1);  // 80 GB holds all 64 experts of a 124M model: no exchange needed
  CHECK(all.plan->all_to_all_seconds == 0);
  // A capacity between the degree-1 and the degree-8 footprint: the smallest degree that fits is chosen.
  const MoeStateBytes s1 = moe_state_bytes(m, r.moe, c.device, 8, 1, l.zero);
  const MoeStateBytes s8 = moe_state_bytes(m, r.moe, c.device, 8, 8, l.zero);
  const double need1 = all.plan->memory_bytes;
  const double need8 = need1 - (s1.params + s1.grads + s1.optimizer) + (s8.params + s8.grads + s8.optimizer);
  REQUIRE(need8 < need1);
  e.memory_capacity = (need1 + need8) / 2;
  ExpertSearch split = search_experts(job, c, e, r);
  REQUIRE(split.plan);
  CHECK(split.plan->expert > 1);
  CHECK(split.plan->memory_bytes <= e.memory_capacity);
  CHECK(64 % split.plan->expert == 0);
  CHECK(split.plan->all_to_all_seconds > 0);
  // Nothing fits: no plan, and the least any degree needed.
  e.memory_capacity = need8 / 2;
  ExpertSearch none = search_experts(job, c, e, r);
  CHECK_FALSE(none.plan);
  CHECK(none.smallest_memory == doctest::Approx(need8));
  // A pinned degree that does not divide the data-parallel degree is reported as such.
  r.pinned = 3;
  ExpertSearch pinned = search_experts(job, c, e, r);
  CHECK(pinned.pinned_does_not_divide);
  CHECK_FALSE(pinned.plan);
}
