// Rail-aware gang placement on the h100-8node topology (deploy/local/topologies/h100-8node.yaml): 4 units of 2
// nodes, 2 units per leaf, both leaves under one spine; 8 GPUs per node.
#include "operator/scheduler/rail_aware.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <set>

#include "operator/scheduler/topology.h"
#include "planner/calibration.h"

using namespace railyard::op;
using namespace railyard::op::sched;

namespace {

// Node k of the topology, labelled the way railyard-node-agent labels it.
NodeInfo h100_node(int unit, int index) {
  NodeInfo n;
  n.name = "rynode-u" + std::to_string(unit) + "-n" + std::to_string(index);
  n.ready = true;
  n.gpu_allocatable = 8;
  n.labels = {{"railyard.dev/unit", "u" + std::to_string(unit)},
              {"railyard.dev/leaf", "leaf" + std::to_string(unit / 2)},
              {"railyard.dev/spine", "spine0"},
              {"railyard.dev/gpu-type", "H100"},
              {"railyard.dev/rails", "8"}};
  return n;
}

std::vector<NodeInfo> h100_8node() {
  std::vector<NodeInfo> v;
  for (int u = 0; u < 4; ++u)
    for (int i = 0; i < 2; ++i) v.push_back(h100_node(u, i));
  return v;
}

NodeInfo& find(std::vector<NodeInfo>& nodes, const std::string& name) {
  for (auto& n : nodes)
    if (n.name == name) return n;
  FAIL("no node " << name);
  return nodes.front();
}

void occupy(std::vector<NodeInfo>& nodes, const std::string& name, int64_t gpus = 8) {
  NodeInfo& n = find(nodes, name);
  n.gpu_used += gpus;
  n.worker_pods++;
  n.jobs.insert("other/job");
}

PlacementRequest gpu_job(int pods, int64_t gpus = 8) {
  PlacementRequest r;
  r.job_key = "ns/j";
  r.pods = pods;
  r.gpus_per_pod = gpus;
  r.procs_per_pod = 8;
  return r;
}

std::string unit_of(const std::string& node) { return node.substr(7, 2); }  // "rynode-u2-n1" -> "u2"
int leaf_of(const std::string& node) { return (node[8] - '0') / 2; }

// A refused gang: nothing bound, `missing` nodes short, and the message that says why.
void check_refused(const PlacementResult& r, int missing, const std::string& message) {
  CHECK_FALSE(r.ok);
  CHECK(r.nodes.empty());
  CHECK(r.missing == missing);
  CHECK(r.message == message);
}
}  // namespace

TEST_CASE("topology: hops by tier, rails, and defaults for unlabelled nodes") {
  auto nodes = h100_8node();
  NodeInfo bare;
  bare.name = "plain-a";
  bare.ready = true;
  bare.gpu_allocatable = 4;
  NodeInfo bare2 = bare;
  bare2.name = "plain-b";
  nodes.push_back(bare);
  nodes.push_back(bare2);
  Topology t(nodes);
  const int u0n0 = t.index("rynode-u0-n0"), u0n1 = t.index("rynode-u0-n1"), u1n0 = t.index("rynode-u1-n0"),
            u2n0 = t.index("rynode-u2-n0"), pa = t.index("plain-a"), pb = t.index("plain-b");
  REQUIRE(u0n0 >= 0);
  CHECK(t.index("nope") == -1);
  CHECK(t.same_rail(u0n0, u0n0).hops == 0);
  CHECK(t.same_rail(u0n0, u0n0).nvlink);
  CHECK(t.same_rail(u0n0, u0n1).hops == 1);
  CHECK(t.same_rail(u0n0, u1n0).hops == 3);
  CHECK(t.same_rail(u0n0, u2n0).hops == 5);
  // Another rail inside one unit goes through the leaf.
  CHECK(t.cross_rail(u0n0, u0n1).hops == 3);
  CHECK(t.cross_rail(u0n0, u2n0).hops == 5);
  CHECK(t.same_rail(u0n0, u0n1).gbps == doctest::Approx(50));
  CHECK(t.same_rail(u0n0, u0n0).gbps == doctest::Approx(450));
  CHECK(t.rails(u0n0) == 8);
  CHECK(t.rails(pa) == 4);  // no rails label: one rail per GPU
  // Unlabelled: each its own unit and leaf, one shared default spine.
  CHECK(t.domain(pa, 0) != t.domain(pb, 0));
  CHECK(t.domain(pa, 1) != t.domain(pb, 1));
  CHECK(t.same_rail(pa, pb).hops == 5);
  CHECK(t.tier(u0n0, u2n0) == 3);
  // A second spine label: 7 hops, and the oversubscribed core tier has less bandwidth.
  nodes[6].labels["railyard.dev/spine"] = "spine1";
  Topology t2(nodes);
  CHECK(t2.same_rail(u0n0, t2.index(nodes[6].name)).hops == 7);
  CHECK(t2.same_rail(u0n0, t2.index(nodes[6].name)).gbps < t2.same_rail(u0n0, u0n1).gbps);
}

