// Gang placement: all of a gang or none.
#include "operator/controller/placement.h"

#include <doctest/doctest.h>

using namespace railyard::op;
using Json = nlohmann::json;

namespace {
Json node(const std::string& name, bool ready, int gpus, Json taints = Json::array(), Json labels = Json::object()) {
  return {{"metadata", {{"name", name}, {"labels", labels}}},
          {"spec", {{"taints", taints}}},
          {"status",
           {{"allocatable", {{"nvidia.com/gpu", std::to_string(gpus)}, {"cpu", "8"}}},
            {"conditions", Json::array({{{"type", "Ready"}, {"status", ready ? "True" : "False"}}})}}}};
}
Json pod(const std::string& job, const std::string& node_name, int gpus, const std::string& phase = "Running") {
  Json p = {{"metadata", {{"name", job + "-x"}, {"namespace", "ns"}, {"labels", {{"railyard.dev/job", job}}}}},
            {"spec", {{"nodeName", node_name}, {"containers", Json::array({Json::object()})}}},
            {"status", {{"phase", phase}}}};
  if (gpus) p["spec"]["containers"][0]["resources"] = {{"limits", {{"nvidia.com/gpu", gpus}}}};
  return p;
}
}  // namespace

TEST_CASE("cpu pods go one per node, and a gang that does not fit binds nothing") {
  auto inv = build_inventory({node("n1", true, 0), node("n2", true, 0), node("n3", false, 0)}, {pod("other", "n1", 0)});
  SimplePlacement p;
  PlacementRequest req{"ns/a", 1, 0, {}, Json::array()};
  auto r = p.place(req, inv);
  REQUIRE(r.ok);
  CHECK(r.nodes == std::vector<std::string>{"n2"});
  req.pods = 2;
  r = p.place(req, inv);
  CHECK_FALSE(r.ok);
  CHECK(r.nodes.empty());
  CHECK(r.missing == 1);
  CHECK(r.message.find("1 of 2 pods do not fit") != std::string::npos);
}

TEST_CASE("gpu pods need enough free GPUs and never share a node within a job") {
  auto inv = build_inventory({node("a", true, 8), node("b", true, 8), node("c", true, 4)},
                             {pod("x", "a", 4), pod("y", "b", 8), pod("z", "c", 4, "Succeeded")});
  SimplePlacement p;
  auto r = p.place({"ns/j", 2, 4, {}, Json::array()}, inv);
  REQUIRE(r.ok);  // a has 4 free; b none; c's finished pod frees its GPUs
  CHECK(r.nodes == std::vector<std::string>{"a", "c"});
  r = p.place({"ns/j", 3, 4, {}, Json::array()}, inv);
  CHECK_FALSE(r.ok);
  CHECK(r.missing == 1);
  r = p.place({"ns/x", 1, 4, {}, Json::array()}, inv);  // job x already has a pod on a
  REQUIRE(r.ok);
  CHECK(r.nodes == std::vector<std::string>{"c"});
}

TEST_CASE("selectors and taints restrict nodes") {
  Json taint = Json::array({{{"key", "dedicated"}, {"value", "infer"}, {"effect", "NoSchedule"}}});
  auto inv = build_inventory({node("a", true, 8, taint), node("b", true, 8, Json::array(), {{"rail", "1"}})}, {});
  SimplePlacement p;
  auto r = p.place({"ns/j", 1, 1, {{"rail", "1"}}, Json::array()}, inv);
  REQUIRE(r.ok);
  CHECK(r.nodes[0] == "b");
  r = p.place({"ns/j", 2, 1, {}, Json::array()}, inv);
  CHECK_FALSE(r.ok);  // a is tainted
  Json tol = Json::array({{{"key", "dedicated"}, {"operator", "Equal"}, {"value", "infer"}}});
  r = p.place({"ns/j", 2, 1, {}, tol}, inv);
  CHECK(r.ok);
  CHECK(tolerates(Json::array({{{"operator", "Exists"}}}), taint[0]));
  CHECK_FALSE(tolerates(Json::array(), taint[0]));
}

TEST_CASE("node readiness and extended resources are read from the objects") {
  CHECK(node_ready(node("a", true, 1)));
  CHECK_FALSE(node_ready(node("a", false, 1)));
  CHECK_FALSE(node_ready(Json::parse(R"({"metadata": {"name": "x"}})")));
  CHECK(pod_resource(pod("j", "a", 3), "nvidia.com/gpu") == 3);
  CHECK(pod_resource(pod("j", "a", 0), "nvidia.com/gpu") == 0);
}
