#include "deploy/local/node_agent/pod_status.h"

#include "common/log.h"

namespace railyard::node_agent {
namespace {

using Json = nlohmann::json;
constexpr const char* kComp = "node-agent";

}  // namespace

std::string container_id(const PodRec& rec) {
  return "railyard://" + rec.uid + "/" + std::to_string(rec.restart_count);
}

Json container_status(const PodRec& rec, const Json& state, bool ready) {
  Json cs = {{"name", rec.container},
             {"state", state},
             {"lastState", rec.last_terminated.is_null() ? Json::object() : Json{{"terminated", rec.last_terminated}}},
             {"ready", ready},
             {"restartCount", rec.restart_count},
             {"image", rec.image.empty() ? std::string("railyard-node-agent/command") : rec.image},
             {"imageID", ""},
             {"started", state.contains("running")}};
  if (state.contains("running") || state.contains("terminated")) cs["containerID"] = container_id(rec);
  return cs;
}

Json terminated_state(const PodRec& rec, const ExitStatus& s, const std::string& reason, const std::string& message) {
  Json term = {{"exitCode", s.code},
               {"reason", reason},
               {"startedAt", kube::format_rfc3339(rec.started_at)},
               {"finishedAt", kube::format_rfc3339(s.finished_at)},
               {"containerID", container_id(rec)}};
  if (!message.empty()) term["message"] = message;
  if (s.signaled) term["signal"] = s.signal;
  return term;
}

Json agent_restarted_state(const Json& pod, const std::string& message, const std::string& finished_at) {
  Json term = {{"exitCode", 137}, {"reason", "NodeAgentRestarted"}, {"message", message}, {"finishedAt", finished_at}};
  auto old = pod.value("status", Json::object()).value("containerStatuses", Json::array());
  if (!old.empty()) {
    auto started = old[0].value("state", Json::object()).value("running", Json::object()).value("startedAt", "");
    if (!started.empty()) term["startedAt"] = started;
  }
  return term;
}

Json pod_status_patch(const PodRec& rec, const std::string& phase, bool ready, const Json& cs,
                      const std::string& reason, const std::string& message, const std::string& now) {
  auto cond = [&](const char* type, bool ok, const std::string& why) {
    Json c = {
        {"type", type}, {"status", ok ? "True" : "False"}, {"lastProbeTime", nullptr}, {"lastTransitionTime", now}};
    if (!ok && !why.empty()) c["reason"] = why;
    return c;
  };
  std::string why = (phase == "Succeeded" || phase == "Failed") ? "PodCompleted" : "ContainersNotReady";
  Json status = {{"phase", phase},
                 {"hostIP", "127.0.0.1"},
                 {"conditions", Json::array({cond("Initialized", true, ""), cond("Ready", ready, why),
                                             cond("ContainersReady", ready, why), cond("PodScheduled", true, "")})},
                 {"containerStatuses", Json::array({cs})},
                 {"qosClass", rec.pod.value("status", Json::object()).value("qosClass", "BestEffort")}};
  if (!rec.ip.empty()) {
    status["podIP"] = rec.ip;
    status["podIPs"] = Json::array({{{"ip", rec.ip}}});
  }
  if (!rec.start_time.empty()) status["startTime"] = rec.start_time;
  status["reason"] = reason.empty() ? Json(nullptr) : Json(reason);
  status["message"] = message.empty() ? Json(nullptr) : Json(message);
  return Json{{"status", status}};
}

StatusReporter::StatusReporter(kube::Client& client)
    : client_(client),
      events_(client, kube::EventRecorderOptions{"railyard-node-agent", "", std::chrono::seconds(600)}) {}

void StatusReporter::report(PodRec& rec, const std::string& phase, bool ready, const Json& cs,
                            const std::string& reason, const std::string& message) {
  // A newer patch replaces one still waiting to be resent: only the latest state matters.
  rec.unsent_status =
      pod_status_patch(rec, phase, ready, cs, reason, message, kube::format_rfc3339(std::chrono::system_clock::now()));
  rec.unsent_phase = phase;
  send(rec);
}

void StatusReporter::resend_due(PodRec& rec, PodRec::Clock::time_point now) {
  if (!rec.unsent_status.is_null() && now >= rec.status_retry_at) send(rec);
}

void StatusReporter::send(PodRec& rec) {
  try {
    client_.patch(kube::resources::pods, rec.ns, rec.name, rec.unsent_status, kube::PatchType::Merge, "status");
    rec.phase = rec.unsent_phase;
    rec.unsent_status = nullptr;
  } catch (const kube::NotFound&) {
    rec.unsent_status = nullptr;
  } catch (const std::exception& e) {
    log::warn(kComp, "pod status update failed, retrying in 1 s",
              {{"pod", rec.key()}, {"phase", rec.unsent_phase}, {"error", e.what()}});
    rec.status_retry_at = PodRec::Clock::now() + std::chrono::seconds(1);
  }
}

void StatusReporter::event(const PodRec& rec, const std::string& type, const std::string& reason,
                           const std::string& message) {
  Json obj = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", rec.name}, {"namespace", rec.ns}, {"uid", rec.uid}}}};
  events_.record(obj, type, reason, message);
}

}  // namespace railyard::node_agent
