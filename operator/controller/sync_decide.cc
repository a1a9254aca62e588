// Decide: validation, suspend, deadline, completion, and why and how the job restarts. The decisions themselves are
// pure functions tested without a server (job_spec.h, lifecycle.h, restart_triggers.h, restart_plan.h,
// failure_policy.h); these stages feed them what was observed and record the outcome in status and events.
#include <algorithm>
#include <set>

#include "common/log.h"
#include "common/metrics/job_labels.h"
#include "operator/controller/controller.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/restart_plan.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"
#include "operator/scheduler/nccl_env.h"

namespace railyard::op {

namespace {
using std::chrono::milliseconds;
}  // namespace

std::optional<std::chrono::milliseconds> Controller::validate(Sync& s) {
  Json& status = s.status;
  ParsedJob parsed = parse_job(s.job);
  // spec.parallelism.auto: the planner picks the layout for spec.replicas on the nodes the job can use.
  if (!parsed.violation && parsed.spec.auto_parallel) {
    AutoPlanOutcome planned = plan_parallelism(parsed.spec, parsed.spec.replicas, node_inventory());
    parsed.violation = planned.violation;
    if (planned.plan) {
      s.auto_plan = planned.plan;
      apply_plan(parsed.spec, *s.auto_plan);
    }
  }
  if (!parsed.violation) parsed.violation = check_path_roots(parsed.spec, opts_.pod.roots);
  if (parsed.violation) {
    const Violation& v = *parsed.violation;
    if (set_condition(status, "Invalid", true, v.reason, v.message, s.now_s))
      s.events.push_back({true, "Invalid", v.message});
    status["phase"] = "Invalid";
    status["replicas"] = s.existing;
    if (status_differs(s.orig, status)) write_status(s.job, status);
    emit(s.job, s.events);
    return milliseconds(0);
  }
  if (find_condition(s.orig, "Invalid"))
    set_condition(status, "Invalid", false, "Valid", "the spec passed validation", s.now_s);
  s.spec = std::move(parsed.spec);
  status["totalSteps"] = s.spec.steps;
  if (!status.contains("restarts")) status["restarts"] = 0;
  if (!status.contains("generation")) status["generation"] = 0;
  if (!status.contains("step")) status["step"] = 0;
  status["progress"] = progress_text(status["step"].get<int64_t>(), s.spec.steps);
  return std::nullopt;
}

std::optional<std::chrono::milliseconds> Controller::suspend_or_resume(Sync& s) {
  const std::string& key = s.key;
  const std::string& ns = s.ns;
  Json& job = s.job;
  const std::string& now_s = s.now_s;
  Json& status = s.status;
  Json& orig = s.orig;
  std::vector<PendingEvent>& events = s.events;
  const std::vector<PodPtr>& pods = s.pods;
  const JobSpec& spec = s.spec;
  bool& resumed = s.resumed;
  // Suspend: no pods, keep the job; resuming starts a new generation.
  if (spec.suspend) {
    for (const PodPtr& p : pods)
      if (!terminating(*p)) delete_pod(ns, *p);
    // An initializer at work stops too; the attempt it was on does not count (it did not fail), and its pod's absence
    // is no loss: resumed, the job starts it again (sync_initialize.cc).
    if (const PodPtr init = status.contains("initializer") ? initializer_pod_of(job) : nullptr;
        init && !terminating(*init) && phase_of(*init) != "Succeeded" && phase_of(*init) != "Failed") {
      delete_pod(ns, *init);
      // Once per attempt (idempotent against a cache that still shows the pod): the status read from the server
      // names this pod's UID until the first pass erases it.
      Json* st = status.contains("initializer") ? &status["initializer"] : nullptr;
      if (st != nullptr && st->is_object() && st->value("phase", "") == "Running" &&
          st->value("podUID", "") == uid_of(*init)) {
        if (st->contains("attempts") && (*st)["attempts"].is_number_integer())
          (*st)["attempts"] = std::max(0, (*st)["attempts"].get<int>() - 1);
        st->erase("podUID");
      }
    }
    if (set_condition(status, "Suspended", true, "Suspended", "runPolicy.suspend is true: pods deleted", now_s))
      events.push_back({false, "Suspended", "runPolicy.suspend is true: deleting the job's pods"});
    if (find_condition(status, "Running"))
      set_condition(status, "Running", false, "Suspended", "the job is suspended", now_s);
    status["phase"] = "Suspended";
    status["replicas"] = 0;
    if (status_differs(orig, status)) write_status(job, status);
    emit(job, events);
    RendezvousService* rdzv = nullptr;
    {
      std::lock_guard lock(mu_);
      if (opened_.erase(key)) rdzv = rdzv_;
    }
    if (rdzv) rdzv->close_job(key);
    return milliseconds(0);
  }
  if (condition_true(orig, "Suspended")) {
    set_condition(status, "Suspended", false, "Resumed", "runPolicy.suspend is false: pods recreated", now_s);
    events.push_back({false, "Resumed", "runPolicy.suspend is false: recreating pods in a new generation"});
    resumed = true;
  }

  return std::nullopt;
}

std::optional<std::chrono::milliseconds> Controller::check_deadline(Sync& s) {
  Json& job = s.job;
  const auto& now = s.now;
  const std::string& now_s = s.now_s;
  Json& status = s.status;
  Json& orig = s.orig;
  std::vector<PendingEvent>& events = s.events;
  auto keep_min = [&s](milliseconds d) { s.keep_min(d); };
  const std::vector<PodPtr>& pods = s.pods;
  const int existing = s.existing;
  const JobSpec& spec = s.spec;
  int64_t& gen = s.gen;
  int& restarts = s.restarts;
  gen = status["generation"].get<int64_t>();
  restarts = status["restarts"].get<int>();

  // Deadline.
  if (spec.active_deadline_seconds && status.contains("startTime")) {
    auto start = kube::parse_rfc3339(status["startTime"].get<std::string>());
    auto deadline = start + std::chrono::seconds(*spec.active_deadline_seconds);
    if (now >= deadline) {
      std::string msg = "runPolicy.activeDeadlineSeconds=" + std::to_string(*spec.active_deadline_seconds) +
                        " passed since the job started";
      status["phase"] = "Failed";
      status["completionTime"] = now_s;
      set_condition(status, "Failed", true, "DeadlineExceeded", msg, now_s);
      set_condition(status, "Running", false, "DeadlineExceeded", msg, now_s);
      events.push_back({true, "Failed", "DeadlineExceeded: " + msg});
      status["replicas"] = existing;
      return finish(job, spec, status, orig, events, pods);
    }
    keep_min(std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(100));
  }

  return std::nullopt;
}

// Completion: every rank reported exit 0, every world pod Succeeded, or (agent jobs) a world pod Succeeded. Checked
// again, on fresh state, before a restart or a resize opens a generation: a rank that exits 0 on the last step while a
// node comes back or goes away must end the job, not leave a generation waiting for agents that have exited
// (lifecycle.h).
Completion Controller::completion_now(const Sync& s, const std::vector<PodPtr>& job_pods,
                                      const std::optional<RendezvousService::Progress>& prog) {
  const int n = s.spec.replicas;
  CompletionSignals sig;
  sig.generation = s.gen;
  sig.agent = s.agent;
  if (s.old_members.empty())
    for (int i = 0; i < n; ++i) sig.world.push_back(worker_pod_name(s.name, i));
  else
    sig.world = s.old_members;
  for (const PodPtr& p : job_pods) {
    const int i = replica_index_of(*p);
    // A terminating pod counts too: an agent stopped by a deletion exits 128+15, never 0.
    if (i >= 0 && i < n) sig.pod_phase.emplace(kube::name_of(*p), phase_of(*p));
  }
  sig.rendezvous_all_succeeded = prog && prog->generation == s.gen && prog->all_succeeded;
  return job_completion(sig);
}

std::chrono::milliseconds Controller::complete(Sync& s, const Completion& c,
                                               const std::optional<RendezvousService::Progress>& prog,
                                               const std::vector<PodPtr>& job_pods) {
  Json& status = s.status;
  const std::string& now_s = s.now_s;
  status["phase"] = "Succeeded";
  status["completionTime"] = now_s;
  // The agents forward each worker's last progress before its exit, so this is the final step's loss.
  if (c.by_rendezvous && prog->step > 0) status["loss"] = prog->loss;
  // A program without totalSteps keeps the last step it reported.
  if (s.spec.steps > 0) status["step"] = s.spec.steps;
  if (!status.contains("step")) status["step"] = 0;
  status["progress"] = progress_text(status["step"].get<int64_t>(), s.spec.steps);
  set_condition(status, "Succeeded", true, c.reason, c.message, now_s);
  set_condition(status, "Running", false, "Completed", c.message, now_s);
  for (const char* t : {"Restarting", "Resizing"})
    if (find_condition(status, t)) set_condition(status, t, false, "Completed", "the job finished", now_s);
  s.events.push_back({false, "Succeeded", c.message});
  int live = 0;
  for (const PodPtr& p : job_pods)
    if (!terminating(*p)) live++;
  status["replicas"] = live;
  return finish(s.job, s.spec, status, s.orig, s.events, job_pods);
}

// The current generation's record at the rendezvous service, read now (not at the start of this reconcile).
std::optional<RendezvousService::Progress> Controller::fresh_progress(const Sync& s) {
  if (!s.rdzv || s.gen <= 0) return std::nullopt;
  std::optional<RendezvousService::Progress> p = s.rdzv->progress(s.key);
  if (!p || p->generation != s.gen) return std::nullopt;
  return p;
}

std::optional<std::chrono::milliseconds> Controller::collect_triggers(Sync& s) {
  const std::string& key = s.key;
  const std::string& name = s.name;
  Json& job = s.job;
  Json& status = s.status;
  Json& orig = s.orig;
  auto keep_min = [&s](milliseconds d) { s.keep_min(d); };
  const JobSpec& spec = s.spec;
  int64_t& gen = s.gen;
  std::vector<WorkerExit>& exits = s.exits;
  std::vector<std::string>& old_members = s.old_members;
  std::map<int, PodPtr>& by_index = s.by_index;
  PlacementRequest& job_placement = s.job_placement;
  std::set<std::string>& handled = s.handled;
  TriggerScan& scan = s.scan;
  std::vector<Trigger>& triggers = s.scan.triggers;
  const std::string& restart_request = s.scan.restart_request;
  // Restart triggers.
  apply_job_options(job, job_placement);
  if (status.contains("lastRestart") && status["lastRestart"].contains("podUIDs"))
    for (const Json& u : status["lastRestart"]["podUIDs"])
      if (u.is_string()) handled.insert(u.get<std::string>());
  TriggerInputs trig_in;
  trig_in.name = name;
  trig_in.generation = gen;
  trig_in.pods_by_index = by_index;
  trig_in.world = old_members;
  trig_in.handled_uids = handled;
  trig_in.was_running = condition_true(orig, "Running");
  trig_in.agent = s.agent;
  trig_in.in_transition = condition_true(orig, "Restarting") || condition_true(orig, "Resizing");
  for (const auto& [i, p] : by_index)
    if (const std::string node = node_of(*p); !node.empty() && !trig_in.node_ready.count(node))
      if (auto n_obj = nodes_->get_shared(node)) trig_in.node_ready[node] = node_ready(*n_obj);
  trig_in.excluded_nodes = job_placement.excluded_nodes;
  trig_in.exits = exits;
  trig_in.now = std::chrono::steady_clock::now();
  {
    const Json ann = job["metadata"].value("annotations", Json::object());
    trig_in.restart_request = ann.value(kRestartRequestAnnotation, "");
    trig_in.restart_detector = ann.value(kRestartDetectorAnnotation, "annotation");
    trig_in.request_handled = status.value("restartRequestHandled", "");
  }
  scan = scan_triggers(spec, trig_in);
  if (!restart_request.empty()) status["restartRequestHandled"] = restart_request;

  {
    // Only survivors' peer-lost exits so far: the culprit's own report is usually a moment behind. Put the exits back
    // and look again when the grace is over or sooner, when another report wakes the job (report_exit enqueues it).
    std::vector<TriggerFacts> facts;
    for (const Trigger& t : triggers) facts.push_back({t.reason, t.pod, t.permanent, t.peer_lost, t.age});
    if (milliseconds hold = hold_for_culprit(facts, opts_.culprit_grace); hold.count() > 0) {
      {
        std::lock_guard lock(mu_);
        auto& pending = exits_[key];
        for (const WorkerExit& e : exits)
          if (e.generation == gen) pending.push_back(e);
      }
      triggers.clear();
      keep_min(hold);
    }
  }
  if (!triggers.empty()) {
    // A lost node or pod after the last step is not a failure of the job: re-read the end of the generation.
    const std::vector<PodPtr> now_pods = pods_of(s.job);
    const auto now_progress = fresh_progress(s);
    if (Completion c = completion_now(s, now_pods, now_progress); c.done) return complete(s, c, now_progress, now_pods);
  }
  return std::nullopt;
}

void Controller::replace_into_forming(Sync& s) {
  Json& status = s.status;
  std::vector<PendingEvent>& events = s.events;
  int64_t& gen = s.gen;
  int& restarts = s.restarts;
  RendezvousService*& rdzv = s.rdzv;
  std::optional<RendezvousService::Progress>& progress = s.progress;
  const bool agent = s.agent;
  std::vector<Trigger>& triggers = s.scan.triggers;
  bool& replaced_now = s.replaced_now;
  // A pod lost before it joined the generation a restart opened (the survivor's exit 200 opened it, then the node
  // went NotReady) is replaced into that generation: one fault, one generation, one restart (lifecycle.h).
  if (!triggers.empty() && agent && rdzv) {
    FormingGeneration forming;
    // The current generation is the one the last restart opened (the rendezvous record says whether it formed).
    forming.restarting = true;
    forming.rendezvous_known = progress.has_value();
    if (progress) {
      forming.world_complete = progress->world_complete;
      forming.missing = progress->missing;
    }
    Json last = status.value("lastRestart", Json::object());
    if (!last.is_object()) last = Json::object();
    if (last.value("generation", Json(-1)) != Json(gen)) forming.restarting = false;  // not this generation's restart
    for (const Json& p : last.value("replacedPods", Json::array()))
      if (p.is_string()) forming.replaced.push_back(p.get<std::string>());
    std::vector<TriggerFacts> facts;
    for (const Trigger& t : triggers) facts.push_back({t.reason, t.pod, t.permanent});
    if (replace_into_forming_generation(forming, facts)) {
      Json uids = last.value("podUIDs", Json::array());
      Json replaced = last.value("replacedPods", Json::array());
      for (const Trigger& t : triggers) {
        if (!t.uid.empty()) uids.push_back(t.uid);
        replaced.push_back(t.pod);
        events.push_back({true, "ReplacingPod",
                          "generation " + std::to_string(gen) + ": " + t.reason + ": " + t.detail + " [detector " +
                              t.detector + "]; the pod never joined this generation, so its replacement joins it " +
                              "(no new generation, restart " + std::to_string(restarts) + " continues)"});
      }
      while (uids.size() > kMaxHandledUids) uids.erase(uids.begin());
      last["podUIDs"] = uids;
      last["replacedPods"] = replaced;
      status["lastRestart"] = last;
      triggers.clear();
      replaced_now = true;
    }
  }
}

std::optional<std::chrono::milliseconds> Controller::restart_or_fail(Sync& s) {
  std::vector<Trigger>& triggers = s.scan.triggers;
  if (triggers.empty()) return std::nullopt;
  Json& status = s.status;
  RestartInputs in;
  in.restarts = s.restarts;
  in.generation = s.gen;
  in.triggers = triggers;
  in.handled_uids = s.handled;
  in.now_s = s.now_s;
  in.now = std::chrono::system_clock::now();
  in.step = status.value("step", Json(0));
  if (s.progress && s.progress->generation == s.gen) in.last_progress = s.progress->last_step_at;
  in.restart_request = s.scan.restart_request;
  const RestartPlan plan = plan_restart(s.spec, in);
  const Trigger& t = triggers[plan.attributed];
  const RestartDecision& d = plan.decision;
  if (plan.detection) detection_seconds_.add({{"symptom", plan.detection->symptom}}).observe(plan.detection->seconds);
  s.events.push_back(plan.event);
  if (d.fail) {
    status["phase"] = "Failed";
    status["completionTime"] = s.now_s;
    status["lastFailure"] = plan.record;
    set_condition(status, "Failed", true, d.reason, plan.condition, s.now_s);
    set_condition(status, "Running", false, d.reason, plan.condition, s.now_s);
    if (find_condition(status, "Restarting"))
      set_condition(status, "Restarting", false, d.reason, "the job failed", s.now_s);
    status["replicas"] = s.existing;
    milliseconds after = finish(s.job, s.spec, status, s.orig, s.events, s.pods);
    if (!s.scan.restart_request.empty())
      client_.patch(kube::resources::trainingjobs, s.ns, s.name,
                    {{"metadata", {{"annotations", {{kRestartHandledAnnotation, s.scan.restart_request}}}}}});
    return after;
  }
  s.restarted_now = true;
  s.gen = d.next_generation;
  s.restarts = d.restarts;
  status["generation"] = s.gen;
  status["restarts"] = s.restarts;
  status["lastRestart"] = plan.record;
  set_condition(status, "Restarting", true, t.reason, plan.condition, s.now_s);
  restarts_.add({{metrics::kNamespaceLabel, s.ns}, {metrics::kTrainingJobLabel, s.name}, {"reason", t.reason}})
      .increment();
  return std::nullopt;
}

}  // namespace railyard::op
