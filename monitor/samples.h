// Samples and the two formats they arrive in: the Prometheus text exposition format (embedded mode scrapes workers
// directly) and the JSON answer of Prometheus's instant-query API. Both parsers are strict: anything malformed is a
// railyard::Error naming the line or JSON path, never a crash and never a silently skipped sample.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace railyard::monitor {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
  std::string label(const std::string& key) const {
    auto it = labels.find(key);
    return it == labels.end() ? std::string() : it->second;
  }
};

// Text format 0.0.4. `source` names the input in errors ("http://127.0.0.2:9400/metrics").
std::vector<Sample> parse_text_format(const std::string& text, const std::string& source);

// A /api/v1/query response whose resultType is "vector" (or "scalar", returned as one unnamed sample).
std::vector<Sample> parse_query_response(const std::string& body, const std::string& source);

// Parses a sample value: a decimal or "NaN", "+Inf", "-Inf", "Inf". Throws Error naming `what`.
double parse_value(const std::string& text, const std::string& what);

}  // namespace railyard::monitor
