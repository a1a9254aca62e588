// Gang placement: all of a gang or none.
#include "operator/scheduler/placement.h"

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
// One pod asking `requests` goes to `only` (the one node with room); a gang of two does not fit, and the message
// names `resource` as what the other node lacks.
void check_one_pod_fits_only_on(const std::vector<NodeInfo>& inv, const PodRequests& requests, const std::string& only,
                                const std::string& resource) {
  SimplePlacement p;
  PlacementRequest req{"ns/a", 1, 0, {}, Json::array()};
  req.requests = requests;
  auto r = p.place(req, inv);
  REQUIRE(r.ok);
  CHECK(r.nodes == std::vector<std::string>{only});
  req.pods = 2;
  r = p.place(req, inv);
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("1 without room for the pod's " + resource) != std::string::npos);
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

TEST_CASE("quantities parse as Kubernetes writes them") {
  CHECK(parse_quantity_milli("250m") == 250);
  CHECK(parse_quantity_milli("2") == 2000);
  CHECK(parse_quantity_milli("1.5") == 1500);
  CHECK(parse_quantity_milli("1Ki") == 1024000);
  CHECK(parse_quantity_milli("512Mi") == int64_t{512} * 1048576 * 1000);
  CHECK(parse_quantity_milli("1G") == int64_t{1000000000} * 1000);
  CHECK(parse_quantity_milli("1e3") == 1000000);
  CHECK(parse_quantity_milli("100u") == 1);  // rounded up, as the API server does
  CHECK_FALSE(parse_quantity_milli("").has_value());
  CHECK_FALSE(parse_quantity_milli("Gi").has_value());
  CHECK_FALSE(parse_quantity_milli("1GB").has_value());
  CHECK_FALSE(parse_quantity_milli("1.2.3").has_value());
}

TEST_CASE("pod requests: containers summed, a limit stands in for a missing request, init containers' max") {
  Json p = {{"spec",
             {{"containers", Json::array({{{"resources", {{"requests", {{"cpu", "500m"}, {"memory", "1Gi"}}}}}},
                                          {{"resources", {{"limits", {{"cpu", "1"}, {"memory", "512Mi"}}}}}},
                                          Json::object()})},
              {"initContainers", Json::array({{{"resources", {{"requests", {{"cpu", "3"}}}}}}})}}}};
  PodRequests r = pod_requests(p);
  CHECK(r.cpu_milli == 3000);  // the init container's 3 CPUs exceed the 1.5 of the containers
  CHECK(r.memory == int64_t{1536} * 1048576);
}

TEST_CASE("a node shared with foreign pods: their requests count against its allocatable (NodeResourcesFit)") {
  Json n1 = node("n1", true, 0), n2 = node("n2", true, 0);
  for (Json* n : {&n1, &n2}) {
    (*n)["status"]["allocatable"]["cpu"] = "4";
    (*n)["status"]["allocatable"]["memory"] = "8Gi";
    (*n)["status"]["allocatable"]["pods"] = "110";
  }
  // A pod of another workload (no Railyard label) holds 3 of n1's 4 CPUs.
  Json foreign = {{"metadata", {{"name", "db"}, {"namespace", "apps"}}},
                  {"spec",
                   {{"nodeName", "n1"},
                    {"containers", Json::array({{{"resources", {{"requests", {{"cpu", "3"}, {"memory", "1Gi"}}}}}}})}}},
                  {"status", {{"phase", "Running"}}}};
  auto inv = build_inventory({n1, n2}, {foreign});
  REQUIRE(inv[0].name == "n1");
  CHECK(inv[0].cpu_used_milli == 3000);
  CHECK(inv[0].cpu_allocatable_milli == 4000);
  CHECK(inv[0].memory_allocatable == int64_t{8} << 30);
  CHECK(inv[0].pods_used == 1);
  CHECK(inv[0].worker_pods == 0);

  check_one_pod_fits_only_on(inv, {2000, int64_t{1} << 30}, "n2", "cpu");  // 2 CPUs: n1 has 1 left, n2 has 4
  // Gangs of two pods from here on.
  SimplePlacement p;
  PlacementRequest req{"ns/a", 2, 0, {}, Json::array()};
  req.requests = {1000, 0};  // 1 CPU fits beside the foreign pod
  CHECK(p.place(req, inv).ok);
  req.requests = {1000, int64_t{8} << 30};  // but not 8 GiB beside its 1 GiB
  CHECK_FALSE(p.place(req, inv).ok);
  CHECK(resource_shortfall(inv[0], {1000, int64_t{8} << 30}) == "memory");
  CHECK(resource_shortfall(inv[0], {1001, 0}) == "cpu");
  // A finished foreign pod frees what it held.
  foreign["status"]["phase"] = "Succeeded";
  CHECK(build_inventory({n1}, {foreign})[0].cpu_used_milli == 0);
}

