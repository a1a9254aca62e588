// Alertmanager webhook payloads (version "4"). Strict: a payload of another version or with a missing field is an
// Error naming the field, answered with 400 by the receiver.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace railyard::monitor {

struct Alert {
  std::string status;  // firing | resolved
  std::map<std::string, std::string> labels, annotations;
  std::string starts_at, fingerprint;
  std::string label(const std::string& k) const {
    auto it = labels.find(k);
    return it == labels.end() ? std::string() : it->second;
  }
};

struct AlertmanagerPayload {
  std::string receiver, status, group_key;
  std::vector<Alert> alerts;
};

AlertmanagerPayload parse_alertmanager_payload(const std::string& body);

}  // namespace railyard::monitor
