// A watchdog thread for collectives that can hang on the device: it tracks the operations in flight with their
// deadlines and, when the first one expires, calls an abort callback once (the NCCL backend's ncclCommAbort) and
// records which operation it was, so the caller blocked on that operation throws a CommTimeout naming it.
// Device independent (no CUDA): tested with real threads in tests/unit/worker_comm/test_watchdog.cc.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace railyard::worker::comm {

// The operation that missed its deadline.
struct ExpiredOp {
  std::string name;   // "all_reduce", "send", "split 'tp'", ...
  std::string group;  // the communicator's name
  size_t bytes = 0;
  std::chrono::milliseconds elapsed{0};   // from begin() to the abort
  std::chrono::milliseconds deadline{0};  // the budget it was given
};

// "all_reduce of 4096 bytes on group 'dp' did not finish within its deadline of 50 ms (aborted after 51 ms)".
std::string describe(const ExpiredOp& op);

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // `on_expiry` runs on the watchdog's thread, at most once per Watchdog, after the failure is recorded (failure()
  // already returns it while the callback runs). It must not call back into this Watchdog.
  explicit Watchdog(std::function<void(const ExpiredOp&)> on_expiry);
  ~Watchdog();  // stops and joins the thread; operations still in flight are forgotten, nothing is aborted
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts watching an operation that must end within `budget` from now; returns its id for end().
  uint64_t begin(std::string name, std::string group, size_t bytes, std::chrono::milliseconds budget);
  // The operation finished (or failed otherwise): stop watching it. Unknown ids are ignored.
  void end(uint64_t id);

  // The first operation that expired, once the abort callback has been started for it.
  std::optional<ExpiredOp> failure() const;
  // Throws CommTimeout with describe(failure()) when an operation expired.
  void check() const;
  size_t in_flight() const;

 private:
  struct Op {
    std::string name, group;
    size_t bytes = 0;
    Clock::time_point start, deadline;
  };
  void loop();

  std::function<void(const ExpiredOp&)> on_expiry_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Op> ops_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::optional<ExpiredOp> failure_;
  std::thread thread_;  // last: started after every member above exists
};

// Watches one operation for the scope: begin() in the constructor, end() in the destructor.
class WatchedOp {
 public:
  WatchedOp(Watchdog& dog, std::string name, std::string group, size_t bytes, std::chrono::milliseconds budget)
      : dog_(dog), id_(dog.begin(std::move(name), std::move(group), bytes, budget)) {}
  ~WatchedOp() { dog_.end(id_); }
  WatchedOp(const WatchedOp&) = delete;
  WatchedOp& operator=(const WatchedOp&) = delete;

 private:
  Watchdog& dog_;
  uint64_t id_;
};

}  // namespace railyard::worker::comm
