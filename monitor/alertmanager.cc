#include "monitor/alertmanager.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace railyard::monitor {

AlertmanagerPayload parse_alertmanager_payload(const std::string& body) {
  using nlohmann::json;
  json doc = json::parse(body, nullptr, false);
  auto fail = [](const std::string& what) { throw Error("alertmanager payload: " + what); };
  if (doc.is_discarded()) fail("body is not JSON");
  if (!doc.is_object()) fail("body is not a JSON object");
  if (!doc.contains("version") || !doc["version"].is_string())
    fail("field 'version' is missing (expected \"4\"; configure a webhook_config receiver)");
  if (doc["version"] != "4")
    fail("field 'version' is \"" + doc["version"].get<std::string>() + "\", only \"4\" is supported");
  auto str = [&](const json& o, const std::string& key, const std::string& path, bool required) {
    if (!o.contains(key)) {
      if (required) fail("field '" + path + key + "' is missing");
      return std::string();
    }
    if (!o[key].is_string()) fail("field '" + path + key + "' is not a string");
    return o[key].get<std::string>();
  };
  auto str_map = [&](const json& o, const std::string& key, const std::string& path, bool required) {
    std::map<std::string, std::string> out;
    if (!o.contains(key)) {
      if (required) fail("field '" + path + key + "' is missing");
      return out;
    }
    if (!o[key].is_object()) fail("field '" + path + key + "' is not an object");
    for (auto it = o[key].begin(); it != o[key].end(); ++it) {
      if (!it.value().is_string()) fail("field '" + path + key + "." + it.key() + "' is not a string");
      out[it.key()] = it.value().get<std::string>();
    }
    return out;
  };
  AlertmanagerPayload p;
  p.status = str(doc, "status", "", true);
  p.receiver = str(doc, "receiver", "", false);
  p.group_key = str(doc, "groupKey", "", false);
  if (!doc.contains("alerts")) fail("field 'alerts' is missing");
  if (!doc["alerts"].is_array()) fail("field 'alerts' is not an array");
  for (size_t i = 0; i < doc["alerts"].size(); ++i) {
    const json& a = doc["alerts"][i];
    std::string path = "alerts[" + std::to_string(i) + "].";
    if (!a.is_object()) fail("field 'alerts[" + std::to_string(i) + "]' is not an object");
    Alert al;
    al.status = str(a, "status", path, true);
    if (al.status != "firing" && al.status != "resolved")
      fail("field '" + path + "status' is \"" + al.status + "\" (expected firing or resolved)");
    al.labels = str_map(a, "labels", path, true);
    al.annotations = str_map(a, "annotations", path, false);
    al.starts_at = str(a, "startsAt", path, false);
    al.fingerprint = str(a, "fingerprint", path, false);
    if (al.label("alertname").empty()) fail("field '" + path + "labels.alertname' is missing");
    p.alerts.push_back(std::move(al));
  }
  return p;
}

}  // namespace railyard::monitor
