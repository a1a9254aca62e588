// The initialize stage (README.md in this folder): a job with spec.initializer gets its data prepared by one pod of
// its own before its gang's first pod (docs/storage.md "Initializer"). What it did is status.initializer; the job
// waits (condition Initialized False) while the pod runs, goes on in the same reconcile once it Succeeded, tries a
// failed pod again up to kInitializerAttempts times, and then fails naming the pod's last words.
#include <algorithm>

#include "common/log.h"
#include "common/log_tail.h"
#include "operator/controller/controller.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/initializer.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"

namespace railyard::op {

namespace {
using std::chrono::milliseconds;
constexpr const char* kLog = "controller";
// "prepares SOURCES into OUTPUT (tokenizer T); fetches the model SOURCE into FILE", for events and conditions:
// the tenant's URLs and paths (64 of up to 4 KiB each), so sanitized and cut to what an event note may carry.
std::string what_it_does(const InitializerSpec& spec, const std::string& init_from) {
  std::string out;
  if (spec.has_data()) {
    std::string srcs;
    for (size_t i = 0; i < spec.sources.size() && i < 3; ++i) srcs += (i ? ", " : "") + spec.sources[i];
    if (spec.sources.size() > 3) srcs += ", ... (" + std::to_string(spec.sources.size()) + " in all)";
    if (!spec.image.empty()) srcs += (srcs.empty() ? "" : ", ") + spec.image_path + " of the image " + spec.image;
    out = "prepares " + srcs + " into " + spec.output + " (tokenizer " + spec.tokenizer + ")";
  }
  if (!spec.model_source.empty())
    out += (out.empty() ? "" : "; ") + std::string("fetches the model ") + spec.model_source + " into " + init_from;
  return sanitize_message(out, kMaxEventMessageBytes / 2);
}
// A string field of status.initializer, "" when absent or not a string (status is read back from the server).
std::string str(const Json& init, const char* key) {
  const Json& v = kube::field(init, key);
  return v.is_string() ? v.get<std::string>() : std::string();
}
}  // namespace

PodPtr Controller::initializer_pod_of(const Json& job) {
  const std::string ns = kube::namespace_of(job), name = initializer_pod_name(kube::name_of(job)), uid = uid_of(job);
  for (PodPtr& p : pods_->snapshot())
    if (kube::namespace_of(*p) == ns && kube::name_of(*p) == name && is_initializer_pod(*p) && controlled_by(*p, uid))
      return p;
  return nullptr;
}

std::optional<milliseconds> Controller::initialize(Sync& s) {
  if (!s.spec.initializer) return std::nullopt;
  Json& status = s.status;
  Json init =
      status.contains("initializer") && status["initializer"].is_object() ? status["initializer"] : Json::object();
  if (str(init, "phase") == "Succeeded") return std::nullopt;
  // Added to a job that has started: its data are in place already; not run (docs/storage.md).
  if (s.gen > 0 && !status.contains("initializer")) return std::nullopt;
  const InitializerSpec& spec = *s.spec.initializer;
  const std::string pod_name = initializer_pod_name(s.name);
  int attempts = init.contains("attempts") && init["attempts"].is_number_integer() ? init["attempts"].get<int>() : 0;
  // Waiting for the pod: the job stays Pending, its Initialized condition says why; the pod's events bring it back.
  auto wait = [&](const std::string& reason, const std::string& message) {
    status["initializer"] = init;
    set_condition(status, "Initialized", false, reason, message, s.now_s);
    if (str(status, "phase").empty() || str(status, "phase") == "Pending") status["phase"] = "Pending";
    if (status_differs(s.orig, status)) write_status(s.job, status);
    emit(s.job, s.events);
    return milliseconds(0);
  };

  ensure_storage(s.job, s.spec, s.events);  // the claim the pod mounts exists first
  const PodPtr pod = initializer_pod_of(s.job);
  if (!pod) {
    if (str(init, "phase") == "Running" && attempts > 0 && str(init, "pod") == pod_name && str(init, "podUID") != "") {
      // The pod of a recorded attempt is gone before it ended (deleted by hand, evicted): one more try.
      s.events.push_back({true, "InitializerLost", "initializer pod " + pod_name + " disappeared before it ended"});
    }
    if (attempts >= kInitializerAttempts)
      return fail_initializer(s, init, "the pod of the last attempt disappeared before it ended");
    Json created;
    try {
      created = client_.create(kube::resources::pods, s.ns, build_initializer_pod(s.job, s.spec, opts_.pod));
    } catch (const kube::AlreadyExists&) {
      throw kube::Conflict(409, "Conflict", "initializer pod " + pod_name + " appeared meanwhile; reading it again");
    }
    ++attempts;
    init["phase"] = "Running";
    init["pod"] = pod_name;
    init["podUID"] = kube::field(kube::field(created, "metadata"), "uid");
    init["attempts"] = attempts;
    if (!init.contains("startTime")) init["startTime"] = s.now_s;
    init.erase("completionTime");
    s.events.push_back({false, "InitializerStarted",
                        "pod " + pod_name + " " + what_it_does(spec, s.spec.init_from) + " (attempt " +
                            std::to_string(attempts) + " of " + std::to_string(kInitializerAttempts) + ")"});
    log::info(kLog, "initializer started", {{"job", s.key}, {"pod", pod_name}, {"attempt", std::to_string(attempts)}});
    return wait("Initializing", "pod " + pod_name + " " + what_it_does(spec, s.spec.init_from));
  }
  if (terminating(*pod)) return wait("Initializing", "pod " + pod_name + " is being deleted; another follows");
  const std::string phase = phase_of(*pod);
  if (phase == "Succeeded") {
    init["phase"] = "Succeeded";
    init["completionTime"] = s.now_s;
    init.erase("message");
    status["initializer"] = init;
    const std::string done = "pod " + pod_name + " succeeded: " + what_it_does(spec, s.spec.init_from);
    set_condition(status, "Initialized", true, "Initialized", done, s.now_s);
    s.events.push_back({false, "InitializerSucceeded", done});
    return std::nullopt;  // the gang starts in this same reconcile
  }
  if (phase == "Failed") {
    const std::string cause = initializer_message(*pod);
    init["message"] = with_cause("pod " + pod_name + " failed", cause, kMaxCauseBytes);
    if (attempts < kInitializerAttempts) {
      delete_pod(s.ns, *pod);
      init.erase("podUID");  // deleted on purpose: its absence is not a loss
      s.events.push_back({true, "InitializerRetrying",
                          with_cause("attempt " + std::to_string(attempts) + " of " +
                                         std::to_string(kInitializerAttempts) + " failed, trying again",
                                     cause, kMaxEventMessageBytes)});
      return wait("InitializerRetrying", init["message"].get<std::string>());
    }
    return fail_initializer(s, init, cause);
  }
  return wait("Initializing", "pod " + pod_name + " is " + (phase.empty() ? std::string("Pending") : phase));
}

milliseconds Controller::fail_initializer(Sync& s, Json init, const std::string& cause) {
  const std::string msg = with_cause(
      "the initializer failed " + std::to_string(kInitializerAttempts) + " times (spec.initializer); the last attempt",
      cause, kMaxCauseBytes);
  init["phase"] = "Failed";
  init["completionTime"] = s.now_s;
  s.status["initializer"] = init;
  s.status["phase"] = "Failed";
  s.status["completionTime"] = s.now_s;
  set_condition(s.status, "Initialized", false, "InitializerFailed", msg, s.now_s);
  set_condition(s.status, "Failed", true, "InitializerFailed", msg, s.now_s);
  s.events.push_back(
      {true, "Failed",
       with_cause("InitializerFailed: the initializer failed " + std::to_string(kInitializerAttempts) + " times", cause,
                  kMaxEventMessageBytes)});
  s.status["replicas"] = s.existing;
  return finish(s.job, s.spec, s.status, s.orig, s.events, s.pods);
}

}  // namespace railyard::op
