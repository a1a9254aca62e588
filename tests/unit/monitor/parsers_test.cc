// The strict parsers: text exposition format, Prometheus query responses, Alertmanager v4 payloads.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>

#include "common/error.h"
#include "common/metrics/metrics.h"
#include "monitor/alertmanager.h"
#include "monitor/samples.h"
#include "tests/unit/monitor/sample_payloads.h"

using namespace railyard::monitor;

namespace {

std::string error_of(auto fn) {
  try {
    fn();
  } catch (const railyard::Error& e) {
    return e.what();
  }
  return "";
}

// An input a parser must refuse, and a piece of what its error must say.
struct Refusal {
  const char* input;
  const char* want;
};

// Each input given to `parse` throws a railyard::Error whose message holds the case's `want` (and `also`, if given).
void check_refusals(std::initializer_list<Refusal> cases, const std::function<void(const std::string&)>& parse,
                    const char* also = nullptr) {
  for (const auto& c : cases) {
    CAPTURE(c.input);
    std::string err = error_of([&] { parse(c.input); });
    if (also) CHECK(err.find(also) != std::string::npos);
    CHECK(err.find(c.want) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("text format: what our own registry writes parses back exactly") {
  railyard::metrics::Registry reg;
  reg.gauge("railyard_worker_step", "Last completed step.")
      .add({{"namespace", "ns"}, {"job", "j"}, {"rank", "0"}, {"node", "weird \"n\"\\\nx"}})
      .set(41);
  auto& h = reg.histogram("railyard_worker_step_duration_seconds", "Step time.", {0.1, 1})
                .add({{"namespace", "ns"}, {"job", "j"}, {"rank", "0"}});
  h.observe(0.5);
  h.observe(2);
  reg.gauge("railyard_worker_loss", "Loss.").add({{"rank", "0"}}).set(std::nan(""));
  auto samples = parse_text_format(reg.serialize(), "test");
  bool saw_step = false, saw_inf_bucket = false, saw_nan = false;
  for (const auto& s : samples) {
    if (s.name == "railyard_worker_step") {
      saw_step = true;
      CHECK(s.value == 41);
      CHECK(s.label("node") == "weird \"n\"\\\nx");
    }
    if (s.name == "railyard_worker_step_duration_seconds_bucket" && s.label("le") == "+Inf") {
      saw_inf_bucket = true;
      CHECK(s.value == 2);
    }
    if (s.name == "railyard_worker_loss") saw_nan = std::isnan(s.value);
  }
  CHECK(saw_step);
  CHECK(saw_inf_bucket);
  CHECK(saw_nan);
}

TEST_CASE("text format: comments, blanks, timestamps, special values") {
  auto s = parse_text_format(
      "# a free comment\n\n# HELP x_total Help with \\\\ and \\n.\n# TYPE x_total counter\n"
      "x_total{a=\"1\",b=\"2\",} 3 1700000000000\nx_total{a=\"2\"}\t-Inf\ny +Inf\nz 1.5e3\n",
      "t");
  REQUIRE(s.size() == 4);
  CHECK(s[0].labels.size() == 2);
  CHECK(s[0].value == 3);
  CHECK(std::isinf(s[1].value));
  CHECK(s[1].value < 0);
  CHECK(s[3].value == 1500);
}

TEST_CASE("text format: bad input is refused naming the line") {
  check_refusals(
      {
          {"ok 1\nbad{a=\"1\" 2\n", "t line 2"},
          {"ok 1\n1bad 2\n", "t line 2: expected a name"},
          {"x{a=\"\\q\"} 1\n", "invalid escape sequence"},
          {"x{a=\"1\",a=\"2\"} 1\n", "duplicate label 'a'"},
          {"x 1 2 3\n", "unexpected text after the timestamp"},
          {"x abc\n", "'abc' is not a number"},
          {"x 0x10\n", "is not a number"},
          {"x\n", "missing value"},
          {"x 1 12.5\n", "timestamp '12.5' is not an integer"},
          {"# TYPE x bogus\nx 1\n", "t line 1: unknown metric type 'bogus'"},
          {"# TYPE x gauge\n# TYPE x gauge\n", "t line 2: second TYPE line"},
          {"x 1", "does not end with a newline"},
          {"x{a=\"1} 1\n", "unterminated label value"},
      },
      [](const std::string& text) { parse_text_format(text, "t"); });
}

TEST_CASE("query response: a vector with labels and special values") {
  auto s = parse_query_response(testing::kQueryVector, "prom");
  REQUIRE(s.size() == 3);
  CHECK(s[0].name == "railyard_worker_step");
  CHECK(s[0].label("job") == "j");
  CHECK(s[0].value == 12);
  CHECK(std::isnan(s[1].value));
  CHECK(std::isinf(s[2].value));
  CHECK(parse_query_response(R"({"status":"success","data":{"resultType":"vector","result":[]}})", "p").empty());
  auto sc = parse_query_response(R"({"status":"success","data":{"resultType":"scalar","result":[1,"2"]}})", "p");
  REQUIRE(sc.size() == 1);
  CHECK(sc[0].value == 2);
}

TEST_CASE("query response: malformed answers are errors naming what is wrong") {
  check_refusals(
      {
          {"<html>", "not JSON"},
          {"[]", "not a JSON object"},
          {R"({"data":{}})", "'status'"},
          {R"({"status":"error","errorType":"bad_data","error":"parse error at char 3"})", "bad_data): parse error"},
          {R"({"status":"success"})", "'data'"},
          {R"({"status":"success","data":{"result":[]}})", "data.resultType"},
          {R"({"status":"success","data":{"resultType":"matrix","result":[]}})", "'matrix', expected 'vector'"},
          {R"({"status":"success","data":{"resultType":"vector","result":{}}})", "data.result is not an array"},
          {R"({"status":"success","data":{"resultType":"vector","result":[{"value":[1,"2"]}]}})",
           "data.result[0].metric"},
          {R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}})",
           "data.result[0].value is"},
          {R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,2]}]}})",
           "data.result[0].value is not [<unix time>"},
          {R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}})",
           "'x' is not a number"},
          {R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":1},"value":[1,"1"]}]}})",
           "data.result[0].metric.a is not a string"},
      },
      [](const std::string& body) { parse_query_response(body, "http://p/api/v1/query"); }, "http://p/api/v1/query");
}