TEST_CASE("topology: custom keys, and a unit label reused under another leaf is another unit") {
  std::vector<NodeInfo> nodes;
  for (int i = 0; i < 4; ++i) {
    NodeInfo n;
    n.name = "n" + std::to_string(i);
    n.ready = true;
    n.labels = {{"rack", "r1"}, {"row", i < 2 ? "a" : "b"}};
    nodes.push_back(n);
  }
  Topology t(nodes, {"rack", "row"});
  CHECK(t.levels() == 2);
  CHECK(t.level_noun(0) == "rack");
  CHECK(t.same_rail(0, 1).hops == 1);
  CHECK(t.domain(0, 0) != t.domain(2, 0));  // "r1" in row a and "r1" in row b are different racks
  CHECK(t.same_rail(0, 2).hops == 5);       // no shared row: beyond the widest key
}

TEST_CASE("gang edges: data-parallel rings, pipeline neighbours, tensor groups across pods") {
  // 4 pods of 8 ranks, pure data parallel: a ring over the pods.
  auto e = gang_edges(4, 8, 1, 1);
  std::set<std::pair<int, int>> pairs;
  for (const auto& x : e) pairs.insert({x.a, x.b});
  CHECK(pairs == std::set<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {0, 3}});
  // Pipeline of 4 stages, one pod each: a chain, no wrap-around.
  e = gang_edges(4, 8, 8, 4);
  pairs.clear();
  for (const auto& x : e) pairs.insert({x.a, x.b});
  CHECK(pairs == std::set<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}});
  // Tensor 16 over pods of 8: the two pods of a tensor group talk with the heavy weight.
  e = gang_edges(2, 8, 16, 1);
  REQUIRE(e.size() == 1);
  CHECK(e[0].weight > 4.0);
  CHECK(gang_edges(1, 8, 1, 1).empty());
}

TEST_CASE("a 2-pod job lands in one unit, a 4-pod job in one leaf") {
  auto nodes = h100_8node();
  RailAwarePlacement p;
  auto r = p.place(gpu_job(2), nodes);
  REQUIRE(r.ok);
  REQUIRE(r.nodes.size() == 2);
  CHECK(unit_of(r.nodes[0]) == unit_of(r.nodes[1]));
  CHECK(r.worst_hops == 1);
  CHECK(r.message.find("rail-aware: unit") != std::string::npos);

  occupy(nodes, "rynode-u0-n0");  // leaf0 now has 3 free nodes
  r = p.place(gpu_job(4), nodes);
  REQUIRE(r.ok);
  std::set<int> leaves;
  for (const auto& n : r.nodes) leaves.insert(leaf_of(n));
  CHECK(leaves == std::set<int>{1});
  CHECK(r.worst_hops == 3);
  // Topology order: both nodes of a unit are neighbours in replica order.
  CHECK(unit_of(r.nodes[0]) == unit_of(r.nodes[1]));
  CHECK(unit_of(r.nodes[2]) == unit_of(r.nodes[3]));
}

TEST_CASE("a job crosses the spine only when no leaf holds it") {
  auto nodes = h100_8node();
  RailAwarePlacement p;
  occupy(nodes, "rynode-u0-n0");
  occupy(nodes, "rynode-u3-n1");
  auto r = p.place(gpu_job(3), nodes);  // each leaf has 3 free: stays in one
  REQUIRE(r.ok);
  CHECK(leaf_of(r.nodes[0]) == leaf_of(r.nodes[2]));
  CHECK(r.worst_hops == 3);
  r = p.place(gpu_job(4), nodes);  // no leaf has 4: crosses, the ring's worst edge goes over the spine
  REQUIRE(r.ok);
  std::set<int> leaves;
  for (const auto& n : r.nodes) leaves.insert(leaf_of(n));
  CHECK(leaves.size() == 2);
  CHECK(r.worst_hops == 5);
  CHECK(r.message.find("spine") != std::string::npos);
}

