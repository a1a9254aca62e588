// A rate-limited work queue of keys, with client-go's semantics: a key queued twice is processed once, and a key
// is never handed to two workers at once (added while in process, it is queued again after done()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/kube/client.h"

namespace railyard::kube {

struct WorkQueueOptions {
  std::chrono::milliseconds base_delay{5};     // first per-key retry delay, doubled on each failure
  std::chrono::milliseconds max_delay{60000};  // cap of the per-key delay
  double qps = 10;                             // overall bucket: retries of many keys together
  int burst = 100;
};

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;
  explicit WorkQueue(WorkQueueOptions opts = {});
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void add(const std::string& key);
  void add_after(const std::string& key, Clock::duration delay);
  // Re-adds after max(per-key exponential backoff, overall bucket delay); counts a requeue.
  void add_rate_limited(const std::string& key);
  // The key succeeded: reset its backoff.
  void forget(const std::string& key);
  int num_requeues(const std::string& key);
  // The delay add_rate_limited would use next for this key (and records the failure). Exposed for tests.
  Clock::duration next_delay(const std::string& key);

  // Blocks until a key is ready; false once shut_down() was called (queued keys are dropped).
  bool get(std::string& key);
  // Must follow every successful get(); re-queues the key if it was added while being processed.
  void done(const std::string& key);

  void shut_down();
  bool shutting_down();
  size_t size();  // keys waiting (not counting delayed or in process)

 private:
  void delay_loop();
  void add_locked(const std::string& key);

  WorkQueueOptions opts_;
  TokenBucket bucket_;
  std::mutex mu_;
  std::condition_variable cv_;        // get() waiters
  std::condition_variable delay_cv_;  // the delay thread
  std::deque<std::string> queue_;
  std::unordered_set<std::string> dirty_;       // queued (or to be re-queued after done)
  std::unordered_set<std::string> processing_;  // handed out, not done yet
  std::unordered_map<std::string, int> failures_;
  std::multimap<Clock::time_point, std::string> delayed_;
  std::unordered_map<std::string, Clock::time_point> delayed_at_;  // earliest pending time per key
  bool shutting_down_ = false;
  std::thread delay_thread_;
};

}  // namespace railyard::kube
