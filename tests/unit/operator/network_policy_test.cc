// The per-job NetworkPolicy: selects the job's pods in every generation, admits the job's own pods on any port and
// anyone on the metrics ports; strict mode adds the egress rules (job's pods, rendezvous port, DNS).
#include "operator/controller/network_policy.h"

#include <doctest/doctest.h>

#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::valid_job;
using Json = nlohmann::json;

namespace {
PodOptions pod_options() {
  PodOptions o;
  o.rendezvous_addr = "railyard-rendezvous.railyard-system.svc:29400";
  o.worker_metrics_port = 9400;
  o.agent_metrics_port = 9399;
  return o;
}
const Json kJobPods = {{"podSelector", {{"matchLabels", {{"railyard.dev/job", "tiny"}}}}}};
}  // namespace

TEST_CASE("modes parse and print; anything else is refused") {
  for (auto m : {NetworkPolicyMode::kNone, NetworkPolicyMode::kIngress, NetworkPolicyMode::kStrict})
    CHECK(network_policy_mode_from_string(to_string(m)) == m);
  CHECK_FALSE(network_policy_mode_from_string("Strict"));
  CHECK_FALSE(network_policy_mode_from_string(""));
}

TEST_CASE("ingress: the job's pods on any port, anyone on the metrics ports of every local rank and the agent") {
  Json job = valid_job();
  JobSpec spec2;
  spec2.procs_per_replica = 2;  // two ranks per pod: metrics on 9400 and 9401
  Json np = build_network_policy(job, spec2, NetworkPolicyMode::kIngress, pod_options());
  CHECK(np["kind"] == "NetworkPolicy");
  CHECK(np["apiVersion"] == "networking.k8s.io/v1");
  CHECK(np["metadata"]["name"] == "tiny-workers");
  CHECK(np["metadata"]["namespace"] == job["metadata"]["namespace"]);
  CHECK(np["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]);
  CHECK(np["metadata"]["ownerReferences"][0]["controller"] == true);
  const Json& spec = np["spec"];
  // Every generation's pods carry the job label: one selector for all of them.
  CHECK(spec["podSelector"] == kJobPods["podSelector"]);
  CHECK(spec["policyTypes"] == Json::array({"Ingress"}));
  CHECK_FALSE(spec.contains("egress"));
  REQUIRE(spec["ingress"].size() == 2);
  CHECK(spec["ingress"][0] == Json{{"from", Json::array({kJobPods})}});
  CHECK(spec["ingress"][1] == Json{{"ports", Json::array({{{"protocol", "TCP"}, {"port", 9400}},
                                                          {{"protocol", "TCP"}, {"port", 9401}},
                                                          {{"protocol", "TCP"}, {"port", 9399}}})}});
  // Metrics off: the job's pods only.
  PodOptions quiet = pod_options();
  quiet.worker_metrics_port = 0;
  quiet.agent_metrics_port = 0;
  CHECK(build_network_policy(job, spec2, NetworkPolicyMode::kIngress, quiet)["spec"]["ingress"].size() == 1);
}

TEST_CASE("strict: out only to the job's pods, the rendezvous port and DNS") {
  Json job = valid_job();
  ParsedJob p = parse_job(job);
  REQUIRE_FALSE(p.violation);
  Json np = build_network_policy(job, p.spec, NetworkPolicyMode::kStrict, pod_options());
  CHECK(np["spec"]["policyTypes"] == Json::array({"Ingress", "Egress"}));
  CHECK(np["metadata"]["annotations"]["railyard.dev/network-policy"] == "strict");
  const Json& egress = np["spec"]["egress"];
  REQUIRE(egress.size() == 3);
  CHECK(egress[0] == Json{{"to", Json::array({kJobPods})}});
  CHECK(egress[1] == Json{{"ports", Json::array({{{"protocol", "TCP"}, {"port", 29400}}})}});
  CHECK(egress[2] ==
        Json{{"ports", Json::array({{{"protocol", "UDP"}, {"port", 53}}, {{"protocol", "TCP"}, {"port", 53}}})}});
}