TEST_CASE("fragmentation: best fit into the fullest domain keeps a unit whole that first fit would split") {
  auto rail = h100_8node(), simple = h100_8node();
  occupy(rail, "rynode-u1-n0");
  occupy(simple, "rynode-u1-n0");
  RailAwarePlacement p;
  SimplePlacement first_fit;
  // A 1-pod job: first fit takes the first name (splitting u0); best fit fills u1's free node.
  auto r = p.place(gpu_job(1), rail);
  auto f = first_fit.place(gpu_job(1), simple);
  REQUIRE(r.ok);
  REQUIRE(f.ok);
  CHECK(r.nodes == std::vector<std::string>{"rynode-u1-n1"});
  CHECK(f.nodes == std::vector<std::string>{"rynode-u0-n0"});
  occupy(rail, r.nodes[0]);
  occupy(simple, f.nodes[0]);
  // A 4-pod job takes leaf1 either way; then a 2-pod job still gets a whole unit only after best fit.
  for (auto* inv : {&rail, &simple}) {
    auto big = p.place(gpu_job(4), *inv);
    REQUIRE(big.ok);
    for (const auto& n : big.nodes) occupy(*inv, n);
  }
  auto r2 = p.place(gpu_job(2), rail);
  auto f2 = p.place(gpu_job(2), simple);
  REQUIRE(r2.ok);
  REQUIRE(f2.ok);
  CHECK(r2.worst_hops == 1);
  CHECK(f2.worst_hops == 3);
  // Among equal units the one in the fuller leaf wins.
  auto nodes = h100_8node();
  occupy(nodes, "rynode-u2-n0");
  occupy(nodes, "rynode-u2-n1");
  r = p.place(gpu_job(2), nodes);
  REQUIRE(r.ok);
  CHECK(unit_of(r.nodes[0]) == "u3");
}

TEST_CASE("an excluded node is never chosen, and the message names it") {
  auto nodes = h100_8node();
  RailAwarePlacement p;
  auto req = gpu_job(2);
  req.excluded_nodes = {"rynode-u0-n0", "rynode-u0-n1", "rynode-u1-n0"};
  for (int pods = 1; pods <= 5; ++pods) {
    req.pods = pods;
    auto r = p.place(req, nodes);
    REQUIRE(r.ok);
    for (const auto& n : r.nodes) CHECK_FALSE(req.excluded_nodes.count(n));
  }
  req.pods = 6;
  auto r = p.place(req, nodes);
  check_refused(r, 1,
                "needs 6 nodes with 8 free nvidia.com/gpu; 5 of 8 nodes fit, 3 excluded by failure (rynode-u0-n0, "
                "rynode-u0-n1, rynode-u1-n0); none bound");
}

TEST_CASE("hard mode: one domain of the widest key or nothing, with a message that says why") {
  auto nodes = h100_8node();
  occupy(nodes, "rynode-u3-n0", 4);  // 4 GPUs left: not enough for an 8-GPU pod
  RailAwarePlacement p;
  auto req = gpu_job(4);
  req.topology_keys = {"railyard.dev/unit", "railyard.dev/leaf"};
  req.hard = true;
  req.excluded_nodes = {"rynode-u1-n1"};
  auto r = p.place(req, nodes);
  check_refused(r, 1,
                "needs 4 nodes with 8 free nvidia.com/gpu in one leaf (placement.mode hard); largest leaf leaf0 has 3 "
                "(rynode-u1-n1 excluded by failure); none bound");
  req.hard = false;  // soft: takes the best available across the spine
  r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(r.worst_hops == 5);
  // The same gang at 4 GPUs a pod fits in leaf1 (u3-n0 has 4 left).
  req.hard = true;
  req.gpus_per_pod = 4;
  r = p.place(req, nodes);
  REQUIRE(r.ok);
  for (const auto& n : r.nodes) CHECK(leaf_of(n) == 1);
}

