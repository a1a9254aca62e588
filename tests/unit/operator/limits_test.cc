// Issue #40: no spec can crash, stall or exhaust the operator. Every integer field of the TrainingJob CRD is driven
// over the whole integer range (alone and in pairs) through parse_job and what the controller calls on a spec it
// accepts; each either parses or is refused naming a field. The CRD's maxima are the ones parse_job holds a spec to.
// Run under the sanitizer tree (RAILYARD_SANITIZE=address: UBSan) this also catches overflow that does not trap.
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <climits>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "operator/api.h"
#include "operator/scheduler/placement.h"
#include "tests/ctest_env.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::job_with;
using railyard::op::testing::valid_job;
using Json = nlohmann::json;

namespace {

// An integer field of the CRD's spec: its path ("spec.training.microBatch"; "[]" for the items of a list) and bounds.
struct IntField {
  std::string path;
  std::optional<int64_t> min, max;
  bool has_enum = false;
};

void collect_ints(const YAML::Node& node, const std::string& path, std::vector<IntField>& out) {
  if (node["type"] && node["type"].as<std::string>() == "integer") {
    IntField f{path, std::nullopt, std::nullopt, bool(node["enum"])};
    if (node["minimum"]) f.min = node["minimum"].as<int64_t>();
    if (node["maximum"]) f.max = node["maximum"].as<int64_t>();
    out.push_back(f);
  }
  if (node["items"]) collect_ints(node["items"], path + "[]", out);
  if (const YAML::Node props = node["properties"])
    for (auto it = props.begin(); it != props.end(); ++it)
      collect_ints(it->second, path + "." + it->first.as<std::string>(), out);
}

std::vector<IntField> crd_int_fields() {
  std::ifstream in(railyard::test::source_path("deploy/crds/trainingjobs.railyard.dev.yaml"));
  std::stringstream text;
  text << in.rdbuf();
  const YAML::Node crd = YAML::Load(text.str());
  std::vector<IntField> out;
  collect_ints(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec", out);
  return out;
}

// `job` with the field at `path` set to `v` (a list's items: a list of one).
void set_field(Json& job, const std::string& path, const Json& v) {
  Json* at = &job;
  std::string rest = path;
  while (!rest.empty()) {
    const size_t dot = rest.find('.');
    std::string key = rest.substr(0, dot);
    rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
    const bool list = key.size() > 2 && key.compare(key.size() - 2, 2, "[]") == 0;
    if (list) key.resize(key.size() - 2);
    if (!at->is_object()) *at = Json::object();
    at = &(*at)[key];
    if (list) {
      *at = Json::array({v});
      return;
    }
  }
  *at = v;
}

// The field name a violation about `path` carries ("spec.x[]" is reported as "spec.x[0]").
std::string reported(const std::string& path) {
  const size_t b = path.find("[]");
  return b == std::string::npos ? path : path.substr(0, b) + "[0]" + path.substr(b + 2);
}

// A valid job in which `path` is read: a custom model for the model's sizes, experts for the MoE fields, a program
// for spec.program's.
Json base_for(const std::string& path) {
  if (path.rfind("spec.program.", 0) == 0)
    return job_with(Json::parse(R"({"spec": {"model": null, "data": null, "training": null, "parallelism": null,
        "program": {"command": ["python3", "train.py"]}}})"));
  if (path.rfind("spec.model.moe.", 0) == 0) return job_with({{"spec", {{"model", {{"moe", {{"experts", 8}}}}}}}});
  if (path.rfind("spec.model.", 0) == 0)
    return job_with(Json::parse(R"({"spec": {"model": {"preset": "custom", "layers": 4, "hidden": 128, "heads": 4,
        "seqLen": 64, "vocab": 50257}}})"));
  return valid_job();
}

// The controller's use of a spec parse_job accepted, as the reconcile and the fuzzer make it.
void use_accepted(const JobSpec& spec) {
  const WorldLayout w = world_layout(spec, spec.replicas);
  REQUIRE(w.size > 0);
  REQUIRE(w.data > 0);
  for (int available : {0, 1, spec.replicas - 1, spec.replicas}) {
    const int k = elastic_world_replicas(spec, available);
    REQUIRE(k >= 0);
    REQUIRE(k <= spec.replicas);
  }
  (void)check_family(spec, spec.replicas);
  (void)resolved_config(spec, spec.replicas);
}

