#include "deploy/local/node_agent/topology.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "tests/ctest_env.h"

using railyard::ConfigError;
namespace na = railyard::node_agent;

namespace {
std::string error_of(const std::string& yaml) {
  try {
    na::parse_topology(yaml, "t.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("topology file: fields, node names and the unit/leaf/spine tree") {
  auto t = na::parse_topology(
      "gpuType: A100\ngpusPerNode: 4\nnodesPerUnit: 2\nunitsPerLeaf: 2\nleavesPerSpine: 2\nunits: 5\n"
      "cpu: \"16\"\nmemory: 128Gi\nnamePrefix: sim\n",
      "t.yaml");
  CHECK(t.gpu_type == "A100");
  CHECK(t.gpus_per_node == 4);
  auto nodes = na::expand_nodes(t);
  REQUIRE(nodes.size() == 10);
  CHECK(nodes[0].name == "sim-u0-n0");
  CHECK(nodes[1].name == "sim-u0-n1");
  CHECK(nodes[9].name == "sim-u4-n1");
  // units 0,1 -> leaf 0; 2,3 -> leaf 1 (spine 0); 4 -> leaf 2 (spine 1)
  CHECK(nodes[3].leaf == 0);
  CHECK(nodes[4].leaf == 1);
  CHECK(nodes[4].spine == 0);
  CHECK(nodes[8].leaf == 2);
  CHECK(nodes[8].spine == 1);
  std::set<std::string> names;
  for (const auto& n : nodes) names.insert(n.name);
  CHECK(names.size() == nodes.size());
}

TEST_CASE("node object: labels, capacity, allocatable, Ready condition, address") {
  auto t = na::parse_topology("gpuType: H100\ngpusPerNode: 8\nunits: 2\ncpu: \"32\"\nmemory: 256Gi\n", "t.yaml");
  auto nodes = na::expand_nodes(t);
  auto obj = na::node_object(t, nodes[3], "2026-11-22T00:00:00Z");
  CHECK(obj["kind"] == "Node");
  CHECK(obj["metadata"]["name"] == "rynode-u1-n1");
  const auto& l = obj["metadata"]["labels"];
  CHECK(l["railyard.dev/simulated"] == "true");
  CHECK(l["railyard.dev/gpu-type"] == "H100");
  CHECK(l["railyard.dev/unit"] == "u1");
  CHECK(l["railyard.dev/leaf"] == "leaf0");
  CHECK(l["railyard.dev/spine"] == "spine0");
  CHECK(l["railyard.dev/rails"] == "8");
  CHECK(l["kubernetes.io/hostname"] == "rynode-u1-n1");
  CHECK(l["node.kubernetes.io/instance-type"] == "sim-h100-8gpu");
  const auto& st = obj["status"];
  CHECK(st["capacity"]["nvidia.com/gpu"] == "8");
  CHECK(st["capacity"]["cpu"] == "32");
  CHECK(st["allocatable"]["memory"] == "256Gi");
  CHECK(st["allocatable"]["pods"] == "110");
  bool ready = false;
  for (const auto& c : st["conditions"]) ready = ready || (c["type"] == "Ready" && c["status"] == "True");
  CHECK(ready);
  CHECK(st["addresses"][0]["type"] == "InternalIP");
  CHECK(st["addresses"][0]["address"] == "127.0.0.1");
}

TEST_CASE("default topology truncated to --nodes") {
  auto t = na::default_topology(3);
  auto nodes = na::expand_nodes(t);
  REQUIRE(nodes.size() == 3);
  CHECK(nodes[2].name == "rynode-u1-n0");
  CHECK(na::expand_nodes(na::default_topology(1)).size() == 1);
  CHECK_THROWS_AS(na::default_topology(0), ConfigError);
  auto limited = na::parse_topology("units: 4\nnodes: 5\n", "t.yaml");
  CHECK(na::expand_nodes(limited).size() == 5);
}

TEST_CASE("bad topology files name the field") {
  CHECK(error_of("units: zero\n").find("units") != std::string::npos);
  CHECK(error_of("units: 0\n").find("units is 0") != std::string::npos);
  CHECK(error_of("gpusPerNod: 8\n").find("gpusPerNod is not a known field") != std::string::npos);
  CHECK(error_of("memory: lots\n").find("memory") != std::string::npos);
  CHECK(error_of("cpu: \"-1\"\n").find("cpu") != std::string::npos);
  CHECK(error_of("namePrefix: Bad_Name\n").find("namePrefix") != std::string::npos);
  CHECK(error_of("gpuType: \"H 100\"\n").find("gpuType") != std::string::npos);
  CHECK(error_of("units: 2\nnodes: 9\n").find("nodes is 9") != std::string::npos);
  CHECK(error_of("[1, 2]\n").find("must be a YAML mapping") != std::string::npos);
  CHECK(error_of("units: [\n").find("not valid YAML") != std::string::npos);
  CHECK(error_of("units: 2\n").empty());
  CHECK_THROWS_WITH_AS(na::load_topology_file("/nonexistent/topo.yaml"), doctest::Contains("/nonexistent/topo.yaml"),
                       ConfigError);
}

TEST_CASE("quantities and DNS labels") {
  CHECK(na::is_quantity("32"));
  CHECK(na::is_quantity("500m"));
  CHECK(na::is_quantity("256Gi"));
  CHECK(na::is_quantity("1.5"));
  CHECK_FALSE(na::is_quantity("256GB"));
  CHECK_FALSE(na::is_quantity(""));
  CHECK(na::is_dns_label("rynode"));
  CHECK_FALSE(na::is_dns_label("-x"));
  CHECK_FALSE(na::is_dns_label("A"));
}

TEST_CASE("every shipped topology file parses; default-4.yaml matches --nodes 4") {
  const std::string dir = railyard::test::source_path("deploy/local/topologies");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    CAPTURE(entry.path().string());
    auto t = na::load_topology_file(entry.path().string());
    CHECK(!na::expand_nodes(t).empty());
    ++files;
  }
  CHECK(files >= 3);
  auto from_file = na::expand_nodes(na::load_topology_file(dir + "/default-4.yaml"));
  auto from_flag = na::expand_nodes(na::default_topology(4));
  REQUIRE(from_file.size() == from_flag.size());
  for (size_t i = 0; i < from_file.size(); ++i) CHECK(from_file[i].name == from_flag[i].name);
  auto sixteen = na::expand_nodes(na::load_topology_file(dir + "/a100-16node-2spine.yaml"));
  REQUIRE(sixteen.size() == 16);
  CHECK(sixteen[15].spine == 1);
}
