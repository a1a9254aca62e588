#include "common/metrics/metrics.h"

#include <doctest/doctest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

using namespace railyard::metrics;

namespace {

int promtool_check(const std::string& text, std::string* output) {
  auto path = std::filesystem::temp_directory_path() / ("railyard-metrics-" + std::to_string(::getpid()) + ".txt");
  std::ofstream(path) << text;
  std::string cmd = "promtool check metrics < " + path.string() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE_MESSAGE(p != nullptr, "cannot run promtool (install the prometheus package)");
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) *output += buf;
  int status = ::pclose(p);
  std::filesystem::remove(path);
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("exposition of counters, gauges and histograms in text format 0.0.4") {
  Registry r;
  auto& steps = r.counter("railyard_worker_steps_total", "Training steps completed.", {{"job", "j1"}});
  steps.add({{"rank", "0"}}).increment(3);
  r.gauge("railyard_worker_loss", "Training loss of the last step.").add({}).set(2.5);
  auto& h = r.histogram("railyard_worker_step_duration_seconds", "Step time.", {0.1, 1.0}).add({{"rank", "0"}});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(7);
  std::string expected =
      "# HELP railyard_worker_steps_total Training steps completed.\n"
      "# TYPE railyard_worker_steps_total counter\n"
      "railyard_worker_steps_total{job=\"j1\",rank=\"0\"} 3\n"
      "# HELP railyard_worker_loss Training loss of the last step.\n"
      "# TYPE railyard_worker_loss gauge\n"
      "railyard_worker_loss 2.5\n"
      "# HELP railyard_worker_step_duration_seconds Step time.\n"
      "# TYPE railyard_worker_step_duration_seconds histogram\n"
      "railyard_worker_step_duration_seconds_bucket{rank=\"0\",le=\"0.1\"} 1\n"
      "railyard_worker_step_duration_seconds_bucket{rank=\"0\",le=\"1\"} 2\n"
      "railyard_worker_step_duration_seconds_bucket{rank=\"0\",le=\"+Inf\"} 3\n"
      "railyard_worker_step_duration_seconds_sum{rank=\"0\"} 7.55\n"
      "railyard_worker_step_duration_seconds_count{rank=\"0\"} 3\n";
  CHECK(r.serialize() == expected);
  std::string out;
  CHECK_MESSAGE(promtool_check(r.serialize(), &out) == 0, out);
  // The check itself is not vacuous: promtool refuses a bad escape.
  std::string bad_out;
  CHECK(promtool_check("# HELP railyard_x bad \\t escape\n# TYPE railyard_x gauge\nrailyard_x 1\n", &bad_out) != 0);
}

TEST_CASE("a histogram observes one value several times: count and buckets by the times, sum by their total") {
  Histogram h({0.1, 1.0});
  h.observe(0.5, 4);  // a progress record covering 4 steps of 0.5 s each
  h.observe(2.0, 0);  // nothing
  h.observe(0.05);
  auto s = h.snapshot();
  CHECK(s.count == 5);
  CHECK(s.sum == doctest::Approx(2.05));
  REQUIRE(s.cumulative.size() == 3);
  CHECK(s.cumulative[0] == 1);
  CHECK(s.cumulative[1] == 5);
  CHECK(s.cumulative[2] == 5);
}

TEST_CASE("label values and help text are escaped exactly and promtool accepts them") {
  CHECK(escape_label_value("a\\b\"c\nd") == "a\\\\b\\\"c\\nd");
  CHECK(escape_help("x\\y\nz \"q\"") == "x\\\\y\\nz \"q\"");
  CHECK(format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_value(std::nan("")) == "NaN");
  CHECK(format_value(1e-7) == "1e-07");
  Registry r;
  r.gauge("railyard_test_value", "Help with \\ backslash\nand newline.")
      .add({{"node", "we\"ird\\name\nx"}})
      .set(std::nan(""));
  std::string out;
  CHECK_MESSAGE(promtool_check(r.serialize(), &out) == 0, out);
}

TEST_CASE("histogram +Inf bucket equals _count and buckets are cumulative under concurrency") {
  Histogram h(exponential_buckets(0.001, 2, 12));
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&h, t] {
      for (int i = 0; i < 20000; ++i) h.observe(0.0001 * ((i * 7 + t) % 5000));
    });
  for (auto& t : ts) t.join();
  auto s = h.snapshot();
  CHECK(s.count == 80000);
  CHECK(s.cumulative.back() == s.count);
  for (size_t i = 1; i < s.cumulative.size(); ++i) CHECK(s.cumulative[i] >= s.cumulative[i - 1]);
}

