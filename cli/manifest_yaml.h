// Kubernetes manifests as JSON values: YAML (one or more `---` documents) in, block-style YAML out. YAML's plain
// scalars are typed as a YAML 1.2 core schema reader (and the API server) types them: integers, floats, true/false,
// null; quoted scalars stay strings. The emitter quotes a string whenever reading it back would give another type.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace railyard::cli {

// Every non-empty document of `text`; throws railyard::Error naming `origin` and the line on a YAML syntax error.
std::vector<nlohmann::json> parse_manifests(const std::string& text, const std::string& origin);

// `value` as block-style YAML (a map or a list at the top), ending in a newline.
std::string to_yaml(const nlohmann::json& value);

}  // namespace railyard::cli
