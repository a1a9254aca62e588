// The plan search (fit, order, determinism, speed) and the calibration/topology files.
#include "planner/search.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "tests/ctest_env.h"

using namespace railyard::plan;

namespace {

Cluster cluster_of(const std::string& gpu, int gpus) {
  Cluster c;
  c.device = builtin_profile(gpu);
  c.gpus = gpus;
  c.topology.origin = "default";
  c.topology.gpus_per_node = c.device.gpus_per_node;
  return c;
}

const Job kGpt3{ModelShape{"gpt3-175b", 96, 12288, 96, 2048, 50257}, 1536, 300e9};

}  // namespace

TEST_CASE("the search returns only layouts that fit, best first, with why the others lost") {
  SearchOptions o;
  o.top = 1000;
  o.distinct_shapes = false;
  const Cluster c = cluster_of("a100", 128);  // tight for 175B: most layouts do not fit
  const SearchResult r = search(kGpt3, c, o);
  REQUIRE(!r.plans.empty());
  CHECK(r.rejected_memory > 0);
  for (size_t i = 0; i < r.plans.size(); ++i) {
    const Estimate& e = r.plans[i].estimate;
    CHECK(e.fits);
    CHECK(e.memory.total() <= e.memory_capacity);
    CHECK(check_layout(kGpt3, c, e.layout) == "");
    if (i > 0) {
      CHECK(r.plans[i - 1].estimate.time.step <= e.time.step);
      CHECK(!r.plans[i].why.empty());
    }
  }
  CHECK(r.plans[0].why.empty());
  // Nothing fits on 8 GPUs: no plan, and the closest layout is reported with what it needs.
  const SearchResult none = search(kGpt3, cluster_of("a100", 8));
  CHECK(none.plans.empty());
  REQUIRE(none.smallest_nonfitting.has_value());
  CHECK(none.smallest_nonfitting->memory.total() > none.smallest_nonfitting->memory_capacity);
}

TEST_CASE("the search is deterministic") {
  const Cluster c = cluster_of("h100", 256);
  const SearchResult a = search(kGpt3, c), b = search(kGpt3, c);
  REQUIRE(a.plans.size() == b.plans.size());
  REQUIRE(a.plans.size() == 5);
  for (size_t i = 0; i < a.plans.size(); ++i) {
    CHECK(describe(a.plans[i].estimate.layout) == describe(b.plans[i].estimate.layout));
    CHECK(a.plans[i].estimate.time.step == b.plans[i].estimate.time.step);
    CHECK(a.plans[i].why == b.plans[i].why);
  }
  CHECK(a.evaluated == b.evaluated);
}

TEST_CASE("search over 4,096 GPUs finishes in under one second") {
  const auto t0 = std::chrono::steady_clock::now();
  const SearchResult r = search(kGpt3, cluster_of("h100", 4096));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("4096-GPU search: " << r.evaluated << " layouts estimated in " << s << " s");
  CHECK(!r.plans.empty());
  CHECK(r.evaluated > 1000);
  CHECK(s < 1.0);
}

TEST_CASE("pinned choices are honoured and a small model on one device gets the trivial plan") {
  SearchOptions o;
  o.tp = 4;
  o.zero = 1;
  const SearchResult r = search(kGpt3, cluster_of("h200", 512), o);
  REQUIRE(!r.plans.empty());
  for (const auto& p : r.plans) {
    CHECK(p.estimate.layout.tp == 4);
    CHECK(p.estimate.layout.zero == 1);
  }
  const Job tiny{ModelShape{"tiny", 4, 128, 4, 256, 256}, 8, 0};
  const SearchResult one = search(tiny, cluster_of("cpu", 1));
  REQUIRE(!one.plans.empty());
  const Layout& l = one.plans[0].estimate.layout;
  CHECK((l.dp == 1 && l.tp == 1 && l.pp == 1));
}

