// Rail-aligned NCCL settings of GPU worker pods (operator/scheduler/nccl_env.h): what the pod builder adds, what
// the Binding carries per node, and the node annotations' defaults and errors.
#include "operator/scheduler/nccl_env.h"

#include <doctest/doctest.h>

#include "common/wellknown.h"
#include "operator/controller/pod_builder.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
namespace wellknown = railyard::wellknown;
using railyard::op::testing::find_env;
using railyard::op::testing::job_with;
using railyard::op::testing::resolved_env;
using railyard::op::testing::valid_job;
using Json = nlohmann::json;

namespace {
NodeInfo gpu_node(int gpus, std::map<std::string, std::string> labels = {}, std::string hcas = "") {
  NodeInfo n;
  n.name = "gpu-node-1";
  n.gpu_allocatable = gpus;
  n.labels = std::move(labels);
  n.rail_hcas = std::move(hcas);
  return n;
}
}  // namespace

TEST_CASE("GPU pods get NCCL_CROSS_NIC=0 and NCCL_IB_HCA / NCCL_SOCKET_IFNAME from the binding's annotations") {
  Json job = job_with(Json::parse(R"({"spec": {"device": "cuda", "procsPerReplica": 4}})"));
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, PodOptions{});
  CHECK(resolved_env(pod, build_env_configmap(job, parse_job(job).spec, PodOptions{}), "NCCL_CROSS_NIC") == "0");
  REQUIRE(find_env(pod, "NCCL_IB_HCA"));
  CHECK((*find_env(pod, "NCCL_IB_HCA"))["valueFrom"]["fieldRef"]["fieldPath"] ==
        "metadata.annotations['railyard.dev/nccl-ib-hca']");
  REQUIRE(find_env(pod, "NCCL_SOCKET_IFNAME"));
  CHECK((*find_env(pod, "NCCL_SOCKET_IFNAME"))["valueFrom"]["fieldRef"]["fieldPath"] ==
        "metadata.annotations['railyard.dev/nccl-socket-ifname']");
  // GPUs requested through spec.resources (device auto) count as a GPU pod too.
  Json job2 = job_with(Json::parse(R"({"spec": {"resources": {"limits": {"nvidia.com/gpu": 8}}}})"));
  CHECK(build_env_configmap(job2, parse_job(job2).spec, PodOptions{})["data"].contains("NCCL_CROSS_NIC"));
}

TEST_CASE("CPU pods get no NCCL settings") {
  Json job = valid_job();
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, PodOptions{});
  for (const Json& e : pod["spec"]["containers"][0]["env"])
    CHECK_MESSAGE(e["name"].get<std::string>().rfind("NCCL_", 0) != 0, e.dump());
  const Json data = build_env_configmap(job, parse_job(job).spec, PodOptions{})["data"];
  for (auto it = data.begin(); it != data.end(); ++it) CHECK_MESSAGE(it.key().rfind("NCCL_", 0) != 0, it.key());
}

TEST_CASE("the template's own NCCL env wins over the scheduler's") {
  Json job = job_with(Json::parse(R"({"spec": {"device": "cuda", "template": {"spec": {"containers": [
      {"name": "worker", "env": [{"name": "NCCL_IB_HCA", "value": "=mlx5_3"}, {"name": "NCCL_CROSS_NIC", "value": "1"}]}
  ]}}}})"));
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, PodOptions{});
  CHECK((*find_env(pod, "NCCL_IB_HCA"))["value"] == "=mlx5_3");
  CHECK_FALSE((*find_env(pod, "NCCL_IB_HCA")).contains("valueFrom"));
  CHECK((*find_env(pod, "NCCL_CROSS_NIC"))["value"] == "1");
  CHECK(find_env(pod, "NCCL_SOCKET_IFNAME"));  // not set by the template: ours
  int ib = 0;
  for (const Json& e : pod["spec"]["containers"][0]["env"]) ib += e["name"] == "NCCL_IB_HCA";
  CHECK(ib == 1);
}

