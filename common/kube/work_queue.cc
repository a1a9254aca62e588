#include "common/kube/work_queue.h"

#include <algorithm>
#include <cmath>

namespace railyard::kube {

WorkQueue::WorkQueue(WorkQueueOptions opts) : opts_(opts), bucket_(opts.qps, opts.burst) {
  delay_thread_ = std::thread([this] { delay_loop(); });
}

WorkQueue::~WorkQueue() {
  shut_down();
  if (delay_thread_.joinable()) delay_thread_.join();
}

void WorkQueue::add_locked(const std::string& key) {
  if (shutting_down_ || dirty_.count(key)) return;
  dirty_.insert(key);
  if (processing_.count(key)) return;  // done() will queue it again
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  add_locked(key);
}

void WorkQueue::add_after(const std::string& key, Clock::duration delay) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  if (delay <= Clock::duration::zero()) {
    add_locked(key);
    return;
  }
  auto when = Clock::now() + delay;
  // Only the earliest pending time of a key matters: a later one would be a duplicate.
  auto it = delayed_at_.find(key);
  if (it != delayed_at_.end()) {
    if (it->second <= when) return;
    for (auto d = delayed_.begin(); d != delayed_.end(); ++d) {
      if (d->second == key && d->first == it->second) {
        delayed_.erase(d);
        break;
      }
    }
  }
  delayed_at_[key] = when;
  delayed_.emplace(when, key);
  delay_cv_.notify_one();
}

WorkQueue::Clock::duration WorkQueue::next_delay(const std::string& key) {
  int n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = failures_[key]++;
  }
  double ms = static_cast<double>(opts_.base_delay.count()) * std::pow(2.0, std::min(n, 40));
  ms = std::min(ms, static_cast<double>(opts_.max_delay.count()));
  Clock::duration per_key = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  return std::max(per_key, bucket_.reserve(Clock::now()));
}

void WorkQueue::add_rate_limited(const std::string& key) { add_after(key, next_delay(key)); }

void WorkQueue::forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(key);
}

int WorkQueue::num_requeues(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

bool WorkQueue::get(std::string& key) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return shutting_down_ || !queue_.empty(); });
  if (shutting_down_) return false;
  key = queue_.front();
  queue_.pop_front();
  processing_.insert(key);
  dirty_.erase(key);
  return true;
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key) && !shutting_down_) {
    queue_.push_back(key);
    cv_.notify_one();
  }
}

void WorkQueue::shut_down() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
  }
  cv_.notify_all();
  delay_cv_.notify_all();
}

bool WorkQueue::shutting_down() {
  std::lock_guard<std::mutex> lock(mu_);
  return shutting_down_;
}

size_t WorkQueue::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void WorkQueue::delay_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    if (delayed_.empty()) {
      delay_cv_.wait(lock);
      continue;
    }
    auto first = delayed_.begin();
    if (first->first > Clock::now()) {
      // A copy: add_after may erase this entry while we wait, and wait_until reads its deadline after waking
      // (a heap-use-after-free found by ASan in kube_unit_tests).
      const Clock::time_point until = first->first;
      delay_cv_.wait_until(lock, until);
      continue;
    }
    std::string key = first->second;
    delayed_.erase(first);
    delayed_at_.erase(key);
    add_locked(key);
  }
}

}  // namespace railyard::kube
