// The rendezvous server's threads (issue 44 item 4). A join is a long-poll that holds its thread until the world is
// complete or its hold (the agent's join_wait, 2 s) ends, so a fixed pool of T threads registers at most T joins per
// hold: 1,000 agents joining at once took 44 s to form their world with the former fixed 64 (docs/benchmarks.md
// "Rendezvous at 10,000 agents"). This pool keeps `core` threads and starts one more for each request that finds no
// idle thread, up to `max`; a thread above `core` that was idle for `idle_timeout` ends. Requests beyond `max` wait in
// the queue, as every request did before.
#pragma once

#include <httplib.h>
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

namespace railyard::op {

struct RequestPoolOptions {
  size_t core = 64;
  size_t max = 2048;
  // Each thread reserves this much address space for its stack (resident: only the pages it touches). A request's
  // deepest path (TLS handshake, JSON parse, the join handler) uses far less.
  size_t stack_bytes = 512 * 1024;
  std::chrono::milliseconds idle_timeout{10000};
};

class RequestPool : public httplib::TaskQueue {
 public:
  explicit RequestPool(RequestPoolOptions options);
  ~RequestPool() override;  // shuts down when the server did not
  RequestPool(const RequestPool&) = delete;
  RequestPool& operator=(const RequestPool&) = delete;

  void enqueue(std::function<void()> fn) override;
  // Runs what is queued, then ends and joins every thread.
  void shutdown() override;

  struct Stats {
    size_t threads = 0;  // running now
    size_t peak = 0;     // most at once
    size_t queued = 0;   // requests waiting for a thread
    size_t start_failures = 0;
  };
  Stats stats() const;

 private:
  static void* thread_main(void* self);
  void work();
  void reserve_thread();  // under mu_: counts a thread about to start as running and idle
  void launch_thread();   // not under mu_: starts it, or takes the reservation back when it cannot
  void join_ended();      // joins the threads that ended (not under mu_)

  const RequestPoolOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // a request queued, or shutdown
  std::condition_variable ended_cv_;  // a thread ended
  std::deque<std::function<void()>> queue_;
  size_t live_ = 0, peak_ = 0, start_failures_ = 0;
  size_t idle_ = 0;  // threads running no request (starting, or waiting for one)
  bool stop_ = false, shut_down_ = false;
  bool growing_ = false;          // a chain of thread starts is under way (enqueue)
  std::vector<pthread_t> ended_;  // threads that returned, to be joined
};

}  // namespace railyard::op
