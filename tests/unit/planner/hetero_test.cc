// Mixed GPU types: balanced batch split and speed-proportional pipeline cuts beat the even ones (Whale).
#include "operator/planner/hetero.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "operator/planner/calibration.h"

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