TEST_CASE("taints, node selectors and required node affinity are honoured") {
  auto nodes = h100_8node();
  find(nodes, "rynode-u0-n0").taints = Json::array({{{"key", "maint"}, {"effect", "NoSchedule"}}});
  find(nodes, "rynode-u0-n1").labels["pool"] = "b";
  RailAwarePlacement p;
  auto req = gpu_job(1);
  auto r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(r.nodes[0] != "rynode-u0-n0");
  req.tolerations = Json::array({{{"key", "maint"}, {"operator", "Exists"}}});
  req.node_selector = {{"railyard.dev/unit", "u0"}};
  req.pods = 2;
  r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(r.nodes == std::vector<std::string>{"rynode-u0-n0", "rynode-u0-n1"});
  req.tolerations = Json::array();
  r = p.place(req, nodes);
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("1 tainted") != std::string::npos);
  CHECK(r.message.find("6 not selected by nodeSelector or affinity") != std::string::npos);
  // Affinity: NotIn leaf0 and the pool label must not exist.
  req = gpu_job(4);
  req.node_affinity = Json::parse(R"({"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
      {"matchExpressions":[{"key":"railyard.dev/leaf","operator":"NotIn","values":["leaf1"]},
                           {"key":"pool","operator":"DoesNotExist"}]}]}})");
  find(nodes, "rynode-u0-n0").taints = Json::array();
  r = p.place(req, nodes);
  CHECK_FALSE(r.ok);  // leaf0 minus the pool-b node leaves 3
  req.pods = 3;
  r = p.place(req, nodes);
  REQUIRE(r.ok);
  for (const auto& n : r.nodes) {
    CHECK(leaf_of(n) == 0);
    CHECK(n != "rynode-u0-n1");
  }
}

TEST_CASE("avoided nodes are used only when nothing else fits") {
  auto nodes = h100_8node();
  RailAwarePlacement p;
  auto req = gpu_job(2);
  req.avoided_nodes = {"rynode-u0-n0"};
  for (const char* busy : {"rynode-u1-n0", "rynode-u2-n0", "rynode-u3-n0"}) occupy(nodes, busy);
  auto r = p.place(req, nodes);  // u0 is the only whole unit but holds the avoided node: cross units instead
  REQUIRE(r.ok);
  CHECK(std::find(r.nodes.begin(), r.nodes.end(), "rynode-u0-n0") == r.nodes.end());
  req.pods = 5;
  r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(std::find(r.nodes.begin(), r.nodes.end(), "rynode-u0-n0") != r.nodes.end());
  CHECK(r.message.find("nothing else fits") != std::string::npos);
}

TEST_CASE("a replacement pod lands next to its bound gang") {
  auto nodes = h100_8node();
  occupy(nodes, "rynode-u2-n0");
  nodes[4].jobs = {"ns/j"};  // rynode-u2-n0 runs replica 0 of this job
  RailAwarePlacement p;
  auto req = gpu_job(1);
  req.pod_indices = {1};
  req.bound = {{0, "rynode-u2-n0"}};
  auto r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(r.nodes == std::vector<std::string>{"rynode-u2-n1"});
  CHECK(r.worst_hops == 1);
}

TEST_CASE("pipeline stages follow the topology order") {
  auto nodes = h100_8node();
  occupy(nodes, "rynode-u0-n0");
  occupy(nodes, "rynode-u3-n1");
  RailAwarePlacement p;
  auto req = gpu_job(6);
  req.tensor = 8;
  req.pipeline = 6;
  auto r = p.place(req, nodes);
  REQUIRE(r.ok);
  // 6 stages over 6 nodes in 4 units and 2 leaves: the chain crosses the spine once and each leaf's units once.
  CHECK(r.worst_hops == 5);
  int spine_crossings = 0;
  for (size_t i = 0; i + 1 < r.nodes.size(); ++i) spine_crossings += leaf_of(r.nodes[i]) != leaf_of(r.nodes[i + 1]);
  CHECK(spine_crossings == 1);
}

TEST_CASE("railAware false is first fit; cpu pods go one per node") {
  auto nodes = h100_8node();
  occupy(nodes, "rynode-u1-n0");
  RailAwarePlacement p;
  auto req = gpu_job(1);
  req.rail_aware = false;
  auto r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(r.nodes == std::vector<std::string>{"rynode-u0-n0"});
  CHECK(r.message.find("first fit") == 0);
  req = gpu_job(8, 0);  // CPU pods: a node with a worker pod is taken
  r = p.place(req, nodes);
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("needs 8 nodes without a Railyard worker pod; 7 of 8 nodes fit, 1 already running") == 0);
}

TEST_CASE("placement request from a TrainingJob: options, affinity, exclusions") {
  Json job = Json::parse(R"({
    "metadata": {"name": "j", "annotations": {"railyard.dev/exclude-nodes": " a, b ,,c"}},
    "spec": {"placement": {"railAware": false, "mode": "hard", "topologyKeys": ["rack", "row"]},
             "template": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
               {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}]}}}}},
             "failurePolicy": {}},
    "status": {"lastRestart": {"reason": "NodeLost", "node": "d"}}})");
  PlacementRequest req;
  apply_job_options(job, req);
  CHECK_FALSE(req.rail_aware);
  CHECK(req.hard);
  CHECK(req.topology_keys == std::vector<std::string>{"rack", "row"});
  CHECK(req.excluded_nodes == std::set<std::string>{"a", "b", "c"});
  CHECK(req.avoided_nodes == std::set<std::string>{"d"});
  NodeInfo x, y;
  x.name = "x";
  y.name = "y";
  CHECK(matches_node_affinity(req.node_affinity, x));
  CHECK_FALSE(matches_node_affinity(req.node_affinity, y));
  job["spec"]["failurePolicy"]["excludeFailedNodes"] = false;
  PlacementRequest off;
  apply_job_options(job, off);
  CHECK(off.excluded_nodes.empty());
  CHECK(off.avoided_nodes.empty());
}

