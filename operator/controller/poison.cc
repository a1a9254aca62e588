#include "operator/controller/poison.h"

#include <algorithm>
#include <new>

#include "common/error.h"
#include "operator/controller/status.h"

namespace railyard::op {

std::optional<std::string> poison_cause(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error&) {
    return std::nullopt;  // operational (kube::ApiError, kube::TransportError, a conflicting object): retried as is
  } catch (const std::bad_alloc&) {
    return std::string("the operator ran out of memory on this spec (std::bad_alloc)");
  } catch (const std::exception& x) {
    return std::string(x.what());
  } catch (...) {
    return std::string("an exception that is not a std::exception");
  }
}

PoisonedJobs::Clock::duration PoisonedJobs::record(const std::string& key, const std::string& uid, int64_t generation,
                                                   const std::string& cause, Clock::time_point now) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[key];
  if (e.uid != uid || e.generation != generation) e = Entry{uid, generation, "", 0, {}};
  e.cause = cause;
  e.failures = std::min(e.failures + 1, 30);  // 2^30 x 10 s is past the cap: no shift overflows
  const Clock::duration delay =
      std::min<Clock::duration>(kMaxRetry, kFirstRetry * (int64_t{1} << std::min(e.failures - 1, 20)));
  e.retry_at = now + delay;
  return delay;
}

std::optional<PoisonedJobs::Hold> PoisonedJobs::held(const std::string& key, const std::string& uid, int64_t generation,
                                                     Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  if (it->second.uid != uid || it->second.generation != generation) {
    entries_.erase(it);  // a new spec version (or a new job of that name) is tried at once
    return std::nullopt;
  }
  if (now >= it->second.retry_at) return std::nullopt;  // its try: the entry stays, so another failure backs off more
  return Hold{it->second.cause, it->second.retry_at - now};
}

void PoisonedJobs::forget(const std::string& key) {
  std::lock_guard lock(mu_);
  entries_.erase(key);
}

Json poisoned_status(const Json& status, const std::string& cause, int64_t generation, const std::string& now_s) {
  Json out = status.is_object() ? status : Json::object();
  const std::string message = "the operator cannot reconcile this spec: " + cause +
                              ": change the spec (the field the error names, or values nearer the documented "
                              "limits, docs/crd-reference.md); the operator tries this version again later";
  set_condition(out, "Invalid", true, kReconcileErrorReason, message, now_s);
  out["phase"] = "Invalid";
  out["observedGeneration"] = generation;
  return out;
}

}  // namespace railyard::op