// parse_job either accepts (and what follows works) or names a field, a reason and a fix.
void parses_or_names_a_field(const Json& job, const std::string& what) {
  CAPTURE(what);
  const ParsedJob p = parse_job(job);
  if (!p.violation) {
    use_accepted(p.spec);
    return;
  }
  const Violation& v = *p.violation;
  CHECK_MESSAGE(v.field.rfind("spec", 0) == 0, v.field);
  CHECK(!v.reason.empty());
  CHECK_MESSAGE(v.message.rfind(v.field + ": ", 0) == 0, v.message);
}

std::vector<Json> extreme_values() {
  std::vector<Json> out = {0,
                           1,
                           -1,
                           2,
                           INT32_MAX,
                           INT32_MIN,
                           int64_t{INT32_MAX} + 1,
                           int64_t{1} << 30,
                           (int64_t{1} << 30) + 1,
                           int64_t{1} << 32,
                           int64_t{1} << 40,
                           INT64_MAX,
                           INT64_MIN,
                           UINT64_MAX,
                           1e300,
                           -1e300,
                           1073741824.0};
  std::mt19937_64 rng(40);  // seeded: a failure reproduces
  for (int i = 0; i < 24; ++i) out.push_back(static_cast<int64_t>(rng()) >> (rng() % 63));
  return out;
}

// The job of issue #40 that SIGFPE'd the operator: microBatch*data wrapped to 0 in an int.
Json sigfpe_job() {
  return job_with(Json::parse(R"({"spec": {"replicas": 4, "parallelism": null,
      "training": {"globalBatch": 8, "microBatch": 1073741824}}})"));
}

}  // namespace

TEST_CASE("issue #40: globalBatch 8, microBatch 2^30 on 4 replicas is Invalid naming spec.training.microBatch") {
  const ParsedJob p = parse_job(sigfpe_job());
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.training.microBatch");
  CHECK(p.violation->reason == "InvalidTrainingMicroBatch");
  CHECK_MESSAGE(p.violation->message.find("1073741824 exceeds globalBatch 8") != std::string::npos,
                p.violation->message);
  CHECK_MESSAGE(p.violation->message.find("divides globalBatch/data = 2") != std::string::npos, p.violation->message);
  // With the data degree written out, the same.
  const ParsedJob q = parse_job(job_with(Json::parse(R"({"spec": {"replicas": 4, "parallelism": {"data": 4},
      "training": {"globalBatch": 8, "microBatch": 1073741824}}})")));
  REQUIRE(q.violation);
  CHECK(q.violation->field == "spec.training.microBatch");
  // A microBatch within globalBatch whose product with data is not: the batch is the field, as before.
  const ParsedJob r = parse_job(job_with(Json::parse(R"({"spec": {"replicas": 4, "parallelism": null,
      "training": {"globalBatch": 2, "microBatch": 1}}})")));
  REQUIRE(r.violation);
  CHECK(r.violation->field == "spec.training.globalBatch");
  // microBatch above globalBatch on more ranks than sequences: the fix says to raise the batch.
  const ParsedJob t = parse_job(job_with(Json::parse(R"({"spec": {"replicas": 4, "parallelism": null,
      "training": {"globalBatch": 2, "microBatch": 3}}})")));
  REQUIRE(t.violation);
  CHECK(t.violation->field == "spec.training.microBatch");
  CHECK_MESSAGE(t.violation->message.find("raise globalBatch to a multiple of data 4") != std::string::npos,
                t.violation->message);
}

