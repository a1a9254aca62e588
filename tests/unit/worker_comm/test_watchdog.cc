// The collective watchdog (worker/comm/watchdog.h) with real threads and real time. Deadlines are short but every
// wait for the watchdog is bounded by a generous 20 s; assertions are on which operation is named and how often the
// abort ran, never on how fast it happened (the machine is shared and slow).
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/watchdog.h"

using namespace railyard::worker::comm;
using namespace std::chrono_literals;

namespace {

// Records the abort callback's calls; wait() blocks until the first one (or gives up after 20 s).
struct AbortLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ExpiredOp> calls;
  void operator()(const ExpiredOp& op) {
    std::lock_guard lock(mu);
    calls.push_back(op);
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 20s, [&] { return !calls.empty(); });
  }
  size_t count() {
    std::lock_guard lock(mu);
    return calls.size();
  }
};

}  // namespace

TEST_CASE("an operation past its deadline is aborted once and named with its group, bytes and elapsed time") {
  AbortLog log;
  Watchdog dog([&](const ExpiredOp& op) { log(op); });
  CHECK_FALSE(dog.failure().has_value());
  CHECK_NOTHROW(dog.check());
  const auto t0 = Watchdog::Clock::now();
  dog.begin("all_reduce", "dp", 4096, 50ms);
  REQUIRE(log.wait());
  const auto waited = Watchdog::Clock::now() - t0;
  REQUIRE(log.count() == 1);
  const ExpiredOp op = log.calls[0];
  CHECK(op.name == "all_reduce");
  CHECK(op.group == "dp");
  CHECK(op.bytes == 4096);
  CHECK(op.deadline == 50ms);
  CHECK(op.elapsed >= 50ms);  // never before the deadline
  CHECK(waited >= 50ms);
  REQUIRE(dog.failure().has_value());
  CHECK(dog.failure()->name == "all_reduce");
  CHECK_THROWS_WITH_AS(dog.check(), doctest::Contains("all_reduce of 4096 bytes on group 'dp'"), CommTimeout);
  CHECK_THROWS_WITH_AS(dog.check(), doctest::Contains("deadline of 50 ms"), CommError);
}

TEST_CASE("the earliest deadline is named, even when its operation began after one with a later deadline") {
  AbortLog log;
  Watchdog dog([&](const ExpiredOp& op) { log(op); });
  dog.begin("recv", "pp", 1, 3600s);  // the thread sleeps towards this one first
  dog.begin("all_gather", "tp", 8, 30ms);
  REQUIRE(log.wait());
  REQUIRE(log.count() == 1);
  CHECK(log.calls[0].name == "all_gather");
  CHECK(log.calls[0].group == "tp");
  CHECK(dog.in_flight() == 2);  // the watchdog does not end operations; their callers do
}

TEST_CASE("operations that end in time are never aborted; the next late one is") {
  AbortLog log;
  Watchdog dog([&](const ExpiredOp& op) { log(op); });
  for (int i = 0; i < 50; ++i) {
    WatchedOp scoped(dog, "broadcast", "world", static_cast<size_t>(i), 40ms);  // ends at the end of the iteration
  }
  { WatchedOp long_one(dog, "barrier", "world", 0, 3600s); }
  CHECK(dog.in_flight() == 0);
  // Each of the 50 had a 40 ms deadline that passes while we wait here: had any fired, it would be the one named.
  dog.begin("reduce_scatter", "dp", 123, 150ms);
  REQUIRE(log.wait());
  REQUIRE(log.count() == 1);
  CHECK(log.calls[0].name == "reduce_scatter");
  CHECK(log.calls[0].bytes == 123);
}

TEST_CASE("several expired operations abort once; later operations see the first failure") {
  AbortLog log;
  std::atomic<int> calls{0};
  Watchdog dog([&](const ExpiredOp& op) {
    calls++;
    std::this_thread::sleep_for(50ms);  // a slow ncclCommAbort: others keep expiring meanwhile
    log(op);
  });
  dog.begin("send", "pp", 10, 10ms);
  dog.begin("recv", "pp", 20, 20ms);
  dog.begin("all_to_all", "ep", 30, 30ms);
  REQUIRE(log.wait());
  // The watchdog thread is done after its one abort; give a second expiry every chance to show up.
  const auto id = dog.begin("all_reduce", "dp", 40, 1ms);
  std::this_thread::sleep_for(100ms);
  CHECK(calls.load() == 1);
  CHECK(log.count() == 1);
  CHECK(log.calls[0].name == "send");
  CHECK_THROWS_WITH_AS(dog.check(), doctest::Contains("send of 10 bytes on group 'pp'"), CommTimeout);
  dog.end(id);
}

TEST_CASE("destroying a watchdog with operations in flight returns without aborting them") {
  std::atomic<int> calls{0};
  {
    Watchdog dog([&](const ExpiredOp&) { calls++; });
    dog.begin("all_reduce", "world", 1, 3600s);
    dog.begin("barrier", "world", 0, 3600s);
  }  // the join must not wait for the hour
  CHECK(calls.load() == 0);
}

TEST_CASE("begin and end from many threads at once: nothing expires that ended in time") {
  std::atomic<int> calls{0};
  Watchdog dog([&](const ExpiredOp&) { calls++; });
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      const std::string group = std::to_string(t);
      for (int i = 0; i < 2000; ++i) {
        WatchedOp op(dog, "all_reduce", group, static_cast<size_t>(i), 600s);
        if (i % 100 == 0) (void)dog.failure();
      }
    });
  for (auto& th : ts) th.join();
  CHECK(dog.in_flight() == 0);
  CHECK(calls.load() == 0);
  CHECK_FALSE(dog.failure().has_value());
}
