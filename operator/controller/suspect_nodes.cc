#include "operator/controller/suspect_nodes.h"

#include "common/kube/client.h"

namespace railyard::op {

void SuspectNodes::add(const std::string& job_key, const std::string& node, Time now) {
  std::lock_guard<std::mutex> l(mu_);
  by_job_[job_key][node] = now;
}

void SuspectNodes::forget(const std::string& job_key) {
  std::lock_guard<std::mutex> l(mu_);
  by_job_.erase(job_key);
}

std::optional<SuspectNodes::Time> ready_transition(const Json& node) {
  if (!node.is_object() || !node.contains("status") || !node["status"].is_object()) return std::nullopt;
  const Json conditions = node["status"].value("conditions", Json::array());
  if (!conditions.is_array()) return std::nullopt;
  for (const Json& c : conditions) {
    if (!c.is_object() || c.value("type", Json()) != "Ready") continue;
    const Json t = c.value("lastTransitionTime", Json());
    if (!t.is_string()) return std::nullopt;
    try {
      return kube::parse_rfc3339(t.get<std::string>());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace railyard::op