TEST_CASE("built-in calibration files load and state a source for every number") {
  for (const std::string& name : builtin_profile_names()) {
    const DeviceProfile p = builtin_profile(name);
    CHECK(p.peak_flops > 0);
    CHECK(p.sources.size() == 26);
    for (const auto& [key, source] : p.sources) {
      INFO(name << "." << key << ": " << source);
      const bool known = source.rfind("vendor datasheet value", 0) == 0 || source.rfind("assumed", 0) == 0 ||
                         source.rfind("measured", 0) == 0 || source.rfind("definition", 0) == 0;
      CHECK(known);
    }
  }
  CHECK(builtin_profile("A100").name == "a100-80gb");
  CHECK(builtin_profile("h100").peak_flops == doctest::Approx(989e12));
  CHECK_THROWS_WITH_AS(builtin_profile("v100"), doctest::Contains("unknown GPU type 'v100'"), railyard::ConfigError);
  // A written profile reads back the same.
  const DeviceProfile h200 = builtin_profile("h200");
  const DeviceProfile again = parse_profile(profile_to_yaml(h200, "test"), "roundtrip");
  CHECK(again.memory_bytes == doctest::Approx(h200.memory_bytes));
  CHECK(again.flash_attention == h200.flash_attention);
  CHECK(again.sources.at("memory_bytes") == h200.sources.at("memory_bytes"));
}

TEST_CASE("bad calibration and topology files get one error naming the file and the field") {
  const std::string good = profile_to_yaml(builtin_profile("a100"), "x");
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  CHECK_THROWS_WITH_AS(parse_profile(replace(good, "peak_flops:", "peak_flopz:"), "p.yaml"),
                       doctest::Contains("p.yaml: missing field 'peak_flops'"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_profile(replace(good, "{value: 0.8,", "{value: 1.8,"), "p.yaml"),
                       doctest::Contains("gemm_efficiency.value is a fraction"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_profile(good + "extra: {value: 1, source: assumed}\n", "p.yaml"),
                       doctest::Contains("unknown field 'extra'"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_profile("name: [", "p.yaml"), doctest::Contains("p.yaml: not valid YAML"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(load_profile("/nonexistent/p.yaml"), doctest::Contains("/nonexistent/p.yaml"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_topology("gpusPerNode: 8\nnodesPerUnit: 0\n", "t.yaml"),
                       doctest::Contains("t.yaml: nodesPerUnit must be positive"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_topology("gpusPerNode: 8\nnodesPerUnit: 2\nrails: 8\n", "t.yaml"),
                       doctest::Contains("unknown key 'rails'"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_topology("gpusPerNode: 8\n", "t.yaml"), doctest::Contains("missing 'nodesPerUnit'"),
                       railyard::ConfigError);
}

TEST_CASE("the local cluster's topology files parse, and the planner places on them") {
  const Topology t = load_topology(railyard::test::source_path("deploy/local/topologies/a100-16node-2spine.yaml"));
  CHECK(t.gpu_type == "A100");
  CHECK(t.gpus_per_node == 8);
  CHECK(t.nodes == 16);
  CHECK(t.nodes_per_unit == 4);
  const Topology mixed = load_topology(railyard::test::source_path("deploy/local/topologies/mixed-small-6of8.yaml"));
  CHECK(mixed.nodes == 6);
  Cluster c;
  c.device = builtin_profile(t.gpu_type);
  c.topology = t;
  c.gpus = 128;
  // A 2-node data-parallel ring per stage stays in a unit; 16 nodes cross the spine (4 units, 1 unit per leaf).
  const Job job{ModelShape{"m", 32, 4096, 32, 2048, 51200}, 512, 0};
  CHECK(estimate(job, c, Layout{2, 8, 8, 1, 1, Recompute::kFull}).dp_tier == "unit");
  CHECK(estimate(job, c, Layout{16, 8, 1, 1, 1, Recompute::kFull}).dp_tier == "spine");
  c.gpus = 256;
  CHECK(check_layout(job, c, Layout{32, 8, 1}).find("need 32 nodes") != std::string::npos);
}
