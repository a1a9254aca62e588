// Restart decisions: which exits are permanent, and when the restart budget is spent.
#pragma once

#include <string>

#include "operator/controller/job_spec.h"

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

}  // namespace railyard::op
