// RequestPool (operator/rendezvous/request_pool.h): a request that finds no idle thread gets one of its own up to the
// cap, requests beyond the cap wait, threads above the core end when idle, shutdown runs what is queued.
#include "operator/rendezvous/request_pool.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using railyard::op::RequestPool;
using railyard::op::RequestPoolOptions;
using namespace std::chrono_literals;

namespace {

// Tasks that hold their thread until released (a long-poll), counting how many run at once.
struct Holds {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  int running = 0, most = 0, finished = 0;

  std::function<void()> task() {
    return [this] {
      std::unique_lock<std::mutex> l(mu);
      ++running;
      most = std::max(most, running);
      cv.notify_all();
      cv.wait_for(l, 30s, [&] { return released; });  // bounded: a broken pool fails the test, never hangs it
      --running;
      ++finished;
      cv.notify_all();
    };
  }
  // Waits (up to 20 s) until `pred` holds; returns whether it did.
  template <typename Pred>
  bool until(Pred pred) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, 20s, [&] { return pred(); });
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    released = true;
    cv.notify_all();
  }
};

RequestPoolOptions options(size_t core, size_t max, std::chrono::milliseconds idle = 10000ms) {
  RequestPoolOptions o;
  o.core = core;
  o.max = max;
  o.idle_timeout = idle;
  return o;
}

}  // namespace

TEST_CASE("request pool: held requests each get a thread beyond the core, up to the cap") {
  Holds h;
  RequestPool pool(options(2, 8));
  CHECK(pool.stats().threads == 2);
  for (int i = 0; i < 6; ++i) pool.enqueue(h.task());
  // A fixed pool of 2 would run two and queue four until those ended.
  REQUIRE(h.until([&] { return h.running == 6; }));
  CHECK(pool.stats().queued == 0);
  CHECK(pool.stats().threads == 6);
  h.release();
  REQUIRE(h.until([&] { return h.finished == 6; }));
  CHECK(h.most == 6);
  CHECK(pool.stats().peak == 6);
}

TEST_CASE("request pool: past the cap requests wait in the queue and run when a thread is free") {
  Holds h;
  RequestPool pool(options(1, 3));
  for (int i = 0; i < 5; ++i) pool.enqueue(h.task());
  REQUIRE(h.until([&] { return h.running == 3; }));
  std::this_thread::sleep_for(100ms);  // room for a wrong fourth thread to show up
  CHECK(pool.stats().threads == 3);
  CHECK(pool.stats().queued == 2);
  {
    std::lock_guard<std::mutex> l(h.mu);
    CHECK(h.most == 3);
  }
  h.release();
  REQUIRE(h.until([&] { return h.finished == 5; }));
  CHECK(h.most == 3);
}

TEST_CASE("request pool: threads above the core end after their idle timeout; the core stays") {
  Holds h;
  RequestPool pool(options(1, 4, 100ms));
  for (int i = 0; i < 4; ++i) pool.enqueue(h.task());
  REQUIRE(h.until([&] { return h.running == 4; }));
  h.release();
  REQUIRE(h.until([&] { return h.finished == 4; }));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (pool.stats().threads > 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  CHECK(pool.stats().threads == 1);
  // Still serves after shrinking.
  std::atomic<bool> ran{false};
  pool.enqueue([&] { ran = true; });
  pool.shutdown();
  CHECK(ran);
}

TEST_CASE("request pool: shutdown runs what is queued and ends every thread; a throwing task ends none") {
  std::atomic<int> done{0};
  RequestPool pool(options(1, 1));
  pool.enqueue([] { throw std::runtime_error("a handler's exception"); });
  for (int i = 0; i < 10; ++i) pool.enqueue([&] { ++done; });
  pool.shutdown();
  CHECK(done == 10);
  CHECK(pool.stats().threads == 0);
  pool.shutdown();  // twice is harmless (the server and the destructor both call it)
}
