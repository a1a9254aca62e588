#include "operator/controller/leader_endpoints.h"

namespace railyard::op {

namespace {
kube::Json subsets_of(const LeaderEndpoint& e) {
  kube::Json address = {{"ip", e.pod_ip}};
  if (!e.pod_name.empty()) {
    address["targetRef"] = {{"kind", "Pod"}, {"namespace", e.ns}, {"name", e.pod_name}};
    if (!e.pod_uid.empty()) address["targetRef"]["uid"] = e.pod_uid;
  }
  return kube::Json::array(
      {{{"addresses", kube::Json::array({address})},
        {"ports", kube::Json::array({{{"name", e.port_name}, {"port", e.port}, {"protocol", "TCP"}}})}}});
}
}  // namespace

kube::Json leader_endpoints_object(const LeaderEndpoint& e) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Endpoints"},
      {"metadata",
       {{"name", e.name}, {"namespace", e.ns}, {"labels", {{"app.kubernetes.io/managed-by", "railyard-operator"}}}}},
      {"subsets", subsets_of(e)}};
}

bool leader_endpoints_current(const kube::Json& current, const LeaderEndpoint& e) {
  // What matters, not the JSON as written: the API server may add defaults to what it stores.
  const auto& subsets = current.value("subsets", kube::Json::array());
  if (!subsets.is_array() || subsets.size() != 1 || !subsets[0].is_object()) return false;
  const auto& s = subsets[0];
  if (s.contains("notReadyAddresses") && !s["notReadyAddresses"].empty()) return false;
  const auto& addresses = s.value("addresses", kube::Json::array());
  const auto& ports = s.value("ports", kube::Json::array());
  if (!addresses.is_array() || addresses.size() != 1 || !ports.is_array() || ports.size() != 1) return false;
  const auto& a = addresses[0];
  const auto& p = ports[0];
  if (!a.is_object() || !p.is_object()) return false;
  if (a.value("ip", "") != e.pod_ip || p.value("port", 0) != e.port || p.value("name", "") != e.port_name) return false;
  const auto ref = a.value("targetRef", kube::Json::object());
  return ref.is_object() && ref.value("name", "") == e.pod_name && ref.value("uid", "") == e.pod_uid;
}

bool publish_leader_endpoints(kube::Client& client, const LeaderEndpoint& e) {
  auto current = client.try_get(kube::resources::endpoints, e.ns, e.name);
  if (!current) {
    client.create(kube::resources::endpoints, e.ns, leader_endpoints_object(e));
    return true;
  }
  if (leader_endpoints_current(*current, e)) return false;
  // A copy of what was read, with this replica's subsets: the resourceVersion it carries makes a concurrent write
  // a conflict rather than a lost update.
  kube::Json next = *current;
  next["subsets"] = subsets_of(e);
  client.update(kube::resources::endpoints, e.ns, next);
  return true;
}

}  // namespace railyard::op
