// One test per fuzzer finding, stating the behaviour the fix guarantees (the crashing inputs themselves are under
// regressions/<fuzzer>/ and replayed by fuzz_replay_<fuzzer>). docs/hardening.md lists the findings.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "checkpoint/format.h"
#include "common/error.h"
#include "common/kube/client.h"
#include "operator/api.h"
#include "tests/unit/operator/job_fixture.h"

using nlohmann::json;

TEST_CASE("job_spec: integers beyond int64 are out of range, not undefined behaviour (fuzz_job_spec)") {
  using railyard::op::testing::job_with;
  for (const char* steps : {"2e116", "1e300", "-9.3e18", "18446744073709551615", "9223372036854775808"}) {
    INFO("steps: ", steps);
    auto parsed =
        railyard::op::parse_job(job_with(json::parse(std::string(R"({"spec":{"training":{"steps":)") + steps + "}}}")));
    REQUIRE(parsed.violation);
    CHECK(parsed.violation->field == "spec.training.steps");
    CHECK(parsed.violation->message.find("out of range") != std::string::npos);
  }
  // Whole floats inside the range still count as integers.
  auto ok = railyard::op::parse_job(job_with(json::parse(R"({"spec":{"training":{"steps":300.0}}})")));
  CHECK_FALSE(ok.violation);
  CHECK(ok.spec.steps == 300);
}

TEST_CASE("job_spec: a metadata of the wrong shape is not an exception (fuzz_job_spec)") {
  using railyard::op::testing::job_with;
  railyard::op::ParsedJob parsed;
  CHECK_NOTHROW(parsed = railyard::op::parse_job(job_with(json::parse(R"({"metadata":{"namespace":2}})"))));
  CHECK(parsed.spec.ns.empty());
  CHECK(parsed.spec.name == "tiny");
  CHECK_NOTHROW(parsed = railyard::op::parse_job(job_with(json::parse(R"({"metadata":{"name":["x"]}})"))));
  CHECK(parsed.spec.name.empty());
  CHECK_NOTHROW(parsed = railyard::op::parse_job(job_with(json::parse(R"({"metadata":7})"))));
  CHECK(parsed.spec.name.empty());
}

TEST_CASE("watch_stream: ADDED/MODIFIED/DELETED events without an object are malformed (fuzz_watch_stream)") {
  using railyard::kube::parse_watch_line;
  for (const char* line : {R"({"type":"ADDED"})", R"({"type":"MODIFIED","object":null})",
                           R"({"type":"DELETED","object":[1]})", R"({"typeobject":{},"type":"ADDED"})"}) {
    INFO("line: ", line);
    CHECK_THROWS_AS(parse_watch_line(line, "GET /api/v1/pods?watch=1"), railyard::Error);
  }
  // A bookmark needs no object; a real event still parses.
  CHECK(parse_watch_line(R"({"type":"BOOKMARK"})", "t"));
  CHECK(parse_watch_line(R"({"type":"ADDED","object":{"metadata":{"name":"a"}}})", "t")->object.is_object());
}

TEST_CASE("watch_stream: an ERROR event whose Status has a non-string kind is an ApiError (fuzz_watch_stream)") {
  CHECK_THROWS_AS(railyard::kube::parse_watch_line(R"({"type":"ERROR","object":{"kind":410,"code":410}})", "t"),
                  railyard::kube::Gone);
  CHECK_THROWS_AS(railyard::kube::throw_api_error(503, R"({"kind":"Status","message":7})", "GET /x"),
                  railyard::kube::ServerError);
}

TEST_CASE("checkpoint: a non-integer dimension is a malformed record, not undefined behaviour (fuzz_checkpoint)") {
  for (const char* shape : {"[4,6.6e21]", "[4,2.5]", "[18446744073709551615]", "\"4\""}) {
    INFO("shape: ", shape);
    json rec = json::parse(std::string(R"({"rank":0,"step":1,"run_id":"r","file":"f","file_bytes":0,"slices":[],
                                          "tensors":[{"name":"w","dtype":"f32","shape":)") +
                           shape + "}]}");
    CHECK_THROWS_AS(railyard::ckpt::rank_record_from_json(rec, "rank-00000.done"), railyard::Error);
  }
}

TEST_CASE("checkpoint: a box whose offset and size lists differ in length is named, not read past (fuzz_shm_image)") {
  using railyard::ckpt::Box;
  // The shared-memory image's slices carry their offsets and sizes as separate lists; the refusal names the box
  // before its dimensions are checked, so naming it must not index the shorter list.
  CHECK(railyard::ckpt::box_to_string(Box{{0, 4}, {8}}) == "offset (0,4) size (8)");
  CHECK(railyard::ckpt::box_to_string(Box{{}, {1, 2}}) == "offset () size (1,2)");
  CHECK(railyard::ckpt::box_to_string(Box{{0, 768}, {4, 768}}) == "[0:4,768:1536]");
  // An end past INT64_MAX is printed, not overflowed.
  CHECK(railyard::ckpt::box_to_string(Box{{INT64_MAX}, {INT64_MAX}}) == "[9223372036854775807:18446744073709551614]");
}
