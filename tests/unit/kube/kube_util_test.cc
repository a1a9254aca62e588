// Paths, options, watch framing, error mapping, rate limiting, backoff and time (no server).
#include <doctest/doctest.h>

#include "common/kube/client.h"
#include "common/kube/leader_elector.h"

using namespace railyard::kube;
using namespace std::chrono_literals;

TEST_CASE("resource paths") {
  CHECK(resource_path(resources::pods, "ns1") == "/api/v1/namespaces/ns1/pods");
  CHECK(resource_path(resources::pods, "ns1", "p") == "/api/v1/namespaces/ns1/pods/p");
  CHECK(resource_path(resources::pods, "ns1", "p", "binding") == "/api/v1/namespaces/ns1/pods/p/binding");
  CHECK(resource_path(resources::pods, "") == "/api/v1/pods");  // all namespaces
  CHECK(resource_path(resources::nodes, "ignored", "n1", "status") == "/api/v1/nodes/n1/status");
  CHECK(resource_path(resources::leases, "kube-node-lease", "n1") ==
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1");
  CHECK(resource_path(resources::customresourcedefinitions, "", "trainingjobs.railyard.dev") ==
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.railyard.dev");
  CHECK(resource_path(resources::trainingjobs, "default", "j", "scale") ==
        "/apis/railyard.dev/v1alpha1/namespaces/default/trainingjobs/j/scale");
  CHECK(resource_path(resources::configmaps, "a b", "x/y") == "/api/v1/namespaces/a%20b/configmaps/x%2Fy");
  CHECK_THROWS_AS(resource_path(resources::pods, "ns", "", "status"), railyard::Error);
  CHECK(resources::trainingjobs.kind == "TrainingJob");
  CHECK(resources::leases.api_version() == "coordination.k8s.io/v1");
  CHECK(resources::pods.api_version() == "v1");
}

TEST_CASE("list options query") {
  ListOptions o;
  CHECK(o.query().empty());
  o.label_selector = "app=x,tier in (a,b)";
  o.limit = 100;
  o.continue_token = "tok=";
  CHECK(o.query() == "?labelSelector=app%3Dx%2Ctier%20in%20%28a%2Cb%29&limit=100&continue=tok%3D");
}

TEST_CASE("watch line framing across chunk boundaries") {
  LineFramer f;
  std::vector<std::string> lines;
  auto sink = [&](std::string_view l) {
    lines.emplace_back(l);
    return true;
  };
  CHECK(f.feed("{\"a\":", sink));
  CHECK(lines.empty());
  CHECK(f.feed("1}\n{\"b\"", sink));
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == "{\"a\":1}");
  CHECK(f.feed(":2}\r\n\n{\"c\":3}\n{\"d\"", sink));
  REQUIRE(lines.size() == 3);
  CHECK(lines[1] == "{\"b\":2}");
  CHECK(lines[2] == "{\"c\":3}");
  CHECK(f.pending() == "{\"d\"");
  // One byte at a time.
  LineFramer g;
  std::vector<std::string> out;
  std::string text = "{\"x\":1}\n{\"y\":22}\n";
  for (char ch : text)
    g.feed(std::string_view(&ch, 1), [&](std::string_view l) {
      out.emplace_back(l);
      return true;
    });
  CHECK(out == std::vector<std::string>{"{\"x\":1}", "{\"y\":22}"});
  // The sink can stop the stream; remaining lines are not delivered.
  LineFramer h;
  int n = 0;
  CHECK_FALSE(h.feed("1\n2\n3\n", [&](std::string_view) { return ++n < 2; }));
  CHECK(n == 2);
}

TEST_CASE("watch line parsing") {
  auto ev = parse_watch_line(R"({"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}})", "t");
  REQUIRE(ev);
  CHECK(ev->type == WatchEvent::Type::Added);
  CHECK(resource_version_of(ev->object) == "5");
  ev = parse_watch_line(R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}})", "t");
  CHECK(ev->type == WatchEvent::Type::Bookmark);
  CHECK(parse_watch_line(R"({"type":"DELETED","object":{}})", "t")->type == WatchEvent::Type::Deleted);
  const std::string expired =
      Json{{"type", "ERROR"},
           {"object",
            {{"kind", "Status"}, {"code", 410}, {"reason", "Expired"}, {"message", "too old resource version: 1 (5)"}}}}
          .dump();
  CHECK_THROWS_AS(parse_watch_line(expired, "t"), Gone);
  CHECK_THROWS_AS(parse_watch_line(R"({"type":"ERROR","object":{"kind":"Status","code":500,"message":"x"}})", "t"),
                  ServerError);
  CHECK_THROWS_AS(parse_watch_line("not json", "t"), railyard::Error);
  CHECK_THROWS_AS(parse_watch_line(R"({"type":"WEIRD"})", "t"), railyard::Error);
}

