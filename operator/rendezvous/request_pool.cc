#include "operator/rendezvous/request_pool.h"

#include <algorithm>
#include <string>

#include "common/log.h"

namespace railyard::op {

RequestPool::RequestPool(RequestPoolOptions options) : opts_(options) {
  for (size_t i = 0; i < opts_.core; ++i) {
    {
      std::lock_guard<std::mutex> l(mu_);
      reserve_thread();
    }
    launch_thread();
  }
}

RequestPool::~RequestPool() { shutdown(); }

void RequestPool::reserve_thread() {
  ++live_;
  ++idle_;  // free until it takes a request: a request queued meanwhile needs no thread of its own
  peak_ = std::max(peak_, live_);
}

void RequestPool::launch_thread() {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, opts_.stack_bytes);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, &RequestPool::thread_main, this);
  pthread_attr_destroy(&attr);
  if (rc == 0) return;
  // Out of threads or memory: the request waits for a running thread, as with a fixed pool. Said once.
  std::lock_guard<std::mutex> l(mu_);
  --live_;
  --idle_;
  growing_ = false;
  if (start_failures_++ == 0)
    log::warn("rendezvous", "cannot start another request thread; requests wait for a free one",
              {{"threads", std::to_string(live_)}, {"error", std::to_string(rc)}});
  ended_cv_.notify_all();
}

void RequestPool::enqueue(std::function<void()> fn) {
  bool grow = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(fn));
    // Each idle thread takes one request; a request beyond them gets a thread of its own while there is room.
    // The accept thread starts at most one: each new thread starts the next while requests still lack one, so a
    // burst of connections is accepted at the rate of a queue push, not of a thread start.
    if (!growing_ && queue_.size() > idle_ && live_ < opts_.max) {
      reserve_thread();
      growing_ = grow = true;
    }
  }
  work_cv_.notify_one();
  if (grow) launch_thread();  // outside the lock: running threads go on meanwhile
  join_ended();
}

void* RequestPool::thread_main(void* self) {
  static_cast<RequestPool*>(self)->work();
  return nullptr;
}

void RequestPool::work() {
  std::unique_lock<std::mutex> l(mu_);
  if (growing_) {
    // This thread is part of a growth: start the next one while requests still outnumber the free threads.
    if (queue_.size() > idle_ && live_ < opts_.max && !stop_) {
      reserve_thread();
      l.unlock();
      launch_thread();
      l.lock();
    } else {
      growing_ = false;
    }
  }
  while (true) {
    if (!queue_.empty()) {
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      --idle_;
      l.unlock();
      try {
        fn();
      } catch (...) {
        // httplib answers a handler's exception itself; nothing may end a pool thread.
      }
      l.lock();
      ++idle_;
      continue;
    }
    if (stop_) break;
    const auto ready = [&] { return !queue_.empty() || stop_; };
    bool woke = true;
    if (live_ > opts_.core) {
      woke = work_cv_.wait_for(l, opts_.idle_timeout, ready);
    } else {
      work_cv_.wait(l, ready);
    }
    if (!woke && live_ > opts_.core) break;  // idle above the core: ends
  }
  --idle_;
  --live_;
  ended_.push_back(pthread_self());
  ended_cv_.notify_all();
}

void RequestPool::join_ended() {
  std::vector<pthread_t> ended;
  {
    std::lock_guard<std::mutex> l(mu_);
    ended.swap(ended_);
  }
  for (pthread_t t : ended) pthread_join(t, nullptr);
}

void RequestPool::shutdown() {
  {
    std::unique_lock<std::mutex> l(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stop_ = true;
    work_cv_.notify_all();
    ended_cv_.wait(l, [&] { return live_ == 0; });
  }
  join_ended();
}

RequestPool::Stats RequestPool::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return {live_, peak_, queue_.size(), start_failures_};
}

}  // namespace railyard::op
