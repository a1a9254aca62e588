// WorkQueue semantics (no server).
#include "common/kube/work_queue.h"

#include <doctest/doctest.h>

#include <atomic>
#include <thread>

using namespace railyard::kube;
using namespace std::chrono_literals;

TEST_CASE("a key queued twice is processed once") {
  WorkQueue q;
  q.add("a");
  q.add("b");
  q.add("a");
  CHECK(q.size() == 2);
  std::string k;
  REQUIRE(q.get(k));
  CHECK(k == "a");
  REQUIRE(q.get(k));
  CHECK(k == "b");
  CHECK(q.size() == 0);
  q.done("a");
  q.done("b");
  CHECK(q.size() == 0);
}

TEST_CASE("a key added while in process is queued again after done, never handed out twice") {
  WorkQueue q;
  q.add("a");
  std::string k;
  REQUIRE(q.get(k));
  q.add("a");
  q.add("a");
  CHECK(q.size() == 0);  // held back while "a" is in process
  q.done("a");
  CHECK(q.size() == 1);
  REQUIRE(q.get(k));
  CHECK(k == "a");
  q.done("a");
  CHECK(q.size() == 0);
}

TEST_CASE("workers never process the same key concurrently") {
  WorkQueue q;
  std::atomic<int> in_flight_a{0}, max_in_flight_a{0}, processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      std::string k;
      while (q.get(k)) {
        if (k == "a") {
          int now = ++in_flight_a;
          int prev = max_in_flight_a.load();
          while (now > prev && !max_in_flight_a.compare_exchange_weak(prev, now)) {
          }
          std::this_thread::sleep_for(2ms);
          --in_flight_a;
        }
        ++processed;
        q.done(k);
      }
    });
  }
  for (int i = 0; i < 200; ++i) {
    q.add("a");
    q.add(std::string("k").append(std::to_string(i % 7)));
    std::this_thread::sleep_for(100us);
  }
  std::this_thread::sleep_for(100ms);
  q.shut_down();
  for (auto& t : workers) t.join();
  CHECK(max_in_flight_a.load() == 1);
  CHECK(processed.load() > 0);
  CHECK(processed.load() < 400);  // de-duplication collapsed many adds
}

TEST_CASE("per-key backoff grows exponentially, is capped, and forget resets it") {
  WorkQueueOptions o;
  o.base_delay = 5ms;
  o.max_delay = 100ms;
  WorkQueue q(o);
  CHECK(q.next_delay("a") == 5ms);
  CHECK(q.next_delay("a") == 10ms);
  CHECK(q.next_delay("a") == 20ms);
  CHECK(q.next_delay("a") == 40ms);
  CHECK(q.next_delay("a") == 80ms);
  CHECK(q.next_delay("a") == 100ms);
  CHECK(q.next_delay("a") == 100ms);
  CHECK(q.num_requeues("a") == 7);
  CHECK(q.next_delay("b") == 5ms);  // per key
  q.forget("a");
  CHECK(q.num_requeues("a") == 0);
  CHECK(q.next_delay("a") == 5ms);
}

TEST_CASE("the overall bucket limits retries of many keys") {
  WorkQueueOptions o;
  o.base_delay = 1ms;
  o.qps = 10;
  o.burst = 2;
  WorkQueue q(o);
  CHECK(q.next_delay("k1") == 1ms);
  CHECK(q.next_delay("k2") == 1ms);
  auto d = q.next_delay("k3");  // bucket empty: about 100 ms
  CHECK(d >= 90ms);
  CHECK(d <= 110ms);
}

TEST_CASE("add_rate_limited and add_after deliver after the delay") {
  WorkQueueOptions o;
  o.base_delay = 50ms;
  WorkQueue q(o);
  auto t0 = std::chrono::steady_clock::now();
  q.add_rate_limited("a");
  CHECK(q.size() == 0);
  std::string k;
  REQUIRE(q.get(k));
  auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(k == "a");
  CHECK(waited >= 45ms);
  CHECK(waited < 1s);
  CHECK(q.num_requeues("a") == 1);
  q.done("a");

  t0 = std::chrono::steady_clock::now();
  q.add_after("b", 1000ms);
  q.add_after("b", 80ms);    // the earlier time wins
  q.add_after("b", 1200ms);  // a later one is a duplicate
  REQUIRE(q.get(k));
  waited = std::chrono::steady_clock::now() - t0;
  CHECK(k == "b");
  CHECK(waited >= 75ms);
  CHECK(waited < 900ms);
  q.done("b");
  std::this_thread::sleep_for(1400ms);
  CHECK(q.size() == 0);  // no second delivery of b
}

TEST_CASE("shut_down unblocks waiting workers and get returns false after") {
  WorkQueue q;
  std::atomic<int> returned{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i)
    ts.emplace_back([&] {
      std::string k;
      if (!q.get(k)) ++returned;
    });
  std::this_thread::sleep_for(50ms);
  CHECK(returned.load() == 0);
  q.shut_down();
  for (auto& t : ts) t.join();
  CHECK(returned.load() == 3);
  std::string k;
  q.add("late");
  CHECK_FALSE(q.get(k));
  CHECK(q.shutting_down());
}
