// The restart request contract between railyard-monitor, which writes it, and railyard-operator, which acts on it
// (docs/monitor.md): the annotation keys on a TrainingJob and the JSON the monitor writes into
// railyard.dev/restart-request. Shared by both sides, which may not depend on each other (like rendezvous_protocol.h).
// A person may write any text into the annotation ("now"): it still requests a restart, with no details.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace railyard {

// A new value requests one checkpoint-restart of the job's current generation.
inline constexpr const char* kRestartRequestAnnotation = "railyard.dev/restart-request";
// Who asked ("monitor"; "annotation" when absent): status.lastRestart.detector.
inline constexpr const char* kRestartDetectorAnnotation = "railyard.dev/restart-detector";
// The operator's acknowledgement: the last request value it handled (acted on, or ignored after the job finished).
inline constexpr const char* kRestartHandledAnnotation = "railyard.dev/restart-handled";
// Nodes blamed for failures (comma-separated), kept off by placement when the job sets excludeFailedNodes.
inline constexpr const char* kExcludeNodesAnnotation = "railyard.dev/exclude-nodes";

struct RestartRequest {
  std::string reason;    // the symptom, a short word: Hang, Straggler, NaN, ...
  std::string rule;      // the monitor rule that fired (or "alertmanager")
  std::string node;      // the node blamed, if any
  std::string evidence;  // human-readable
  std::string detector = "monitor";
  std::string source = "rules";  // rules or alertmanager
  std::string time;              // when requested (RFC 3339)
  std::string onset;  // when the condition began (RFC 3339): time to detect = time - onset; empty when unknown
  int rank = -1;      // the rank blamed; -1 when none
  // The generation the request is about. Every request the monitor writes has one; a hand-written JSON may not.
  std::optional<int64_t> generation;
};

// Compact JSON, stable key order. onset and generation are left out when unset.
inline std::string format_restart_request(const RestartRequest& r) {
  nlohmann::json j = nlohmann::json::object();
  j["reason"] = r.reason;
  j["rule"] = r.rule;
  j["rank"] = r.rank;
  j["node"] = r.node;
  j["evidence"] = r.evidence;
  if (r.generation) j["generation"] = *r.generation;
  j["detector"] = r.detector;
  j["source"] = r.source;
  j["time"] = r.time;
  if (!r.onset.empty()) j["onset"] = r.onset;
  return j.dump();
}

// The request's fields; nullopt when the value is not a JSON object (a hand-written "now"). What the object lacks (or
// holds with the wrong type) stays empty, -1 or unset, so a hand-written object never fails a restart.
inline std::optional<RestartRequest> parse_restart_request(const std::string& value) {
  const nlohmann::json j = nlohmann::json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  RestartRequest r;
  r.detector.clear();
  r.source.clear();
  auto str = [&](const char* k, std::string* out) {
    if (j.contains(k) && j[k].is_string()) *out = j[k].get<std::string>();
  };
  str("reason", &r.reason);
  str("rule", &r.rule);
  str("node", &r.node);
  str("evidence", &r.evidence);
  str("detector", &r.detector);
  str("source", &r.source);
  str("time", &r.time);
  str("onset", &r.onset);
  // Anyone who may patch the job writes this annotation: a rank outside int (or a negative one other than -1) blames
  // no rank rather than another one by wrap-around, and a generation beyond int64 is no generation.
  if (j.contains("rank") && j["rank"].is_number_integer() && !j["rank"].is_number_unsigned() &&
      j["rank"].get<int64_t>() >= -1 && j["rank"].get<int64_t>() <= std::numeric_limits<int>::max())
    r.rank = static_cast<int>(j["rank"].get<int64_t>());
  else if (j.contains("rank") && j["rank"].is_number_unsigned() &&
           j["rank"].get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int>::max()))
    r.rank = static_cast<int>(j["rank"].get<uint64_t>());
  if (j.contains("generation") && j["generation"].is_number_integer() &&
      (!j["generation"].is_number_unsigned() ||
       j["generation"].get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
    r.generation = j["generation"].get<int64_t>();
  return r;
}

// The node list of kExcludeNodesAnnotation: "a,b,c". Its names in order, blanks around them and empty items dropped.
inline std::vector<std::string> split_node_list(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

// The operator reads the list as a set.
inline std::set<std::string> parse_node_list(const std::string& list) {
  const std::vector<std::string> names = split_node_list(list);
  return {names.begin(), names.end()};
}

// The monitor adds the node a verdict blamed, keeping the list's order and each name once.
inline std::string add_to_node_list(const std::string& list, const std::string& node) {
  std::vector<std::string> names = split_node_list(list);
  names.push_back(node);
  std::set<std::string> seen;
  std::string out;
  for (const std::string& n : names)
    if (!n.empty() && seen.insert(n).second) out += (out.empty() ? "" : ",") + n;
  return out;
}

}  // namespace railyard