namespace {
// A synthetic cluster: `nodes` nodes in units of `per_unit`, 4 units a leaf, 4 leaves a spine.
std::vector<NodeInfo> synthetic(int nodes, int per_unit) {
  std::vector<NodeInfo> v;
  for (int i = 0; i < nodes; ++i) {
    const int unit = i / per_unit, leaf = unit / 4;
    NodeInfo n;
    char name[32];
    std::snprintf(name, sizeof name, "s%04d", i);
    n.name = name;
    n.ready = true;
    n.gpu_allocatable = 8;
    // snprintf, not "u" + std::to_string(): GCC 12 flags the latter with a false -Wrestrict when inlined at -O3.
    char unit_s[16], leaf_s[16], spine_s[16];
    std::snprintf(unit_s, sizeof unit_s, "u%d", unit);
    std::snprintf(leaf_s, sizeof leaf_s, "l%d", leaf);
    std::snprintf(spine_s, sizeof spine_s, "s%d", leaf / 4);
    n.labels = {{"railyard.dev/unit", unit_s}, {"railyard.dev/leaf", leaf_s}, {"railyard.dev/spine", spine_s}};
    v.push_back(n);
  }
  return v;
}
}  // namespace

TEST_CASE("256 nodes: a job larger than a unit gets the fewest units under one leaf") {
  auto nodes = synthetic(256, 8);
  // Leaf l0's units: u0 has 3 free nodes, u1 5, u2 and u3 whole; a 16-pod job takes u2 and u3, not 3 partial units.
  for (int i : {0, 1, 2, 3, 4, 8, 9, 10}) {
    nodes[i].gpu_used = 8;
    nodes[i].worker_pods = 1;
  }
  // Every other leaf loses one node, so l0 (24 free) is no longer the only leaf with room, but the fullest.
  for (int leaf = 1; leaf < 8; ++leaf) nodes[leaf * 32].gpu_used = 8;
  Topology t(nodes);
  RailAwarePlacement p;
  auto r = p.place(gpu_job(16), nodes);
  REQUIRE(r.ok);
  std::set<int> units, leaves;
  for (const auto& n : r.nodes) {
    units.insert(t.domain(t.index(n), 0));
    leaves.insert(t.domain(t.index(n), 1));
  }
  CHECK(units.size() == 2);
  CHECK(leaves.size() == 1);
  CHECK(r.worst_hops == 3);
  CHECK(t.domain_name(1, *leaves.begin()) == "l0");
}

TEST_CASE("random clusters: hard constraints are never broken, and a gang is all or nothing") {
  std::mt19937 rng(12345);
  RailAwarePlacement p;
  int placed = 0, refused = 0;
  for (int round = 0; round < 200; ++round) {
    auto nodes = synthetic(64, 2);  // 2 spines of 32 nodes
    for (auto& n : nodes) {
      const unsigned x = rng() % 20;
      if (x == 0) n.ready = false;
      if (x == 1) n.unschedulable = true;
      if (x == 2) n.taints = Json::array({{{"key", "k"}, {"effect", "NoSchedule"}}});
      if (x == 3) n.labels["pool"] = "other";
      if (x >= 4 && x < 8) n.gpu_used = static_cast<int64_t>(rng() % 9);
    }
    auto req = gpu_job(1 + static_cast<int>(rng() % 24), 1 + static_cast<int64_t>(rng() % 8));
    for (int k = 0; k < 4; ++k) req.excluded_nodes.insert(nodes[rng() % nodes.size()].name);
    req.node_affinity = Json::parse(R"({"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
        {"matchExpressions":[{"key":"pool","operator":"NotIn","values":["other"]}]}]}})");
    req.hard = rng() % 3 == 0;
    auto r = p.place(req, nodes);
    if (!r.ok) {
      refused++;
      CHECK(r.nodes.empty());
      CHECK(r.missing >= 1);
      CHECK(r.message.find("none bound") != std::string::npos);
      continue;
    }
    placed++;
    REQUIRE(static_cast<int>(r.nodes.size()) == req.pods);
    std::set<std::string> distinct(r.nodes.begin(), r.nodes.end());
    CHECK(distinct.size() == r.nodes.size());
    std::set<std::string> spines;
    for (const auto& name : r.nodes) {
      const NodeInfo& n = find(nodes, name);
      CHECK(n.ready);
      CHECK_FALSE(n.unschedulable);
      CHECK(n.taints.empty());
      CHECK(n.labels.count("pool") == 0);
      CHECK_FALSE(req.excluded_nodes.count(name));
      CHECK(n.gpu_allocatable - n.gpu_used >= req.gpus_per_pod);
      spines.insert(n.labels.at("railyard.dev/spine"));
    }
    if (req.hard) CHECK(spines.size() == 1);
  }
  CHECK(placed > 50);  // the generator makes both outcomes common
  CHECK(refused > 10);
}

