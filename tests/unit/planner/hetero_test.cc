// Mixed GPU types: balanced batch split and speed-proportional pipeline cuts beat the even ones (Whale).
#include "planner/hetero.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "planner/calibration.h"

using namespace railyard::plan;

TEST_CASE("half the replicas twice as fast: the balanced batch split beats the even split") {
  const DeviceProfile slow = builtin_profile("a100");
  DeviceProfile fast = slow;  // twice the compute and memory bandwidth, same links
  fast.name = "a100x2";
  fast.peak_flops *= 2;
  fast.memory_bandwidth *= 2;
  Topology topo;
  topo.origin = "default";
  const Job job{ModelShape{"6.7b", 32, 4096, 32, 2048, 50257}, 256, 0};
  const Layout replica{1, 8, 1, 1, 1, Recompute::kFull};
  const std::vector<ReplicaGroup> groups = {{fast, 4}, {slow, 4}};
  const HeteroEstimate even = estimate_mixed_dp(job, topo, groups, replica, false);
  const HeteroEstimate balanced = estimate_mixed_dp(job, topo, groups, replica, true);
  CHECK(std::accumulate(even.micro_batches.begin(), even.micro_batches.end(), 0) == 256);
  CHECK(std::accumulate(balanced.micro_batches.begin(), balanced.micro_batches.end(), 0) == 256);
  CHECK(even.micro_batches[0] == 32);
  CHECK(balanced.micro_batches[0] > balanced.micro_batches[7]);  // fast replicas take more
  // Ideal gain for a 2:1 speed ratio over equal halves is 1.5x; the tensor-parallel all-reduces (same NVLink on both
  // types) do not speed up, so the fast replicas are about 1.6x, not 2x, as fast per micro-batch here.
  const double gain = even.step / balanced.step;
  MESSAGE("mixed 2x/1x replicas: even " << even.step << " s, balanced " << balanced.step << " s, gain " << gain);
  CHECK(gain > 1.15);
  CHECK(gain <= 1.5 + 1e-9);
  // The balanced split leaves the replicas finishing within one micro-batch of each other.
  const auto [lo, hi] = std::minmax_element(balanced.replica_seconds.begin(), balanced.replica_seconds.end());
  CHECK(*hi - *lo < *hi / balanced.micro_batches[7]);
  // Equal devices: balanced == even.
  const std::vector<ReplicaGroup> same = {{slow, 8}};
  CHECK(estimate_mixed_dp(job, topo, same, replica, true).step ==
        doctest::Approx(estimate_mixed_dp(job, topo, same, replica, false).step));
}

TEST_CASE("pipeline stages cut in proportion to speed, larger memory first") {
  // Device 0: slow with 80 GB; device 1: twice as fast with 40 GB.
  const StageCut even = cut_stages(24, {1, 2}, {80, 40}, false);
  const StageCut cut = cut_stages(24, {1, 2}, {80, 40}, true);
  CHECK(cut.device == std::vector<int>{0, 1});  // the 80 GB device takes the first stage
  CHECK(cut.layers == std::vector<int>{8, 16});
  CHECK(even.layers == std::vector<int>{12, 12});
  CHECK(cut.bottleneck == doctest::Approx(8));
  CHECK(even.bottleneck == doctest::Approx(12));
  // Uneven shares: 10 layers over speeds 1, 1, 3 -> 2, 2, 6; always at least one layer each, all layers placed.
  const StageCut odd = cut_stages(10, {3, 1, 1}, {40, 80, 80}, true);
  CHECK(odd.device == std::vector<int>{1, 2, 0});
  CHECK(odd.layers == std::vector<int>{2, 2, 6});
  const StageCut tiny = cut_stages(3, {100, 1, 1}, {1, 1, 1}, true);
  CHECK(tiny.layers == std::vector<int>{1, 1, 1});
  CHECK_THROWS_AS(cut_stages(2, {1, 1, 1}, {1, 1, 1}, true), railyard::ConfigError);
}

TEST_CASE(
    "mixed pipeline: the speed-proportional cut beats the even cut, the larger-memory GPUs take the early stages") {
  // GPT-3 13B (40 layers), pp 4 with two A100-80GB and two H200 stages per pipeline, tp 8, dp 4, micro-batch 1.
  const DeviceProfile a100 = builtin_profile("a100"), h200 = builtin_profile("h200");
  Topology topo;
  topo.origin = "default";
  const Job job{ModelShape{"13b", 40, 5120, 40, 2048, 50257}, 256, 0};
  Layout l;
  l.dp = 4, l.tp = 8, l.pp = 4, l.micro_batch = 1, l.zero = 1;
  const std::vector<DeviceProfile> stages = {a100, a100, h200, h200};  // as the nodes happen to be listed
  const MixedPipelineEstimate even = estimate_mixed_pipeline(job, topo, stages, l, false);
  const MixedPipelineEstimate balanced = estimate_mixed_pipeline(job, topo, stages, l, true);
  // Both cuts put the H200s (141 GB) first: the early stages hold min(m, p - k) micro-batches in flight.
  for (const auto* e : {&even, &balanced}) {
    CHECK(e->device[0] == h200.name);
    CHECK(e->device[1] == h200.name);
    CHECK(e->device[3] == a100.name);
    CHECK(std::accumulate(e->cut.layers.begin(), e->cut.layers.end(), 0) == 40);
    CHECK(e->fits);
    CHECK(e->stage_memory[0] > e->stage_memory[3] * 0.5);  // in-flight activations make stage 0 heavy
  }
  CHECK(even.cut.layers == std::vector<int>{10, 10, 10, 10});
  // The faster H200 stages take more layers, and the pipeline's slowest stage gets faster.
  CHECK(balanced.cut.layers[0] > balanced.cut.layers[3]);
  const double even_slowest = *std::max_element(even.stage_seconds.begin(), even.stage_seconds.end());
  const double bal_slowest = *std::max_element(balanced.stage_seconds.begin(), balanced.stage_seconds.end());
  CHECK(bal_slowest < even_slowest);
  const double gain = even.step / balanced.step;
  MESSAGE("mixed pipeline A100/H200: even " << even.step << " s, speed-proportional " << balanced.step << " s, layers "
                                            << balanced.cut.layers[0] << "/" << balanced.cut.layers[1] << "/"
                                            << balanced.cut.layers[2] << "/" << balanced.cut.layers[3] << ", gain "
                                            << gain);
  CHECK(gain > 1.2);
  // Homogeneous stages: the proportional cut is the even cut, and the step is the homogeneous 1F1B estimate's.
  const std::vector<DeviceProfile> same = {a100, a100, a100, a100};
  const MixedPipelineEstimate homo = estimate_mixed_pipeline(job, topo, same, l, true);
  CHECK(homo.cut.layers == std::vector<int>{10, 10, 10, 10});
  const Estimate ref = estimate(job, Cluster{a100, topo, 128}, l);
  CHECK(homo.step == doctest::Approx(ref.time.step).epsilon(0.02));
  CHECK_THROWS_AS(estimate_mixed_pipeline(job, topo, {a100}, l, true), railyard::ConfigError);
}
