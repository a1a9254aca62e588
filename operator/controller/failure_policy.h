// Restart decisions: which exits are permanent, and when the restart budget is spent.
#pragma once

#include <cstddef>
#include <string>

#include "operator/api.h"

namespace railyard::op {

enum class ExitClass { Success, Permanent, Retryable };

// Explicit lists win; otherwise Kubeflow's convention for the built-in trainer: 1-127 permanent, 128 and above
// (signals) retryable; for a program (spec.program) torchrun's: every failure retryable, within maxRestarts.
// A process killed by a signal (exit_code < 0 or signal > 0) is retryable unless 128+signal is listed as permanent.
ExitClass classify_exit(const JobSpec& spec, int exit_code, int signal = 0);

struct RestartDecision {
  bool fail = false;   // the job fails instead of restarting
  std::string reason;  // condition reason (e.g. PermanentExitCode, MaxRestartsExceeded, or the trigger)
  std::string message;
  int64_t next_generation = 0;
  int restarts = 0;  // the count after this decision
};

// A restart was triggered with `trigger_reason`; decides with the budget left.
RestartDecision decide_restart(const JobSpec& spec, int restarts_so_far, int64_t generation,
                               const std::string& trigger_reason, const std::string& detail, bool permanent);

// The most of a failed process's own words (its last output lines: the agent's exit report, or a failed pod's
// terminated.message) that a status message carries, and the most any event message carries (the API server refuses
// longer event notes).
inline constexpr size_t kMaxCauseBytes = 2048;
inline constexpr size_t kMaxEventMessageBytes = 1024;

// "text: cause" within max_bytes; the cause (a tenant's text) sanitized (common/log_tail.h) and, when it must be cut,
// keeping its end: its last lines say why. Just text when the cause is empty or there is no room for it.
std::string with_cause(const std::string& text, const std::string& cause, size_t max_bytes);

// What a failed job says: status.lastFailure.message, the Failed condition's message and the Warning event's.
struct FailureTexts {
  std::string last_failure;  // the trigger's detail: cause
  std::string condition;     // the decision's message: cause
  std::string event;         // reason: the decision's message: cause, within kMaxEventMessageBytes
};
FailureTexts failure_texts(const RestartDecision& d, const std::string& detail, const std::string& cause);

}  // namespace railyard::op
