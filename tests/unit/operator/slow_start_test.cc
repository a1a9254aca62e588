// Slow-start batches (operator/controller/slow_start.h): the pod and binding fan-out of a reconcile.
#include "operator/controller/slow_start.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

using namespace railyard::op;

TEST_CASE("batch sizes double from the initial size and the last one takes what is left") {
  CHECK(slow_start_batches(0) == std::vector<int>{});
  CHECK(slow_start_batches(1) == std::vector<int>{1});
  CHECK(slow_start_batches(7) == std::vector<int>{1, 2, 4});
  CHECK(slow_start_batches(10) == std::vector<int>{1, 2, 4, 3});
  auto b = slow_start_batches(1000);
  CHECK(b == std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256, 489});
  CHECK(std::accumulate(b.begin(), b.end(), 0) == 1000);
  CHECK(slow_start_batches(5, 3) == std::vector<int>{3, 2});
  CHECK(slow_start_batches(3, 0) == std::vector<int>{1, 2});  // an initial size below 1 counts as 1
}

TEST_CASE("every index is called exactly once when nothing fails") {
  std::mutex mu;
  std::multiset<int> seen;
  auto r = run_slow_start(100, 8, [&](int i) {
    std::lock_guard<std::mutex> l(mu);
    seen.insert(i);
  });
  CHECK(r.succeeded == 100);
  CHECK(r.attempted == 100);
  CHECK_FALSE(r.first_error);
  CHECK(r.batches == std::vector<int>{1, 2, 4, 8, 16, 32, 37});
  REQUIRE(seen.size() == 100);
  int expect = 0;
  for (int i : seen) CHECK(i == expect++);
}

TEST_CASE("a refused template costs one call: the first batch fails and nothing else runs") {
  std::atomic<int> calls{0};
  auto r = run_slow_start(1000, 16, [&](int) {
    calls++;
    throw std::runtime_error("pods \"x\" is invalid");
  });
  CHECK(calls == 1);
  CHECK(r.attempted == 1);
  CHECK(r.succeeded == 0);
  CHECK(r.batches == std::vector<int>{1});
  REQUIRE(r.first_error);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(r.first_error), "pods \"x\" is invalid", std::runtime_error);
}

TEST_CASE("a failure ends the run after its batch and reports the lowest failing index") {
  std::mutex mu;
  std::set<int> called;
  // Indices 9 and 12 fail; both are in the fourth batch (7..14), which still finishes; the fifth never starts.
  auto r = run_slow_start(100, 4, [&](int i) {
    {
      std::lock_guard<std::mutex> l(mu);
      called.insert(i);
    }
    if (i == 12 || i == 9) throw std::runtime_error("fail " + std::to_string(i));
  });
  CHECK(r.batches == std::vector<int>{1, 2, 4, 8});
  CHECK(r.attempted == 15);
  CHECK(r.succeeded == 13);
  CHECK(called.size() == 15);
  CHECK(*called.rbegin() == 14);
  REQUIRE(r.first_error);
  CHECK_THROWS_WITH_AS(std::rethrow_exception(r.first_error), "fail 9", std::runtime_error);
}

TEST_CASE("a batch runs its calls concurrently, never more than the parallelism at once") {
  std::atomic<int> running{0}, peak{0};
  auto r = run_slow_start(64, 5, [&](int) {
    int now = ++running;
    for (int p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    running--;
  });
  CHECK(r.succeeded == 64);
  CHECK(peak.load() <= 5);
  CHECK(peak.load() >= 2);  // 5 ms sleeps on 5 threads overlap unless the calls were serialised
}
