#include "operator/controller/failure_policy.h"

#include <algorithm>

#include "common/log_tail.h"

namespace railyard::op {

ExitClass classify_exit(const JobSpec& spec, int exit_code, int signal) {
  int code = exit_code;
  if (signal > 0) code = 128 + signal;
  if (code == 0) return ExitClass::Success;
  auto listed = [code](const std::vector<int>& v) { return std::find(v.begin(), v.end(), code) != v.end(); };
  if (listed(spec.permanent_exit_codes)) return ExitClass::Permanent;
  if (listed(spec.retryable_exit_codes)) return ExitClass::Retryable;
  // An explicit permanent list replaces the default range rather than adding to it.
  if (!spec.permanent_exit_codes.empty()) return ExitClass::Retryable;
  // A program's ranks are restarted on any failure, as torchrun does: a rank whose peer died fails its collective and
  // exits 1, so 1 cannot mean "a bug, do not retry" there (docs/programs.md).
  if (spec.program) return ExitClass::Retryable;
  return (code >= 1 && code <= 127) ? ExitClass::Permanent : ExitClass::Retryable;
}

RestartDecision decide_restart(const JobSpec& spec, int restarts_so_far, int64_t generation,
                               const std::string& trigger_reason, const std::string& detail, bool permanent) {
  RestartDecision d;
  d.restarts = restarts_so_far;
  d.next_generation = generation;
  if (permanent) {
    d.fail = true;
    d.reason = "PermanentExitCode";
    d.message = detail + " (a permanent exit code: failing without restart)";
    return d;
  }
  if (restarts_so_far >= spec.max_restarts) {
    d.fail = true;
    d.reason = "MaxRestartsExceeded";
    d.message = trigger_reason + ": " + detail + " after " + std::to_string(restarts_so_far) +
                " restarts (failurePolicy.maxRestarts=" + std::to_string(spec.max_restarts) + ")";
    return d;
  }
  d.reason = trigger_reason;
  d.message = detail;
  d.restarts = restarts_so_far + 1;
  d.next_generation = generation + 1;
  return d;
}

std::string with_cause(const std::string& text, const std::string& cause, size_t max_bytes) {
  constexpr size_t kMinRoom = 16;  // less than this of the cause says nothing
  if (text.size() + 2 + kMinRoom > max_bytes) return sanitize_message(text, max_bytes);
  const std::string c = sanitize_message(cause, std::min(kMaxCauseBytes, max_bytes - text.size() - 2), true);
  return c.empty() ? text : text + ": " + c;
}

FailureTexts failure_texts(const RestartDecision& d, const std::string& detail, const std::string& cause) {
  FailureTexts f;
  f.last_failure = with_cause(detail, cause, detail.size() + 2 + kMaxCauseBytes);
  f.condition = with_cause(d.message, cause, d.message.size() + 2 + kMaxCauseBytes);
  f.event = with_cause(d.reason + ": " + d.message, cause, kMaxEventMessageBytes);
  return f;
}

}  // namespace railyard::op
