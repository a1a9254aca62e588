// The TrainingJob CRD keeps its promises: every leaf field under spec that the schema offers is read by some code.
// A field is covered when its last key appears as a string literal ("initFrom") in common/job_spec.cc
// (parse_job and resolved_config), or, for fields acted on elsewhere, in every file kAllowlist names for it. A new
// field nobody reads, or an allowlist entry the CRD no longer has, fails the test with the path named.
// Also: the chart's copy of the CRD is identical to deploy/crds/.
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tests/ctest_env.h"

namespace {

constexpr const char* kCrd = "deploy/crds/trainingjobs.railyard.dev.yaml";
constexpr const char* kChartCrd = "charts/railyard/files/crds/trainingjobs.railyard.dev.yaml";
constexpr const char* kJobSpec = "common/job_spec.cc";

// Fields that job_spec.cc does not read because another component acts on them, with the files that read them
// (each must contain the field's last key as a string literal). Keep it short and true: a field listed here must do
// what its description says in the file named.
const std::map<std::string, std::vector<std::string>> kAllowlist = {
    // Container resources of the worker pods: copied into the pod (pod_builder) and counted by placement.
    {"spec.resources.requests", {"operator/controller/pod_builder.cc", "operator/scheduler/placement.cc"}},
    {"spec.resources.limits", {"operator/controller/pod_builder.cc", "operator/scheduler/placement.cc"}},
    // Rail-aware placement: the controller's placement request (the scheduler acts on it).
    {"spec.placement.railAware", {"operator/scheduler/placement.cc"}},
    {"spec.placement.mode", {"operator/scheduler/placement.cc"}},
    {"spec.placement.topologyKeys", {"operator/scheduler/placement.cc"}},
};

std::string slurp(const std::string& rel) {
  std::ifstream in(railyard::test::source_path(rel), std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << railyard::test::source_path(rel));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every leaf property path of an OpenAPI schema node: a property without `properties` of its own (scalars, arrays,
// maps given by additionalProperties, and x-kubernetes-preserve-unknown-fields objects such as spec.template).
void leaf_paths(const YAML::Node& node, const std::string& path, std::vector<std::string>& out) {
  const YAML::Node props = node["properties"];
  if (!props || !props.IsMap() || props.size() == 0) {
    out.push_back(path);
    return;
  }
  for (const auto& kv : props) leaf_paths(kv.second, path + "." + kv.first.as<std::string>(), out);
}

std::vector<std::string> spec_leaves(const YAML::Node& crd) {
  const YAML::Node versions = crd["spec"]["versions"];
  REQUIRE(versions.IsSequence());
  std::vector<std::string> out;
  for (const auto& v : versions) leaf_paths(v["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec", out);
  return out;
}

std::string last_key(const std::string& path) { return path.substr(path.rfind('.') + 1); }

bool has_literal(const std::string& text, const std::string& key) {
  return text.find("\"" + key + "\"") != std::string::npos;
}

// The leaf paths no code reads, each with why ("no \"key\" in job_spec.cc", "no \"key\" in FILE"), plus allowlist
// entries that are not leaves of the schema. `read` returns a file's text by repository path.
template <typename Read>
std::vector<std::string> unread_fields(const std::vector<std::string>& leaves,
                                       const std::map<std::string, std::vector<std::string>>& allowlist, Read read) {
  std::vector<std::string> problems;
  const std::string job_spec = read(kJobSpec);
  for (const auto& path : leaves) {
    const std::string key = last_key(path);
    auto it = allowlist.find(path);
    if (it == allowlist.end()) {
      if (!has_literal(job_spec, key))
        problems.push_back(path + ": no \"" + key + "\" in " + kJobSpec +
                           " (read it there, list it in kAllowlist with the file that reads it, or drop it from the "
                           "CRD)");
      continue;
    }
    for (const auto& file : it->second)
      if (!has_literal(read(file), key))
        problems.push_back(path + ": kAllowlist names " + file + " but it has no \"" + key + "\"");
  }
  const std::set<std::string> known(leaves.begin(), leaves.end());
  for (const auto& [path, files] : allowlist)
    if (!known.count(path)) problems.push_back(path + ": in kAllowlist but not a leaf field of the CRD's spec");
  return problems;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += "\n  " + l;
  return out;
}

}  // namespace

TEST_CASE("every field of the TrainingJob CRD's spec is read by some code") {
  const YAML::Node crd = YAML::Load(slurp(kCrd));
  const std::vector<std::string> leaves = spec_leaves(crd);
  // A sanity floor (the schema has over sixty leaves): a broken walk must not pass vacuously.
  REQUIRE(leaves.size() > 50);
  for (const char* p : {"spec.model.initFrom", "spec.data.train", "spec.data.val", "spec.template",
                        "spec.placement.nodeSelector", "spec.resources.requests"})
    CHECK_MESSAGE(std::count(leaves.begin(), leaves.end(), p) == 1, p);
  std::map<std::string, std::string> cache;
  auto read = [&](const std::string& rel) -> const std::string& {
    auto it = cache.find(rel);
    if (it == cache.end()) it = cache.emplace(rel, slurp(rel)).first;
    return it->second;
  };
  const auto problems = unread_fields(leaves, kAllowlist, read);
  CHECK_MESSAGE(problems.empty(), "fields of " << std::string(kCrd) << " that no code reads:" << joined(problems));
}

TEST_CASE("the coverage check itself: an unread field, a stale allowlist entry and a wrong file are reported") {
  const YAML::Node crd = YAML::Load(R"(
spec:
  versions:
    - name: v1alpha1
      schema:
        openAPIV3Schema:
          properties:
            spec:
              properties:
                model:
                  properties:
                    initFrom: {type: string}
                    shinyNewField: {type: string}
                training:
                  properties:
                    learningRate: {type: number}
                    seed: {type: integer}
                template: {type: object, x-kubernetes-preserve-unknown-fields: true}
)");
  const std::vector<std::string> leaves = spec_leaves(crd);
  CHECK(leaves == std::vector<std::string>{"spec.model.initFrom", "spec.model.shinyNewField",
                                           "spec.training.learningRate", "spec.training.seed", "spec.template"});
  auto read = [](const std::string& rel) -> std::string {
    if (rel == kJobSpec) return R"(c.string(model, "initFrom", "spec.model.initFrom"); spec["template"];)";
    if (rel == "worker/config_file.cc") return R"(set("lr", get(tr, "learningRate"));)";
    return "";
  };
  const std::map<std::string, std::vector<std::string>> allowlist = {
      {"spec.training.learningRate", {"worker/config_file.cc"}},
      {"spec.training.seed", {"monitor/rules.cc"}},
      {"spec.gone", {"worker/config_file.cc"}}};
  const auto problems = unread_fields(leaves, allowlist, read);
  REQUIRE(problems.size() == 3);
  CHECK(problems[0].find("spec.model.shinyNewField: no \"shinyNewField\" in common/job_spec.cc") == 0);
  CHECK(problems[1] == "spec.training.seed: kAllowlist names monitor/rules.cc but it has no \"seed\"");
  CHECK(problems[2] == "spec.gone: in kAllowlist but not a leaf field of the CRD's spec");
}

TEST_CASE("the Helm chart's copy of the CRD is identical to deploy/crds/") {
  const bool same = slurp(kCrd) == slurp(kChartCrd);
  CHECK_MESSAGE(same, std::string(kChartCrd) << " differs from " << std::string(kCrd) << ": cp " << std::string(kCrd)
                                             << " charts/railyard/files/crds/");
}