TEST_CASE("degree products that overflow an int are refused naming the degree") {
  // tensor*pipeline*context = 4*1024*2^20 = 2^32 wrapped to 0 and `world % 0` trapped.
  const Json custom = Json::parse(R"({"preset": "custom", "layers": 1024, "hidden": 1024, "heads": 16,
      "seqLen": 1048576, "vocab": 2})");
  Json j =
      job_with({{"spec",
                 {{"replicas", 1},
                  {"procsPerReplica", 4},
                  {"model", custom},
                  {"training", {{"seqLen", 1048576}}},
                  {"parallelism", {{"data", nullptr}, {"tensor", 4}, {"pipeline", 1024}, {"context", 1048576}}}}}});
  ParsedJob p = parse_job(j);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.parallelism.context");
  CHECK_MESSAGE(p.violation->message.find("4294967296 does not divide the world size 4") != std::string::npos,
                p.violation->message);
  // data*context*tensor*pipeline = 2^24 * 2^40 overflows even 64 bits.
  j["spec"]["parallelism"] = {{"data", 1 << 24}, {"tensor", 1024}, {"pipeline", 1024}, {"context", 1048576}};
  p = parse_job(j);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.parallelism.data");
  CHECK_MESSAGE(p.violation->message.find("overflows a 64-bit integer") != std::string::npos, p.violation->message);
}

TEST_CASE("checked_product and saturating_add refuse overflow instead of wrapping") {
  CHECK(railyard::checked_product({1073741824, 4}) == int64_t{1} << 32);
  CHECK_FALSE(railyard::checked_product({1073741824, 4}, INT32_MAX));  // beyond an int's range
  CHECK(railyard::checked_product({1073741824, 1}, INT32_MAX) == 1073741824);
  CHECK_FALSE(railyard::checked_product({int64_t{1} << 40, int64_t{1} << 24}));  // 2^64
  CHECK(railyard::checked_product({-3, 5}) == -15);
  CHECK(railyard::checked_product({}) == 1);
  CHECK(railyard::saturating_add(INT64_MAX, 1) == INT64_MAX);
  CHECK(railyard::saturating_add(INT64_MIN, -1) == INT64_MIN);
  CHECK(railyard::saturating_add(40, 2) == 42);
}

TEST_CASE("every integer field of the CRD has a maximum, and parse_job holds a spec to the same bounds") {
  const std::vector<IntField> fields = crd_int_fields();
  REQUIRE(fields.size() > 30);
  for (const IntField& f : fields) {
    CAPTURE(f.path);
    if (f.has_enum) continue;  // an enum bounds it
    REQUIRE_MESSAGE(f.max, f.path << " has no maximum in the CRD");
    REQUIRE(f.min);
    // One past the maximum (and below the minimum) is refused naming the field; the maximum itself is in range.
    Json over = base_for(f.path);
    set_field(over, f.path, *f.max == INT64_MAX ? Json(uint64_t{INT64_MAX} + 1) : Json(*f.max + 1));
    const ParsedJob po = parse_job(over);
    REQUIRE_MESSAGE(po.violation, f.path << " = maximum+1 was accepted: the CRD and job_spec.cc disagree");
    CHECK(po.violation->field == reported(f.path));
    CHECK_MESSAGE(po.violation->message.find("out of range") != std::string::npos, po.violation->message);
    Json under = base_for(f.path);
    set_field(under, f.path, *f.min - 1);
    const ParsedJob pu = parse_job(under);
    REQUIRE(pu.violation);
    CHECK(pu.violation->field == reported(f.path));
    Json at = base_for(f.path);
    set_field(at, f.path, *f.max);
    const ParsedJob pa = parse_job(at);
    if (pa.violation)  // another rule may refuse it (tensor 1024 on 1 proc), never the range
      CHECK_MESSAGE(pa.violation->message.find("out of range") == std::string::npos, pa.violation->message);
  }
}

TEST_CASE("every bound of the CRD survives the API server's float64: at most 2^53 in magnitude") {
  // The API server keeps a schema's minimum and maximum as float64 (JSONSchemaProps). A maximum of INT64_MAX rounded to
  // 2^63 and came back as INT64_MIN: the CRD refused every spec.training.seed, its default included, and did not
  // install. Every integer of magnitude up to 2^53 is an exact double.
  constexpr int64_t kExact = int64_t{1} << 53;
  for (const IntField& f : crd_int_fields()) {
    CAPTURE(f.path);
    if (f.max) CHECK(*f.max <= kExact);
    if (f.min) CHECK(*f.min >= -kExact);
  }
  CHECK(kMaxSeed == kExact - 1);
}

