// What the agent tells the API server about its pods: the pods/status patch (built by pure functions, so the unit
// tests can check the JSON a kubelet would send) and the reporter that sends it, retries it and records events.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/kube/client.h"
#include "common/kube/event_recorder.h"
#include "deploy/local/node_agent/pod_record.h"
#include "deploy/local/node_agent/supervisor.h"

namespace railyard::node_agent {

// "railyard://<uid>/<restart count>": a new id per run of the container, as a runtime gives.
std::string container_id(const PodRec& rec);

// The pod's one containerStatuses entry; `state` is {"running"|"waiting"|"terminated": {...}}.
nlohmann::json container_status(const PodRec& rec, const nlohmann::json& state, bool ready);

// state.terminated for a process of `rec` (started at rec.started_at) that ended as `s`.
nlohmann::json terminated_state(const PodRec& rec, const ExitStatus& s, const std::string& reason,
                                const std::string& message);

// state.terminated for a pod that an earlier agent run started: its process died with that agent. Keeps the old
// run's startedAt when the stored status has one.
nlohmann::json agent_restarted_state(const nlohmann::json& pod, const std::string& message,
                                     const std::string& finished_at);

// The merge patch {"status": ...} of pods/status, with full lists (a merge patch replaces lists, so they go
// whole). `now` stamps the conditions' lastTransitionTime.
nlohmann::json pod_status_patch(const PodRec& rec, const std::string& phase, bool ready, const nlohmann::json& cs,
                                const std::string& reason, const std::string& message, const std::string& now);

// Sends status patches and events (loop thread). A patch the API server does not take stays in
// rec.unsent_status and is resent by resend_due(), so the last state always lands eventually.
class StatusReporter {
 public:
  explicit StatusReporter(kube::Client& client);

  void report(PodRec& rec, const std::string& phase, bool ready, const nlohmann::json& cs,
              const std::string& reason = "", const std::string& message = "");
  // Resends rec's unsent patch if it has one whose retry time has come.
  void resend_due(PodRec& rec, PodRec::Clock::time_point now);
  void event(const PodRec& rec, const std::string& type, const std::string& reason, const std::string& message);

 private:
  void send(PodRec& rec);

  kube::Client& client_;
  kube::EventRecorder events_;
};

}  // namespace railyard::node_agent