TEST_CASE("reservations: a stale inventory never books the same GPUs twice") {
  auto nodes = h100_8node();
  ReservingPlacement p(std::make_unique<RailAwarePlacement>());
  auto a = gpu_job(2);
  a.job_key = "ns/a";
  auto b = gpu_job(2);
  b.job_key = "ns/b";
  auto ra = p.place(a, nodes);
  auto rb = p.place(b, nodes);  // the same (stale) inventory: a's nodes are held
  REQUIRE(ra.ok);
  REQUIRE(rb.ok);
  std::set<std::string> all(ra.nodes.begin(), ra.nodes.end());
  all.insert(rb.nodes.begin(), rb.nodes.end());
  CHECK(all.size() == 4);
  CHECK(unit_of(rb.nodes[0]) == unit_of(rb.nodes[1]));
  // Once the cache shows a's pods bound, the reservation gives way to the real usage (no double count): a 4-pod job
  // still fits in the 4 nodes left.
  for (const auto& n : ra.nodes) {
    occupy(nodes, n);
    find(nodes, n).jobs = {"ns/a"};
  }
  auto c = gpu_job(4);
  c.job_key = "ns/c";
  auto rc = p.place(c, nodes);
  REQUIRE(rc.ok);
  for (const auto& n : rc.nodes) CHECK(all.count(n) == 0);
  // b (still unseen) and c hold 6 nodes, a uses 2: nothing is left.
  auto d = gpu_job(1);
  d.job_key = "ns/d";
  CHECK_FALSE(p.place(d, nodes).ok);
  // Reservations expire.
  ReservingPlacement quick(std::make_unique<RailAwarePlacement>(), std::chrono::milliseconds(0));
  auto fresh = h100_8node();
  REQUIRE(quick.place(gpu_job(8), fresh).ok);
  CHECK(quick.place(gpu_job(8), fresh).ok);
}

TEST_CASE("reservations: placing a replica again releases its earlier node") {
  auto nodes = h100_8node();
  ReservingPlacement p(std::make_unique<RailAwarePlacement>());
  auto a = gpu_job(2);
  a.job_key = "ns/a";
  auto ra = p.place(a, nodes);
  REQUIRE(ra.ok);
  // Replica 1 was lost before the cache ever showed it; its replacement goes elsewhere.
  auto again = gpu_job(1);
  again.job_key = "ns/a";
  again.pod_indices = {1};
  again.excluded_nodes = {ra.nodes[1]};
  auto r1 = p.place(again, nodes);
  REQUIRE(r1.ok);
  CHECK(r1.nodes[0] != ra.nodes[1]);
  // Held: replica 0's node and the replacement's; free: the other 6, including replica 1's first node.
  auto b = gpu_job(6);
  b.job_key = "ns/b";
  auto rb = p.place(b, nodes);
  REQUIRE(rb.ok);
  CHECK(std::find(rb.nodes.begin(), rb.nodes.end(), ra.nodes[1]) != rb.nodes.end());
  CHECK(std::find(rb.nodes.begin(), rb.nodes.end(), ra.nodes[0]) == rb.nodes.end());
}

