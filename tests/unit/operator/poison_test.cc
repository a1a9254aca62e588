// A reconcile that throws (issue #40): the pure part of what the controller does with it (poison.h). The worker loop
// and reconcile themselves need an API server; they call exactly these.
#include "operator/controller/poison.h"

#include <doctest/doctest.h>

#include <new>
#include <stdexcept>

#include "common/error.h"
#include "common/kube/client.h"
#include "operator/controller/status.h"

using namespace railyard::op;
using Json = nlohmann::json;
using namespace std::chrono_literals;

TEST_CASE("operational errors are retried as before; anything else is the spec's poison, with its cause") {
  CHECK_FALSE(poison_cause(std::make_exception_ptr(railyard::kube::Conflict(409, "Conflict", "stale"))));
  CHECK_FALSE(poison_cause(std::make_exception_ptr(railyard::kube::ServerError(500, "InternalError", "etcd"))));
  CHECK_FALSE(poison_cause(std::make_exception_ptr(railyard::kube::TransportError("connection refused"))));
  CHECK_FALSE(poison_cause(std::make_exception_ptr(railyard::Error("Secret x exists and is not this job's"))));

  CHECK(poison_cause(std::make_exception_ptr(std::out_of_range("vector::_M_range_check: 7 >= 4"))) ==
        "vector::_M_range_check: 7 >= 4");
  // What Json::get<int>() on a string in a status someone edited throws.
  try {
    (void)Json("four").get<int>();
    FAIL("get<int> of a string did not throw");
  } catch (...) {
    const auto cause = poison_cause(std::current_exception());
    REQUIRE(cause);
    CHECK(cause->find("type must be number") != std::string::npos);
  }
  const auto oom = poison_cause(std::make_exception_ptr(std::bad_alloc()));
  REQUIRE(oom);
  CHECK(oom->find("out of memory") != std::string::npos);
  const auto odd = poison_cause(std::make_exception_ptr(42));
  REQUIRE(odd);
  CHECK(odd->find("not a std::exception") != std::string::npos);
}

TEST_CASE("a poisoned spec version is held, retried after a growing delay, and a new version is tried at once") {
  PoisonedJobs jobs;
  const auto t0 = PoisonedJobs::Clock::time_point{} + 1000h;
  CHECK_FALSE(jobs.held("ns/a", "uid-1", 3, t0));

  CHECK(jobs.record("ns/a", "uid-1", 3, "boom", t0) == 10s);
  auto h = jobs.held("ns/a", "uid-1", 3, t0 + 4s);
  REQUIRE(h);
  CHECK(h->cause == "boom");
  CHECK(h->retry_in == 6s);
  // Other jobs are not held.
  CHECK_FALSE(jobs.held("ns/b", "uid-2", 3, t0 + 4s));
  // Its try comes after the delay; failing again doubles it.
  CHECK_FALSE(jobs.held("ns/a", "uid-1", 3, t0 + 10s));
  CHECK(jobs.record("ns/a", "uid-1", 3, "boom again", t0 + 10s) == 20s);
  REQUIRE(jobs.held("ns/a", "uid-1", 3, t0 + 29s));
  CHECK(jobs.held("ns/a", "uid-1", 3, t0 + 29s)->cause == "boom again");
  auto t = t0 + 30s;
  for (int i = 0; i < 40; ++i) t += jobs.record("ns/a", "uid-1", 3, "boom", t);  // never past the cap, no overflow
  CHECK(jobs.record("ns/a", "uid-1", 3, "boom", t) == PoisonedJobs::kMaxRetry);

  // The user edits the spec (a new generation): tried at once, and its first failure starts the delay afresh.
  CHECK_FALSE(jobs.held("ns/a", "uid-1", 4, t + 1s));
  CHECK(jobs.record("ns/a", "uid-1", 4, "boom", t + 1s) == 10s);
  // A new job of the same name (another uid) likewise.
  CHECK_FALSE(jobs.held("ns/a", "uid-9", 4, t + 2s));
  // Forgotten (reconciled cleanly, or deleted): no hold.
  jobs.record("ns/a", "uid-9", 4, "boom", t + 2s);
  jobs.forget("ns/a");
  CHECK_FALSE(jobs.held("ns/a", "uid-9", 4, t + 3s));
}

TEST_CASE("the held job's status: phase Invalid, condition Invalid naming the cause, written once") {
  const Json orig = {{"phase", "Running"}, {"restarts", 2}, {"generation", 5}};
  const Json status = poisoned_status(orig, "type must be number, but is string", 7, "2026-12-01T00:00:00Z");
  CHECK(status["phase"] == "Invalid");
  CHECK(status["observedGeneration"] == 7);
  CHECK(status["restarts"] == 2);  // the rest of the status is kept
  CHECK(status["generation"] == 5);
  const auto c = find_condition(status, "Invalid");
  REQUIRE(c);
  CHECK((*c)["status"] == "True");
  CHECK((*c)["reason"] == kReconcileErrorReason);
  CHECK((*c)["message"].get<std::string>().find("type must be number, but is string") != std::string::npos);
  // Level-triggered: the held job's next reconcile computes the same status, so there is nothing to write.
  CHECK_FALSE(
      status_differs(status, poisoned_status(status, "type must be number, but is string", 7, "2026-12-01T00:05:00Z")));
  // A status that is not an object (someone wrote a string) still gives a whole status.
  CHECK(poisoned_status(Json("garbage"), "x", 1, "2026-12-01T00:00:00Z")["phase"] == "Invalid");
}
