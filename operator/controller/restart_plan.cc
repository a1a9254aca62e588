#include "operator/controller/restart_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "common/kube/client.h"
#include "common/restart_request.h"
#include "operator/controller/lifecycle.h"

namespace railyard::op {

namespace {

double tenths(double secs) { return std::round(std::max(0.0, secs) * 10) / 10; }

// The monitor's request carries the symptom, its onset and when it was requested: the time to detect.
void note_request(const std::string& request, Json& record, std::optional<Detection>& detection) {
  const std::optional<RestartRequest> r = parse_restart_request(request);
  if (!r) return;
  if (!r->reason.empty()) {
    // A label value: only a short word (the monitor's rules: Hang, Straggler, NaN, ...), else "other".
    const bool word = r->reason.size() <= 32 &&
                      std::all_of(r->reason.begin(), r->reason.end(), [](unsigned char c) { return std::isalnum(c); });
    record["symptom"] = word ? r->reason : "other";
  }
  if (r->onset.empty() || r->time.empty()) return;
  try {
    const double secs =
        std::chrono::duration<double>(kube::parse_rfc3339(r->time) - kube::parse_rfc3339(r->onset)).count();
    record["detectSeconds"] = tenths(secs);
    detection = Detection{record.value("symptom", "unknown"), std::max(0.0, secs)};
  } catch (const std::exception&) {
    // Not RFC 3339 (a hand-written request): nothing to measure.
  }
}

// An agent's report: the hang's onset (its clock; the operator's on one machine or NTP) to now. A silent pod: when
// the service last heard it.
void note_agent_report(const Trigger& t, std::chrono::system_clock::time_point now, Json& record,
                       std::optional<Detection>& detection) {
  const char* symptom = t.reason == "Hang" ? "Hang" : "Silent";
  record["symptom"] = symptom;
  if (t.onset <= 0) return;
  const double now_unix = std::chrono::duration<double>(now.time_since_epoch()).count();
  const double secs = std::clamp(now_unix - t.onset, 0.0, 1e9);
  record["detectSeconds"] = tenths(secs);
  detection = Detection{symptom, secs};
}

}  // namespace

RestartPlan plan_restart(const JobSpec& spec, const RestartInputs& in) {
  RestartPlan plan;
  // The cause wins the attribution (lifecycle.h attribution): a monitor's request that also blamed a node
  // (excludeFailedNodes) shows up as NodeExcluded of that node's pod in the same pass; the restart is recorded as the
  // request (symptom, detector, time to detect) while the pod is still moved off the node. A killed rank's report
  // beats its survivors' peer-lost exits even when theirs arrived first.
  std::vector<TriggerFacts> facts;
  for (const Trigger& x : in.triggers) facts.push_back({x.reason, x.pod, x.permanent, x.peer_lost, x.age});
  plan.attributed = attribution(facts);
  const Trigger& t = in.triggers.at(plan.attributed);
  const RestartDecision d = decide_restart(spec, in.restarts, in.generation, t.reason, t.detail, t.permanent);
  plan.decision = d;

  Json uids = Json::array();
  for (const auto& u : in.handled_uids) uids.push_back(u);
  for (const Trigger& x : in.triggers)
    if (!x.uid.empty()) uids.push_back(x.uid);
  while (uids.size() > kMaxHandledUids) uids.erase(uids.begin());
  // The failed process's own last words go into every message (the pod and its log may be gone when someone looks).
  const FailureTexts texts = failure_texts(d, t.detail, t.cause);
  Json& record = plan.record;
  record = {{"reason", t.reason}, {"detector", t.detector},        {"time", in.now_s},
            {"podUIDs", uids},    {"message", texts.last_failure}, {"stepAtRestart", in.step}};
  if (t.rank >= 0) record["rank"] = t.rank;
  if (in.last_progress && in.last_progress->time_since_epoch().count() > 0)
    record["lastProgressTime"] = kube::format_rfc3339_micro(*in.last_progress);
  if (t.reason == "RestartRequested" && !in.restart_request.empty())
    note_request(in.restart_request, record, plan.detection);
  if (t.reason == "Hang" || t.reason == "AgentSilent") note_agent_report(t, in.now, record, plan.detection);
  if (!t.pod.empty()) record["pod"] = t.pod;
  if (!t.node.empty()) record["node"] = t.node;

  if (d.fail) {
    plan.condition = texts.condition;
    plan.event = {true, "Failed", texts.event};
    return plan;
  }
  record["generation"] = d.next_generation;
  plan.condition = texts.condition;
  std::string where = "detector " + t.detector;
  if (!t.pod.empty()) where += ", pod " + t.pod;
  if (!t.node.empty()) where += ", node " + t.node;
  if (t.rank >= 0) where += ", rank " + std::to_string(t.rank);
  plan.event = {true, "Restarting",
                with_cause("generation " + std::to_string(d.next_generation) + ": " + t.reason + ": " + d.message +
                               " [" + where + "] (restart " + std::to_string(d.restarts) + " of at most " +
                               std::to_string(spec.max_restarts) + ")",
                           t.cause, kMaxEventMessageBytes)};
  return plan;
}

std::optional<double> mark_recovered(Json& last, int64_t generation,
                                     std::chrono::system_clock::time_point first_step_at, int64_t first_step) {
  if (!last.is_object() || last.value("generation", Json(-1)) != Json(generation) || last.contains("recoveredTime") ||
      !last.contains("time") || !last["time"].is_string())
    return std::nullopt;
  double secs = 0;
  try {
    secs = std::chrono::duration<double>(first_step_at - kube::parse_rfc3339(last["time"].get<std::string>())).count();
  } catch (const std::exception&) {
    return std::nullopt;  // not written by this operator: nothing to measure against
  }
  last["recoveredTime"] = kube::format_rfc3339(first_step_at);
  last["recoverySeconds"] = tenths(secs);
  last["resumedStep"] = first_step;
  return std::max(0.0, secs);
}

}  // namespace railyard::op
