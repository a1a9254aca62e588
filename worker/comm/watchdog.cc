#include "worker/comm/watchdog.h"

#include <utility>

#include "worker/comm/communicator.h"

namespace railyard::worker::comm {

std::string describe(const ExpiredOp& op) {
  return op.name + " of " + std::to_string(op.bytes) + " bytes on group '" + op.group +
         "' did not finish within its deadline of " + std::to_string(op.deadline.count()) + " ms (aborted after " +
         std::to_string(op.elapsed.count()) + " ms)";
}

Watchdog::Watchdog(std::function<void(const ExpiredOp&)> on_expiry)
    : on_expiry_(std::move(on_expiry)), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Watchdog::begin(std::string name, std::string group, size_t bytes, std::chrono::milliseconds budget) {
  const auto now = Clock::now();
  uint64_t id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    ops_.emplace(id, Op{std::move(name), std::move(group), bytes, now, now + budget});
  }
  cv_.notify_all();  // the new deadline may be the earliest
  return id;
}

void Watchdog::end(uint64_t id) {
  std::lock_guard lock(mu_);
  ops_.erase(id);
}

std::optional<ExpiredOp> Watchdog::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

void Watchdog::check() const {
  if (auto f = failure()) throw CommTimeout(describe(*f));
}

size_t Watchdog::in_flight() const {
  std::lock_guard lock(mu_);
  return ops_.size();
}

void Watchdog::loop() {
  std::unique_lock lock(mu_);
  while (!stop_ && !failure_) {
    // The earliest deadline in flight; ties go to the operation begun first (lowest id).
    const Op* next = nullptr;
    for (const auto& [id, op] : ops_)
      if (next == nullptr || op.deadline < next->deadline) next = &op;
    if (next == nullptr) {
      cv_.wait(lock);
      continue;
    }
    const auto now = Clock::now();
    if (now < next->deadline) {
      // Woken early by begin() (maybe an earlier deadline), end() does not notify: a stale wake-up only re-scans.
      cv_.wait_until(lock, next->deadline);
      continue;
    }
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    failure_ = ExpiredOp{next->name, next->group, next->bytes, duration_cast<milliseconds>(now - next->start),
                         duration_cast<milliseconds>(next->deadline - next->start)};
    const ExpiredOp expired = *failure_;
    // The callback (ncclCommAbort) can take long and takes the communicator's own lock: never under ours, so callers
    // can still end() and read failure() meanwhile.
    lock.unlock();
    if (on_expiry_) on_expiry_(expired);
    return;  // once: the communicator is dead after an abort
  }
}

}  // namespace railyard::worker::comm
