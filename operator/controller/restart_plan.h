// What a reconcile's restart triggers lead to, decided without the API server: the trigger the restart is attributed
// to (lifecycle.h attribution), restart or fail (failure_policy.h decide_restart), the record status keeps
// (status.lastRestart, or status.lastFailure when the job fails), the time to detect, and the condition and event
// texts. Pure, so every policy is tested alone (restart_plan_test.cc); Controller::restart_or_fail (sync_decide.cc)
// feeds it what was observed and applies the plan: status, metrics, the finish of a failed job.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "operator/api.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/pending_event.h"
#include "operator/controller/restart_triggers.h"

namespace railyard::op {

struct RestartInputs {
  int restarts = 0;                    // status.restarts
  int64_t generation = 0;              // the generation that failed
  std::vector<Trigger> triggers;       // this reconcile's, after the culprit hold and the replacement rule; not empty
  std::set<std::string> handled_uids;  // pods whose loss an earlier restart handled (lastRestart.podUIDs)
  std::string now_s;                   // RFC 3339: the record's time
  std::chrono::system_clock::time_point now{};
  Json step = 0;  // status.step: what recovery is measured against (lastRestart.stepAtRestart)
  // When the failed generation last trained a step, when the rendezvous service knows: the goodput ledger charges the
  // time since to detection (lastRestart.lastProgressTime).
  std::optional<std::chrono::system_clock::time_point> last_progress;
  std::string restart_request;  // the request this reconcile handles (TriggerScan::restart_request), else empty
};

// How long the symptom went unnoticed, for railyard_operator_detection_seconds{symptom}.
struct Detection {
  std::string symptom;
  double seconds = 0;
};

struct RestartPlan {
  RestartDecision decision;  // fail, or the next generation and the restart count
  size_t attributed = 0;     // index into RestartInputs::triggers
  // status.lastFailure when decision.fail, else status.lastRestart: reason, detector, time, podUIDs (at most
  // kMaxHandledUids, the newest kept), message (with the process's own last words), and where known rank, pod, node,
  // stepAtRestart, lastProgressTime, symptom, detectSeconds; a restart's generation.
  Json record;
  std::optional<Detection> detection;
  std::string condition;  // the Failed or Restarting condition's message
  PendingEvent event;     // Failed (a warning) or Restarting
};

// The pods whose loss status remembers as handled, so that one lost pod is one restart.
inline constexpr size_t kMaxHandledUids = 32;

RestartPlan plan_restart(const JobSpec& spec, const RestartInputs& in);

// The restart's generation trained its first step: status.lastRestart (`last`) gets recoveredTime (when the
// rendezvous service received that step, not when a polling reconcile saw it), recoverySeconds (from the restart's
// time) and resumedStep (the first step the service received: within one agent poll period of the first step trained,
// so not the step after the restored checkpoint; the worker logs that one). Returns the seconds, for
// railyard_operator_recovery_seconds; nullopt when `last` is another generation's, already recovered, or has no time.
std::optional<double> mark_recovered(Json& last, int64_t generation,
                                     std::chrono::system_clock::time_point first_step_at, int64_t first_step);

}  // namespace railyard::op
