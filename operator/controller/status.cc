#include "operator/controller/status.h"

namespace railyard::op {

bool set_condition(Json& status, const std::string& type, bool value, const std::string& reason,
                   const std::string& message, const std::string& now) {
  if (!status.contains("conditions") || !status["conditions"].is_array()) status["conditions"] = Json::array();
  const std::string v = value ? "True" : "False";
  for (Json& c : status["conditions"]) {
    if (c.value("type", "") != type) continue;
    bool changed = false;
    if (c.value("status", "") != v) {
      c["status"] = v;
      c["lastTransitionTime"] = now;
      changed = true;
    }
    if (c.value("reason", "") != reason) {
      c["reason"] = reason;
      changed = true;
    }
    if (c.value("message", "") != message) {
      c["message"] = message;
      changed = true;
    }
    return changed;
  }
  status["conditions"].push_back(
      {{"type", type}, {"status", v}, {"reason", reason}, {"message", message}, {"lastTransitionTime", now}});
  return true;
}

void stamp_conditions(Json& status) {
  if (!status.is_object() || !status.contains("conditions") || !status["conditions"].is_array()) return;
  const Json gen = status.value("observedGeneration", Json());
  if (!gen.is_number_integer()) return;
  for (Json& c : status["conditions"]) c["observedGeneration"] = gen;
}

std::optional<Json> find_condition(const Json& status, const std::string& type) {
  if (!status.is_object() || !status.contains("conditions") || !status["conditions"].is_array()) return std::nullopt;
  for (const Json& c : status["conditions"])
    if (c.value("type", "") == type) return c;
  return std::nullopt;
}

bool condition_true(const Json& status, const std::string& type) {
  auto c = find_condition(status, type);
  return c && c->value("status", "") == "True";
}

}  // namespace railyard::op