TEST_CASE("a node without a resource in allocatable fits no request of it; without pods, no pod limit") {
  auto inv = build_inventory({node("a", true, 0)}, {});  // allocatable: cpu 8 and GPUs only
  CHECK(resource_shortfall(inv[0], {8000, 0}).empty());
  CHECK(resource_shortfall(inv[0], {8001, 0}) == "cpu");
  CHECK(resource_shortfall(inv[0], {0, 1}) == "memory");
  CHECK(resource_shortfall(inv[0], {0, 0}).empty());
}

TEST_CASE("every resource counts as kube-scheduler counts it: extended, hugepages, ephemeral storage, overhead") {
  Json rdma = node("rdma", true, 0), plain = node("plain", true, 0);
  rdma["status"]["allocatable"]["rdma/hca"] = "1";
  rdma["status"]["allocatable"]["hugepages-2Mi"] = "1Gi";
  rdma["status"]["allocatable"]["ephemeral-storage"] = "100Gi";
  plain["status"]["allocatable"]["ephemeral-storage"] = "100Gi";
  plain["status"]["allocatable"]["hugepages-2Mi"] = "1Gi";
  for (Json* n : {&rdma, &plain}) (*n)["status"]["allocatable"]["memory"] = "16Gi";
  // The worker pod asks for one HCA (a limit standing in for the request), 512 MiB of 2 MiB hugepages, 10 GiB of
  // scratch disk, and its RuntimeClass's overhead of 250m CPU.
  Json worker = {
      {"spec",
       {{"containers",
         Json::array({{{"resources",
                        {{"requests", {{"cpu", "1"}, {"hugepages-2Mi", "512Mi"}, {"ephemeral-storage", "10Gi"}}},
                         {"limits", {{"rdma/hca", "1"}, {"cpu", "2"}}}}}}})},
        {"overhead", {{"cpu", "250m"}, {"memory", "64Mi"}}}}}};
  const PodRequests r = pod_requests(worker);
  CHECK(r.cpu_milli == 1250);  // the request (not the limit) plus the overhead
  CHECK(r.memory == int64_t{64} << 20);
  CHECK(r.scalar.at("rdma/hca") == 1000);
  CHECK(r.scalar.at("hugepages-2Mi") == (int64_t{512} << 20) * 1000);
  CHECK(r.scalar.at("ephemeral-storage") == (int64_t{10} << 30) * 1000);
  CHECK(r.scalar.count("cpu") == 0);

  auto inv = build_inventory({rdma, plain}, {});
  REQUIRE(inv[1].name == "rdma");
  CHECK(inv[1].scalar_allocatable.at("rdma/hca") == 1000);
  CHECK(inv[0].scalar_allocatable.count("rdma/hca") == 0);
  // The node without HCAs has none to give: the one with one is the only fit.
  CHECK(resource_shortfall(inv[0], r) == "rdma/hca");
  CHECK(resource_shortfall(inv[1], r).empty());
  check_one_pod_fits_only_on(inv, r, "rdma", "rdma/hca");

  // Another workload's pod holding the HCA leaves none; once it ends, the HCA is free again.
  Json foreign = {
      {"metadata", {{"name", "ib"}, {"namespace", "apps"}}},
      {"spec", {{"nodeName", "rdma"}, {"containers", Json::array({{{"resources", {{"limits", {{"rdma/hca", 1}}}}}}})}}},
      {"status", {{"phase", "Running"}}}};
  auto busy = build_inventory({rdma}, {foreign});
  CHECK(busy[0].scalar_used.at("rdma/hca") == 1000);
  CHECK(resource_shortfall(busy[0], r) == "rdma/hca");
  foreign["status"]["phase"] = "Failed";
  CHECK(resource_shortfall(build_inventory({rdma}, {foreign})[0], r).empty());
  // Hugepages count as well: 512 MiB fit twice into the node's 1 GiB, not three times.
  PodRequests huge;
  huge.scalar["hugepages-2Mi"] = (int64_t{512} << 20) * 1000;
  NodeInfo n = inv[1];
  CHECK(resource_shortfall(n, huge).empty());
  n.scalar_used["hugepages-2Mi"] = (int64_t{1} << 30) * 1000;
  CHECK(resource_shortfall(n, huge) == "hugepages-2Mi");

  // A reservation books them too: two gangs placed at once never share the one HCA.
  ReservingPlacement reserving(std::make_unique<SimplePlacement>());
  PlacementRequest a{"ns/a", 1, 0, {}, Json::array()}, b{"ns/b", 1, 0, {}, Json::array()};
  a.requests = b.requests = r;
  REQUIRE(reserving.place(a, inv).ok);
  CHECK_FALSE(reserving.place(b, inv).ok);
}
