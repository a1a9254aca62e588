// The leader's Endpoints for the selector-less rendezvous Service (issue #40 item 7): the object names this replica's
// pod alone, and the check that decides whether to rewrite it looks at what routes traffic, not at JSON as written.
#include "operator/controller/leader_endpoints.h"

#include <doctest/doctest.h>

using namespace railyard::op;
using Json = nlohmann::json;

namespace {
LeaderEndpoint leader() {
  LeaderEndpoint e;
  e.ns = "railyard-system";
  e.name = "railyard-rendezvous";
  e.pod_name = "railyard-operator-7d9c-abcde";
  e.pod_uid = "0b1f6c1e-4a8e-4c3e-9d0f-1f2e3d4c5b6a";
  e.pod_ip = "10.244.1.7";
  e.port = 9090;
  return e;
}
}  // namespace

TEST_CASE("the Endpoints name the leader's pod, IP and rendezvous port, and nothing else") {
  const Json o = leader_endpoints_object(leader());
  CHECK(o["apiVersion"] == "v1");
  CHECK(o["kind"] == "Endpoints");
  CHECK(o["metadata"]["name"] == "railyard-rendezvous");
  CHECK(o["metadata"]["namespace"] == "railyard-system");
  REQUIRE(o["subsets"].size() == 1);
  const auto& s = o["subsets"][0];
  REQUIRE(s["addresses"].size() == 1);
  CHECK(s["addresses"][0]["ip"] == "10.244.1.7");
  CHECK(s["addresses"][0]["targetRef"] == Json{{"kind", "Pod"},
                                               {"namespace", "railyard-system"},
                                               {"name", "railyard-operator-7d9c-abcde"},
                                               {"uid", "0b1f6c1e-4a8e-4c3e-9d0f-1f2e3d4c5b6a"}});
  CHECK_FALSE(s.contains("notReadyAddresses"));
  // A selector-less Service matches an Endpoints port by the Service port's name.
  CHECK(s["ports"] == Json::array({{{"name", "rendezvous"}, {"port", 9090}, {"protocol", "TCP"}}}));
}

TEST_CASE("what the leader wrote is current; another replica's, a second address or another port is not") {
  const auto e = leader();
  Json stored = leader_endpoints_object(e);
  CHECK(leader_endpoints_current(stored, e));
  // Fields the API server adds do not make it stale.
  stored["metadata"]["resourceVersion"] = "42";
  stored["subsets"][0]["addresses"][0]["targetRef"]["resourceVersion"] = "7";
  stored["subsets"][0]["addresses"][0]["nodeName"] = "node-1";
  CHECK(leader_endpoints_current(stored, e));

  auto standby = e;
  standby.pod_ip = "10.244.2.9";
  standby.pod_name = "railyard-operator-7d9c-fghij";
  standby.pod_uid = "11111111-2222-3333-4444-555555555555";
  CHECK_FALSE(leader_endpoints_current(stored, standby));  // a new leader rewrites its predecessor's

  auto same_ip_new_pod = e;  // a pod IP reused by a new pod: the UID tells them apart
  same_ip_new_pod.pod_uid = "66666666-7777-8888-9999-000000000000";
  CHECK_FALSE(leader_endpoints_current(stored, same_ip_new_pod));

  Json two = leader_endpoints_object(e);
  two["subsets"][0]["addresses"].push_back({{"ip", "10.244.2.9"}});
  CHECK_FALSE(leader_endpoints_current(two, e));
  Json not_ready = leader_endpoints_object(e);
  not_ready["subsets"][0]["notReadyAddresses"] = Json::array({{{"ip", "10.244.2.9"}}});
  CHECK_FALSE(leader_endpoints_current(not_ready, e));
  Json other_port = leader_endpoints_object(e);
  other_port["subsets"][0]["ports"][0]["port"] = 9091;
  CHECK_FALSE(leader_endpoints_current(other_port, e));
  Json renamed_port = leader_endpoints_object(e);
  renamed_port["subsets"][0]["ports"][0]["name"] = "metrics";
  CHECK_FALSE(leader_endpoints_current(renamed_port, e));
  CHECK_FALSE(leader_endpoints_current(Json{{"kind", "Endpoints"}}, e));  // no subsets: nobody to route to
  CHECK_FALSE(leader_endpoints_current(Json{{"subsets", "x"}}, e));       // garbage from another writer
  CHECK_FALSE(leader_endpoints_current(Json{{"subsets", Json::array({1})}}, e));
}