TEST_CASE("counters are exact under concurrent increments and refuse to go down") {
  Registry r;
  auto& c = r.counter("railyard_test_events_total", "Events.").add({});
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&c] {
      for (int i = 0; i < 50000; ++i) c.increment();
    });
  for (auto& t : ts) t.join();
  CHECK(c.value() == 200000);
  CHECK_THROWS_AS(c.increment(-1), std::invalid_argument);
}

TEST_CASE("remove_matching drops every series of one job and keeps the others") {
  Registry r;
  auto& f = r.counter("railyard_test_restarts_total", "Restarts.");
  f.add({{"namespace", "a"}, {"job", "x"}, {"reason", "PodFailed"}}).increment();
  f.add({{"namespace", "a"}, {"job", "x"}, {"reason", "WorkerExit"}}).increment();
  f.add({{"namespace", "a"}, {"job", "y"}, {"reason", "WorkerExit"}}).increment();
  f.add({{"namespace", "b"}, {"job", "x"}, {"reason", "WorkerExit"}}).increment();
  f.remove_matching({{"namespace", "a"}, {"job", "x"}});
  const std::string text = r.serialize();
  CHECK(text.find("job=\"x\",namespace=\"a\"") == std::string::npos);
  CHECK(text.find("job=\"y\",namespace=\"a\"") != std::string::npos);
  CHECK(text.find("job=\"x\",namespace=\"b\"") != std::string::npos);
  CHECK(f.children().size() == 2);
}

TEST_CASE("bad names and bucket bounds are refused with the rule") {
  Registry r;
  CHECK_THROWS_WITH_AS(r.counter("railyard_steps", "x"), doctest::Contains("must end in _total"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(r.gauge("1bad", "x"), doctest::Contains("[a-zA-Z_:]"), std::invalid_argument);
  auto& g = r.gauge("railyard_ok", "x");
  CHECK_THROWS_WITH_AS(g.add({{"__x", "1"}}), doctest::Contains("must not start with __"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(g.add({{"bad-name", "1"}}), doctest::Contains("label name"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(r.histogram("railyard_h", "x", {1.0, 0.5}), doctest::Contains("strictly increasing"),
                       std::invalid_argument);
  // Same name, other type.
  CHECK_THROWS_WITH_AS(r.histogram("railyard_ok", "x", {1.0}), doctest::Contains("another type"),
                       std::invalid_argument);
  // Same name, same type: the same family.
  CHECK(&r.gauge("railyard_ok", "x") == &g);
}

TEST_CASE("the exposer serves /metrics over HTTP on loopback") {
  Registry r;
  r.gauge("railyard_test_up", "Up.").add({}).set(1);
  Exposer ex(r, "127.0.0.1", 0);
  REQUIRE(ex.port() > 0);
  httplib::Client cli("127.0.0.1", ex.port());
  auto res = cli.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type").find("version=0.0.4") != std::string::npos);
  CHECK(res->body.find("railyard_test_up 1\n") != std::string::npos);
  r.gauge("railyard_test_up", "Up.").add({}).set(0);
  res = cli.Get("/metrics");
  REQUIRE(res);
  CHECK(res->body.find("railyard_test_up 0\n") != std::string::npos);
  // Bounded (issue #40 item 6): a body beyond the cap is refused before it is read into memory.
  auto big = cli.Post("/metrics", std::string(64 * 1024, 'x'), "text/plain");
  REQUIRE(big);
  CHECK(big->status == 413);
  // A peer that opens a connection and never finishes its request is dropped after the read timeout, and scrapes
  // meanwhile are answered.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(ex.port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // no end of headers
  REQUIRE(::send(fd, partial.data(), partial.size(), 0) == static_cast<ssize_t>(partial.size()));
  CHECK(cli.Get("/metrics"));
  timeval tv{12, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  const auto t0 = std::chrono::steady_clock::now();
  ssize_t n = 0;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) {
  }               // the server may answer with an error status before it closes
  CHECK(n == 0);  // closed by the server (EOF), not by our 12 s receive timeout
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  ::close(fd);
}