TEST_CASE("watch line parsing can leave out metadata.managedFields, and only that") {
  const std::string line =
      R"({"type":"MODIFIED","object":{"metadata":{"name":"p","managedFields":[{"manager":"kubelet","fieldsV1":{"f:status":{}}}],)"
      R"("labels":{"managedFields":"kept"}},"spec":{"managedFields":"kept too"}}})";
  auto kept = parse_watch_line(line, "t");
  REQUIRE(kept);
  CHECK(kept->object["metadata"]["managedFields"].size() == 1);
  auto dropped = parse_watch_line(line, "t", /*drop_managed_fields=*/true);
  REQUIRE(dropped);
  CHECK(dropped->type == WatchEvent::Type::Modified);
  CHECK_FALSE(dropped->object["metadata"].contains("managedFields"));
  CHECK(dropped->object["metadata"]["name"] == "p");
  CHECK(dropped->object["metadata"]["labels"]["managedFields"] == "kept");
  CHECK(dropped->object["spec"]["managedFields"] == "kept too");
  CHECK_THROWS_AS(parse_watch_line("not json", "t", true), railyard::Error);
}

namespace {
template <typename E>
E catch_as(int status, const std::string& body) {
  try {
    throw_api_error(status, body, "GET /x");
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    FAIL("wrong exception type: " << e.what());
  }
  throw std::logic_error("unreachable");
}
std::string status_body(int code, const std::string& reason, const std::string& msg) {
  return Json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"},
              {"code", code},     {"reason", reason},   {"message", msg}}
      .dump();
}
}  // namespace

TEST_CASE("API errors map from Status bodies") {
  auto nf = catch_as<NotFound>(404, status_body(404, "NotFound", "configmaps \"x\" not found"));
  CHECK(nf.code() == 404);
  CHECK(nf.reason() == "NotFound");
  CHECK(std::string(nf.what()).find("GET /x: configmaps \"x\" not found") != std::string::npos);

  auto ae = catch_as<AlreadyExists>(409, status_body(409, "AlreadyExists", "exists"));
  CHECK(ae.reason() == "AlreadyExists");
  CHECK_THROWS_AS(throw_api_error(409, status_body(409, "AlreadyExists", "e"), "c"), Conflict);  // subclass
  auto cf = catch_as<Conflict>(409, status_body(409, "Conflict", "the object has been modified"));
  CHECK(cf.reason() == "Conflict");
  bool was_already_exists = false;
  try {
    throw_api_error(409, status_body(409, "Conflict", "modified"), "c");
  } catch (const AlreadyExists&) {
    was_already_exists = true;
  } catch (const Conflict&) {
  }
  CHECK_FALSE(was_already_exists);
  CHECK_THROWS_AS(throw_api_error(410, status_body(410, "Expired", "too old"), "c"), Gone);
  auto ua = catch_as<Unauthorized>(401, status_body(401, "Unauthorized", "Unauthorized"));
  CHECK(std::string(ua.what()).find("credentials") != std::string::npos);
  CHECK_THROWS_AS(throw_api_error(403, status_body(403, "Forbidden", "no"), "c"), Forbidden);
  CHECK_THROWS_AS(throw_api_error(422, status_body(422, "Invalid", "spec.x: Required"), "c"), Invalid);
  CHECK_THROWS_AS(throw_api_error(429, status_body(429, "TooManyRequests", "slow"), "c"), TooManyRequests);
  CHECK_THROWS_AS(throw_api_error(503, "", "c"), ServerError);
  CHECK_THROWS_AS(throw_api_error(400, status_body(400, "BadRequest", "bad"), "c"), BadRequest);
  auto plain = catch_as<ServerError>(502, "<html>bad gateway</html>");
  CHECK(plain.code() == 502);
  CHECK(std::string(plain.what()).find("bad gateway") != std::string::npos);
  // Every API error is a railyard::Error and an ApiError.
  CHECK_THROWS_AS(throw_api_error(404, "", "c"), ApiError);
  CHECK_THROWS_AS(throw_api_error(404, "", "c"), railyard::Error);
}

TEST_CASE("token bucket: burst, then one token per 1/qps") {
  TokenBucket b(10, 3);
  auto t0 = TokenBucket::Clock::now();
  CHECK(b.reserve(t0) == TokenBucket::Clock::duration::zero());
  CHECK(b.reserve(t0) == TokenBucket::Clock::duration::zero());
  CHECK(b.reserve(t0) == TokenBucket::Clock::duration::zero());
  auto w1 = b.reserve(t0);
  auto w2 = b.reserve(t0);
  CHECK(w1 >= 99ms);
  CHECK(w1 <= 101ms);
  CHECK(w2 >= 199ms);  // waiters are spaced, not all released together
  CHECK(w2 <= 201ms);
  // After a long idle time the bucket refills only up to burst.
  auto later = t0 + 10s;
  for (int i = 0; i < 3; ++i) CHECK(b.reserve(later) == TokenBucket::Clock::duration::zero());
  CHECK(b.reserve(later) > 0ms);
  // Real time: 5 tokens at qps 50, burst 1 take about 80 ms.
  TokenBucket r(50, 1);
  auto s = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) r.acquire();
  auto took = std::chrono::steady_clock::now() - s;
  CHECK(took >= 75ms);
  CHECK(took < 2s);
}