TEST_CASE("preferred node affinity breaks ties after the communication cost") {
  auto nodes = h100_8node();
  RailAwarePlacement p;
  auto req = gpu_job(2);
  req.node_affinity = Json::parse(R"({"preferredDuringSchedulingIgnoredDuringExecution":[
      {"weight": 10, "preference": {"matchExpressions": [{"key": "railyard.dev/unit", "operator": "In", "values": ["u3"]}]}},
      {"weight": 1, "preference": {"matchExpressions": [{"key": "railyard.dev/unit", "operator": "In", "values": ["u2"]}]}}]})");
  auto r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(unit_of(r.nodes[0]) == "u3");
  CHECK(unit_of(r.nodes[1]) == "u3");
  CHECK(preferred_affinity_score(req.node_affinity, find(nodes, "rynode-u2-n0")) == 1);
  CHECK(preferred_affinity_score(req.node_affinity, find(nodes, "rynode-u0-n0")) == 0);
  // A preference never buys a worse network: with u3 half taken, the gang stays in one whole unit (u2).
  occupy(nodes, "rynode-u3-n0");
  r = p.place(req, nodes);
  REQUIRE(r.ok);
  CHECK(r.worst_hops == 1);
  CHECK(unit_of(r.nodes[0]) == "u2");
}

// ---- Scoring by the planner's cost model (PlacementRequest::step_model) ----

namespace {

// A 4-pod gang of 8-GPU pods, tensor 8 inside each pod, 2 pipeline stages, data 2, on h100 profiles with the
// leaf tier (across units) at half the unit's rail bandwidth. Only leaf0 (u0, u1) is free: the 4 pods must span two
// units, and the question is which group crosses between them.
struct PipelinedGang {
  std::vector<NodeInfo> nodes = h100_8node();
  PlacementRequest req = gpu_job(4);
  PipelinedGang(const railyard::plan::ModelShape& shape, long long global_batch) {
    for (const char* n : {"rynode-u2-n0", "rynode-u2-n1", "rynode-u3-n0", "rynode-u3-n1"}) occupy(nodes, n);
    req.tensor = 8;
    req.pipeline = 2;
    auto m = std::make_shared<PlacementStepModel>();
    m->job.model = shape;
    m->job.model.dropout = false;
    m->job.global_batch = global_batch;
    m->cluster.device = railyard::plan::builtin_profile("h100-sxm");
    m->cluster.topology.leaf_bandwidth_factor = 0.5;
    m->layout.dp = 2;
    m->layout.tp = 8;
    m->layout.pp = 2;
    m->layout.micro_batch = 1;
    m->layout.zero = 1;
    req.step_model = m;
  }
  // Predicted step of pods 0..3 on these nodes.
  double step(const std::vector<std::string>& on) const {
    Topology topo(nodes);
    std::vector<int> node_of_pod;
    for (const auto& n : on) node_of_pod.push_back(topo.index(n));
    return predicted_step(*req.step_model, topo, node_of_pod, req.procs_per_pod);
  }
};

// Rank order (stages contiguous: pods 0, 1 = stage 0 in u0, pods 2, 3 = stage 1 in u1) keeps each data-parallel
// pair inside a unit; pipelines contiguous (pods 0, 2 in u0) keep each pipeline inside a unit.
const std::vector<std::string> kStagesInUnits = {"rynode-u0-n0", "rynode-u0-n1", "rynode-u1-n0", "rynode-u1-n1"};
const std::vector<std::string> kPipelinesInUnits = {"rynode-u0-n0", "rynode-u1-n0", "rynode-u0-n1", "rynode-u1-n1"};

}  // namespace

TEST_CASE("placed tiers: the worst data-parallel group and pipeline pair of a placement, in the planner's tiers") {
  auto nodes = h100_8node();
  Topology topo(nodes);
  auto idx = [&](const std::vector<std::string>& names) {
    std::vector<int> v;
    for (const auto& n : names) v.push_back(topo.index(n));
    return v;
  };
  // tp 8 in a pod, pp 2, dp 2 (4 pods): stages in units -> dp inside a unit (1), pp across units of a leaf (2).
  auto t = placed_tiers(topo, idx(kStagesInUnits), 8, 8, 2);
  CHECK(t.dp == 1);
  CHECK(t.pp == 2);
  t = placed_tiers(topo, idx(kPipelinesInUnits), 8, 8, 2);
  CHECK(t.dp == 2);
  CHECK(t.pp == 1);
  // Across leaves (the spine) is tier 3; pure data parallelism has no pipeline pair.
  t = placed_tiers(topo, idx({"rynode-u0-n0", "rynode-u2-n0"}), 8, 8, 1);
  CHECK(t.dp == 3);
  CHECK(t.pp == 0);
  // Two ranks of one pod share the node: tier 0.
  t = placed_tiers(topo, idx({"rynode-u0-n0"}), 8, 1, 1);
  CHECK(t.dp == 0);
}