TEST_CASE("alertmanager v4 payload: good") {
  auto p = parse_alertmanager_payload(testing::kAlertmanagerFiring);
  CHECK(p.status == "firing");
  CHECK(p.receiver == "railyard");
  REQUIRE(p.alerts.size() == 2);
  CHECK(p.alerts[0].label("trainingjob") == "j");
  CHECK(p.alerts[0].annotations.at("summary") == "stalled");
  CHECK(p.alerts[0].fingerprint == "abc");
  CHECK(p.alerts[1].status == "resolved");
}

TEST_CASE("alertmanager payload: wrong version or missing fields are refused naming the field") {
  check_refusals(
      {
          {"nope", "not JSON"},
          {R"({"status":"firing","alerts":[]})", "'version' is missing"},
          {R"({"version":"3","status":"firing","alerts":[]})", "'version' is \"3\", only \"4\""},
          {R"({"version":4,"status":"firing","alerts":[]})", "'version' is missing"},
          {R"({"version":"4","alerts":[]})", "'status' is missing"},
          {R"({"version":"4","status":"firing"})", "'alerts' is missing"},
          {R"({"version":"4","status":"firing","alerts":{}})", "'alerts' is not an array"},
          {R"({"version":"4","status":"firing","alerts":[{"labels":{"alertname":"x"}}]})",
           "'alerts[0].status' is missing"},
          {R"({"version":"4","status":"firing","alerts":[{"status":"firing"}]})", "'alerts[0].labels' is missing"},
          {R"({"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"a":"b"}}]})",
           "'alerts[0].labels.alertname' is missing"},
          {R"({"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":1}}]})",
           "'alerts[0].labels.alertname' is not a string"},
          {R"({"version":"4","status":"firing","alerts":[{"status":"odd","labels":{"alertname":"x"}}]})",
           "'alerts[0].status' is \"odd\""},
      },
      [](const std::string& body) { parse_alertmanager_payload(body); });
}