TEST_CASE("backoff grows, is capped and jittered") {
  RetryPolicy p;
  p.initial_backoff = 100ms;
  p.max_backoff = 1000ms;
  CHECK(backoff_delay(p, 0, 0.5) == 100ms);
  CHECK(backoff_delay(p, 1, 0.5) == 200ms);
  CHECK(backoff_delay(p, 3, 0.5) == 800ms);
  CHECK(backoff_delay(p, 4, 0.5) == 1000ms);
  CHECK(backoff_delay(p, 50, 0.5) == 1000ms);
  CHECK(backoff_delay(p, 0, 0.0) == 50ms);
  CHECK(backoff_delay(p, 0, 1.0) == 150ms);
}

TEST_CASE("RFC 3339 time formatting and parsing") {
  auto t = parse_rfc3339("2026-11-22T02:40:00.123456Z");
  CHECK(format_rfc3339_micro(t) == "2026-11-22T02:40:00.123456Z");
  CHECK(format_rfc3339(t) == "2026-11-22T02:40:00Z");
  CHECK(parse_rfc3339("2026-11-22T04:40:00+02:00") == parse_rfc3339("2026-11-22T02:40:00Z"));
  CHECK(parse_rfc3339("2026-11-22T02:40:00.5Z") - parse_rfc3339("2026-11-22T02:40:00Z") == 500ms);
  auto now = std::chrono::system_clock::now();
  auto back = parse_rfc3339(format_rfc3339_micro(now));
  CHECK(std::chrono::abs(back - now) < 1us);
  std::string s = format_rfc3339_micro(now);
  CHECK(s.size() == 27);  // 6 fractional digits, as Lease renewTime requires
  CHECK_THROWS_AS(parse_rfc3339("yesterday"), railyard::Error);
  CHECK_THROWS_AS(parse_rfc3339("2026-11-22T02:40:00"), railyard::Error);
}

TEST_CASE("field: a member by reference, or null, chained through missing levels") {
  const Json pod = {{"spec", {{"nodeName", "n1"}}}, {"status", "not an object"}};
  CHECK(field(pod, "spec").is_object());
  CHECK(&field(pod, "spec") == &pod["spec"]);  // no copy
  CHECK(field(field(pod, "spec"), "nodeName") == "n1");
  CHECK(field(field(pod, "metadata"), "name").is_null());
  CHECK(field(field(pod, "status"), "phase").is_null());
  CHECK(field(Json::array({1}), "x").is_null());
  int n = 0;
  for (const Json& c : field(field(pod, "spec"), "containers")) n += c.is_null() ? 1 : 2;
  CHECK(n == 0);  // a missing list iterates as empty
}

TEST_CASE("object helpers") {
  Json o = {{"metadata", {{"name", "a"}, {"namespace", "n"}, {"resourceVersion", "7"}}}};
  CHECK(key_of(o) == "n/a");
  CHECK(resource_version_of(o) == "7");
  CHECK(key_of(Json{{"metadata", {{"name", "node1"}}}}) == "node1");
  CHECK(name_of(Json::object()).empty());
}

TEST_CASE("leader election: a candidate takes over early by at most what keeps two leaders apart") {
  using std::chrono::milliseconds;
  struct Case {
    int lease_ms, deadline_ms, retry_ms, margin_ms;
  };
  for (const Case& c : {
           // The operator's defaults 15/10/2: the whole retry period (lease - deadline - retry = 3 s allows it).
           Case{15000, 10000, 2000, 2000},
           // The operator e2e's 6/4/1: exactly room for it.
           Case{6000, 4000, 1000, 1000},
           // 4/3/1: a leader may keep acting until 3 s + 1 s after its last renewal, so no margin at all.
           Case{4000, 3000, 1000, 0},
           // 10/8/1.5: only the 0.5 s left between the leader's give-up and the lease's end.
           Case{10000, 8000, 1500, 500},
       }) {
    CAPTURE(c.lease_ms);
    CAPTURE(c.deadline_ms);
    CAPTURE(c.retry_ms);
    railyard::kube::LeaderElectorOptions o;
    o.lease_duration = milliseconds(c.lease_ms);
    o.renew_deadline = milliseconds(c.deadline_ms);
    o.retry_period = milliseconds(c.retry_ms);
    CHECK(railyard::kube::takeover_margin(o) == milliseconds(c.margin_ms));
  }
}

TEST_CASE("base64 of Secret data: padding, empty input, and malformed input refused") {
  CHECK(base64_decode("czNjcmV0") == "s3cret");
  CHECK(base64_decode("YQ==") == "a");
  CHECK(base64_decode("") == "");
  CHECK_THROWS(base64_decode("a*b"));
  CHECK_THROWS(base64_decode("YQ==YQ"));  // data after padding
}
