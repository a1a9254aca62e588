// A job whose reconcile throws something that is not an operational error: a value the operator's code cannot
// handle (a json type_error, an out_of_range, bad_alloc, a logic error). Issue #40: one such spec must not stop every
// other job being managed, nor be retried at full speed. The job is held Invalid for its spec version (uid and
// metadata.generation): a new version is tried at once, the same one again after a growing delay. Pure, so it is
// unit-tested without a server (tests/unit/operator/poison_test.cc); Controller::worker_loop and reconcile use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "operator/api.h"

namespace railyard::op {

// The condition reason of a job held Invalid after its reconcile threw.
inline constexpr const char* kReconcileErrorReason = "ReconcileError";

// What the exception says, for the job's status; nullopt for an operational error (railyard::Error: the API server,
// the transport, an object in the way), which the caller retries with the work queue's backoff as before.
std::optional<std::string> poison_cause(std::exception_ptr e);

class PoisonedJobs {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kFirstRetry{10}, kMaxRetry{600};

  // A reconcile of this spec version threw `cause`: held until the returned delay has passed (kFirstRetry, doubled
  // on each failure of the same version, at most kMaxRetry).
  Clock::duration record(const std::string& key, const std::string& uid, int64_t generation, const std::string& cause,
                         Clock::time_point now);
  struct Hold {
    std::string cause;
    Clock::duration retry_in;
  };
  // The hold while this spec version waits for its next try; nullopt to reconcile normally (never failed, another
  // uid or generation, or the time to try again has come).
  std::optional<Hold> held(const std::string& key, const std::string& uid, int64_t generation, Clock::time_point now);
  // The job reconciled without throwing, or is gone.
  void forget(const std::string& key);

 private:
  struct Entry {
    std::string uid;
    int64_t generation = 0;
    std::string cause;
    int failures = 0;
    Clock::time_point retry_at;
  };
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

// `status` with the job held Invalid: phase Invalid, condition Invalid (reason ReconcileError, the cause and the way
// out), observedGeneration `generation`. The caller writes it once when it differs from what was read.
Json poisoned_status(const Json& status, const std::string& cause, int64_t generation, const std::string& now_s);

}  // namespace railyard::op