TEST_CASE("cost model: a long pipeline of small micro-batches keeps pipelines inside units (hop counts tie)") {
  // gpt2-350m shape at sequence 2048, 512 sequences per step: 256 micro-batches per pipeline, each sending
  // activations forward and gradients back (2 x 256 transfers of 512 KiB per GPU per step, 268 MB), while the
  // data-parallel reduction moves each GPU's 25M parameters' gradients once, overlapped with the last backward.
  // Crossing the half-bandwidth leaf tier hurts the pipeline more: the model puts each pipeline in one unit.
  PipelinedGang g({"gpt2-350m", 24, 1024, 16, 2048, 50257}, 512);
  const double stages_in_units = g.step(kStagesInUnits), pipelines_in_units = g.step(kPipelinesInUnits);
  MESSAGE("predicted step: stages in units " << stages_in_units << " s, pipelines in units " << pipelines_in_units);
  REQUIRE(stages_in_units > 0);
  // Compute dominates the step (about 2.7 s); the pipeline's transfers across the leaf cost about 0.2% of it, more
  // than the 0.1% under which two candidates count as a tie.
  CHECK(pipelines_in_units < stages_in_units * (1 - 1e-3));
  RailAwarePlacement p;
  auto r = p.place(g.req, g.nodes);
  REQUIRE(r.ok);
  CHECK(r.nodes == kPipelinesInUnits);
  CHECK(r.message.find("predicted step") != std::string::npos);
  // The hop-count score alone cannot tell the two apart (4 data and 4 pipeline pair-edges of weight 1; either way two
  // of them cross units) and keeps the rank order.
  Topology topo(g.nodes);
  auto edges = gang_edges(4, 8, 8, 2);
  auto cost = [&](const std::vector<std::string>& on) {
    std::vector<int> v;
    for (const auto& n : on) v.push_back(topo.index(n));
    return gang_cost(topo, v, edges).cost;
  };
  CHECK(cost(kStagesInUnits) == cost(kPipelinesInUnits));
  auto naive = g.req;
  naive.step_model = nullptr;
  auto n = p.place(naive, g.nodes);
  REQUIRE(n.ok);
  CHECK(n.nodes == kStagesInUnits);
  CHECK(n.message.find("predicted step") == std::string::npos);
}

TEST_CASE("cost model: a large model with one micro-batch keeps data-parallel pairs inside units") {
  // gpt3-1.3b shape, 2 sequences per step: one micro-batch per pipeline (one 8 MiB transfer each way), but each GPU's
  // gradients (about 80M parameters) are reduced over the pair: crossing the half-bandwidth leaf hurts the
  // data-parallel reduction more, so the model keeps the stages (the data-parallel pairs) inside units.
  PipelinedGang g({"gpt3-1.3b", 24, 2048, 16, 2048, 50257}, 2);
  const double stages_in_units = g.step(kStagesInUnits), pipelines_in_units = g.step(kPipelinesInUnits);
  MESSAGE("predicted step: stages in units " << stages_in_units << " s, pipelines in units " << pipelines_in_units);
  REQUIRE(stages_in_units > 0);
  CHECK(stages_in_units < pipelines_in_units * 0.99);
  RailAwarePlacement p;
  auto r = p.place(g.req, g.nodes);
  REQUIRE(r.ok);
  CHECK(r.nodes == kStagesInUnits);
}

TEST_CASE("cost model: candidates with the same hop structure fall back to today's tie-breaks") {
  // Pure data parallelism in one unit: every unit predicts the same step, so the fullest unit wins as without a model.
  auto nodes = h100_8node();
  occupy(nodes, "rynode-u2-n0");  // u2 has one free node left: too small; u0, u1, u3 tie on the model
  auto req = gpu_job(2);
  auto m = std::make_shared<PlacementStepModel>();
  m->job.model = {"gpt2-124m", 12, 768, 12, 1024, 50257};
  m->job.global_batch = 32;
  m->cluster.device = railyard::plan::builtin_profile("h100-sxm");
  m->layout.dp = 16;
  m->layout.tp = 1;
  m->layout.pp = 1;
  m->layout.micro_batch = 2;
  req.step_model = m;
  RailAwarePlacement p;
  auto with_model = p.place(req, nodes);
  req.step_model = nullptr;
  auto without = p.place(req, nodes);
  REQUIRE(with_model.ok);
  REQUIRE(without.ok);
  CHECK(with_model.nodes == without.nodes);
  // A tensor group spanning pods is outside the model (tensor parallelism stays in a node): no prediction, hop cost.
  Topology topo(nodes);
  PlacementStepModel spanning = *m;
  spanning.layout.dp = 1;
  spanning.layout.tp = 16;
  CHECK(predicted_step(spanning, topo, {0, 1}, 8) < 0);
}