TEST_CASE("rails and default HCAs: the rails label, else the GPUs, else one") {
  CHECK(node_rails(gpu_node(8)) == 8);
  CHECK(node_rails(gpu_node(8, {{wellknown::kRailsLabel, "4"}})) == 4);
  CHECK(node_rails(gpu_node(8, {{wellknown::kRailsLabel, "4x"}})) == 8);  // not a number: the GPUs
  CHECK(node_rails(gpu_node(0)) == 1);
  RailHcas h = rail_hcas(gpu_node(0, {{wellknown::kRailsLabel, "3"}}));
  CHECK(h.error.empty());
  CHECK_FALSE(h.from_annotation);
  CHECK(h.hcas == std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2"});
  // Exact names: "=mlx5_1" must not also match mlx5_10..mlx5_19.
  CHECK(nccl_ib_hca(h.hcas) == "=mlx5_0,mlx5_1,mlx5_2");
  CHECK(nccl_ib_hca({}) == "");
}

TEST_CASE("the node's rail-hcas annotation gives the HCAs in rail order, checked against its rails") {
  RailHcas h = rail_hcas(gpu_node(4, {}, "mlx5_5,mlx5_4,ibp12s0:1,bnxt_re0"));
  CHECK(h.error.empty());
  CHECK(h.from_annotation);
  CHECK(h.hcas == std::vector<std::string>{"mlx5_5", "mlx5_4", "ibp12s0:1", "bnxt_re0"});

  RailHcas few = rail_hcas(gpu_node(4, {}, "mlx5_0,mlx5_1"));
  CHECK(few.hcas.empty());
  CHECK(few.error.find("gpu-node-1") != std::string::npos);
  CHECK(few.error.find("railyard.dev/rail-hcas") != std::string::npos);
  CHECK(few.error.find("lists 2 HCAs but the node has 4 rails") != std::string::npos);

  for (const char* bad : {"mlx5_0,,mlx5_2,mlx5_3", "mlx5_0,mlx 5,a,b", "mlx5_0:x,a,b,c", "mlx5_0:0,a,b,c"}) {
    RailHcas b = rail_hcas(gpu_node(4, {}, bad));
    CHECK_MESSAGE(b.hcas.empty(), bad);
    CHECK_MESSAGE(b.error.find("is not an HCA name") != std::string::npos, bad);
  }
}

TEST_CASE("binding annotations: the IB HCA list always, the socket interface only when the node names one") {
  std::string warning;
  Json a = nccl_binding_annotations(gpu_node(2), &warning);
  CHECK(warning.empty());
  CHECK(a == Json{{"railyard.dev/nccl-ib-hca", "=mlx5_0,mlx5_1"}});

  NodeInfo n = gpu_node(2, {}, "mlx5_1,mlx5_0");
  n.socket_ifname = "=eth1";
  a = nccl_binding_annotations(n, &warning);
  CHECK(warning.empty());
  CHECK(a == Json{{"railyard.dev/nccl-ib-hca", "=mlx5_1,mlx5_0"}, {"railyard.dev/nccl-socket-ifname", "=eth1"}});

  a = nccl_binding_annotations(gpu_node(2, {}, "mlx5_0"), &warning);
  CHECK(a["railyard.dev/nccl-ib-hca"] == "");  // empty: NCCL chooses (the agent drops the empty variable)
  CHECK(warning.find("lists 1 HCAs but the node has 2 rails") != std::string::npos);
}

TEST_CASE("build_inventory reads the NCCL node annotations") {
  Json node = Json::parse(R"({"metadata": {"name": "n1", "labels": {"railyard.dev/rails": "2"},
      "annotations": {"railyard.dev/rail-hcas": "mlx5_7,mlx5_8", "railyard.dev/nccl-socket-ifname": "eth0"}},
      "status": {"allocatable": {"nvidia.com/gpu": "2"}}})");
  auto inv = build_inventory({node}, {});
  REQUIRE(inv.size() == 1);
  CHECK(inv[0].rail_hcas == "mlx5_7,mlx5_8");
  CHECK(inv[0].socket_ifname == "eth0");
  CHECK(nccl_ib_hca(rail_hcas(inv[0]).hcas) == "=mlx5_7,mlx5_8");
}