TEST_CASE("replicas are bounded by kMaxReplicas, as documented") {
  CHECK(kMaxReplicas == 10000);
  Json j = job_with(Json::parse(R"({"spec": {"replicas": 10001, "parallelism": null, "training": {"globalBatch": 8,
      "microBatch": 1}}})"));
  ParsedJob p = parse_job(j);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.replicas");
  CHECK(p.violation->message == "spec.replicas: 10001 is out of range: use a value from 1 to 10000");
  j["spec"]["replicas"] = 10000;
  j["spec"]["training"]["globalBatch"] = 10000;
  p = parse_job(j);
  CHECK_FALSE(p.violation);
}

TEST_CASE("property: every integer field over the integer range parses or names a field, alone and in pairs") {
  const std::vector<IntField> fields = crd_int_fields();
  const std::vector<Json> values = extreme_values();
  // Three starting points: the built-in trainer with explicit degrees, with parallelism.auto (cross-field checks
  // skipped) and a program (no batch rules).
  const std::vector<Json> bases = {
      valid_job(), job_with(Json::parse(R"({"spec": {"parallelism": {"auto": true, "data": null}}})")),
      job_with(Json::parse(R"({"spec": {"model": null, "data": null, "training": null, "parallelism": null,
          "program": {"command": ["python3", "train.py"]}}})"))};
  int runs = 0;
  for (const Json& base : bases)
    for (const IntField& f : fields)
      for (const Json& v : values) {
        Json j = base;
        set_field(j, f.path, v);
        parses_or_names_a_field(j, f.path + " = " + v.dump());
        ++runs;
      }
  // Pairs of large values: where products of two fields overflowed.
  const std::vector<Json> large = {int64_t{1} << 30, INT32_MAX, int64_t{1} << 31, int64_t{1} << 40};
  for (size_t a = 0; a < fields.size(); ++a)
    for (size_t b = a + 1; b < fields.size(); ++b)
      for (const Json& va : large)
        for (const Json& vb : large) {
          Json j = valid_job();
          j["spec"]["parallelism"] = Json::object();  // no data degree: the batch rules are reached
          set_field(j, fields[a].path, va);
          set_field(j, fields[b].path, vb);
          parses_or_names_a_field(j, fields[a].path + " = " + va.dump() + ", " + fields[b].path + " = " + vb.dump());
          ++runs;
        }
  // Each field at its own maximum (and the large values within range) paired: the largest products parse_job accepts.
  for (size_t a = 0; a < fields.size(); ++a)
    for (size_t b = a + 1; b < fields.size(); ++b) {
      if (!fields[a].max || !fields[b].max) continue;
      Json j = valid_job();
      j["spec"]["parallelism"] = Json::object();
      set_field(j, fields[a].path, *fields[a].max);
      set_field(j, fields[b].path, *fields[b].max);
      parses_or_names_a_field(j, fields[a].path + " and " + fields[b].path + " at their maxima");
      ++runs;
    }
  CHECK(runs > 10000);
}

TEST_CASE("a pod's resource totals saturate instead of wrapping negative") {
  // Two containers of 9e15 CPUs each: 9e18 milli-CPUs, the sum beyond int64.
  const Json pod = Json::parse(R"({"spec": {"containers": [
      {"resources": {"requests": {"cpu": "9000000000000000", "memory": 1e300}}},
      {"resources": {"requests": {"cpu": "9000000000000000"}}}]}})");
  const PodRequests r = pod_requests(pod);
  CHECK(r.cpu_milli == INT64_MAX);
  CHECK(r.memory == 0);  // 1e300 bytes is no quantity (it was undefined behaviour to convert)
  NodeInfo n;
  n.cpu_allocatable_milli = 64000;
  n.cpu_used_milli = 1000;
  n.memory_allocatable = int64_t{1} << 40;
  CHECK(resource_shortfall(n, r) == "cpu");
}
