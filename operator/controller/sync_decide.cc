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
    if (set_condition(s.status, "Invalid", true, v.reason, v.message, s.now_s))
      s.events.push_back({true, "Invalid", v.message});
    s.status["phase"] = "Invalid";
    s.status["replicas"] = s.existing;
    if (status_differs(s.orig, s.status)) write_status(s.job, s.status);
    emit(s.job, s.events);
    return milliseconds(0);
  }
  if (find_condition(s.orig, "Invalid"))
    set_condition(s.status, "Invalid", false, "Valid", "the spec passed validation", s.now_s);
  s.spec = std::move(parsed.spec);
  s.status["totalSteps"] = s.spec.steps;
  if (!s.status.contains("restarts")) s.status["restarts"] = 0;
  if (!s.status.contains("generation")) s.status["generation"] = 0;
  if (!s.status.contains("step")) s.status["step"] = 0;
  s.status["progress"] = progress_text(s.status["step"].get<int64_t>(), s.spec.steps);
  return std::nullopt;
}

std::optional<std::chrono::milliseconds> Controller::suspend_or_resume(Sync& s) {
  // Suspend: no pods, keep the job; resuming starts a new generation.
  if (s.spec.suspend) {
    for (const PodPtr& p : s.pods)
      if (!terminating(*p)) delete_pod(s.ns, *p);
    // An initializer at work stops too; the attempt it was on does not count (it did not fail), and its pod's absence
    // is no loss: resumed, the job starts it again (sync_initialize.cc).
    if (const PodPtr init = s.status.contains("initializer") ? initializer_pod_of(s.job) : nullptr;
        init && !terminating(*init) && phase_of(*init) != "Succeeded" && phase_of(*init) != "Failed") {
      delete_pod(s.ns, *init);
      // Once per attempt (idempotent against a cache that still shows the pod): the status read from the server
      // names this pod's UID until the first pass erases it.
      Json* st = s.status.contains("initializer") ? &s.status["initializer"] : nullptr;
      if (st != nullptr && st->is_object() && st->value("phase", "") == "Running" &&
          st->value("podUID", "") == uid_of(*init)) {
        if (st->contains("attempts") && (*st)["attempts"].is_number_integer())
          (*st)["attempts"] = std::max(0, (*st)["attempts"].get<int>() - 1);
        st->erase("podUID");
      }
    }
    if (set_condition(s.status, "Suspended", true, "Suspended", "runPolicy.suspend is true: pods deleted", s.now_s))
      s.events.push_back({false, "Suspended", "runPolicy.suspend is true: deleting the job's pods"});
    if (find_condition(s.status, "Running"))
      set_condition(s.status, "Running", false, "Suspended", "the job is suspended", s.now_s);
    s.status["phase"] = "Suspended";
    s.status["replicas"] = 0;
    if (status_differs(s.orig, s.status)) write_status(s.job, s.status);
    emit(s.job, s.events);
    RendezvousService* rdzv = nullptr;
    {
      std::lock_guard lock(mu_);
      if (opened_.erase(s.key)) rdzv = rdzv_;
    }
    if (rdzv) rdzv->close_job(s.key);
    return milliseconds(0);
  }
  if (condition_true(s.orig, "Suspended")) {
    set_condition(s.status, "Suspended", false, "Resumed", "runPolicy.suspend is false: pods recreated", s.now_s);
    s.events.push_back({false, "Resumed", "runPolicy.suspend is false: recreating pods in a new generation"});
    s.resumed = true;
  }

  return std::nullopt;
}

std::optional<std::chrono::milliseconds> Controller::check_deadline(Sync& s) {
  s.gen = s.status["generation"].get<int64_t>();
  s.restarts = s.status["restarts"].get<int>();

  // Deadline.
  if (s.spec.active_deadline_seconds && s.status.contains("startTime")) {
    auto start = kube::parse_rfc3339(s.status["startTime"].get<std::string>());
    auto deadline = start + std::chrono::seconds(*s.spec.active_deadline_seconds);
    if (s.now >= deadline) {
      std::string msg = "runPolicy.activeDeadlineSeconds=" + std::to_string(*s.spec.active_deadline_seconds) +
                        " passed since the job started";
      s.status["phase"] = "Failed";
      s.status["completionTime"] = s.now_s;
      set_condition(s.status, "Failed", true, "DeadlineExceeded", msg, s.now_s);
      set_condition(s.status, "Running", false, "DeadlineExceeded", msg, s.now_s);
      s.events.push_back({true, "Failed", "DeadlineExceeded: " + msg});
      s.status["replicas"] = s.existing;
      return finish(s.job, s.spec, s.status, s.orig, s.events, s.pods);
    }
    s.keep_min(std::chrono::duration_cast<milliseconds>(deadline - s.now) + milliseconds(100));
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
  // Restart triggers.
  apply_job_options(s.job, s.job_placement);
  if (s.status.contains("lastRestart") && s.status["lastRestart"].contains("podUIDs"))
    for (const Json& u : s.status["lastRestart"]["podUIDs"])
      if (u.is_string()) s.handled.insert(u.get<std::string>());
  TriggerInputs trig_in;
  trig_in.name = s.name;
  trig_in.generation = s.gen;
  trig_in.pods_by_index = s.by_index;
  trig_in.world = s.old_members;
  trig_in.handled_uids = s.handled;
  trig_in.was_running = condition_true(s.orig, "Running");
  trig_in.agent = s.agent;
  trig_in.in_transition = condition_true(s.orig, "Restarting") || condition_true(s.orig, "Resizing");
  for (const auto& [i, p] : s.by_index)
    if (const std::string node = node_of(*p); !node.empty() && !trig_in.node_ready.count(node))
      if (auto n_obj = nodes_->get_shared(node)) trig_in.node_ready[node] = node_ready(*n_obj);
  trig_in.excluded_nodes = s.job_placement.excluded_nodes;
  trig_in.exits = s.exits;
  trig_in.now = std::chrono::steady_clock::now();
  {
    const Json ann = s.job["metadata"].value("annotations", Json::object());
    trig_in.restart_request = ann.value(kRestartRequestAnnotation, "");
    trig_in.restart_detector = ann.value(kRestartDetectorAnnotation, "annotation");
    trig_in.request_handled = s.status.value("restartRequestHandled", "");
  }
  s.scan = scan_triggers(s.spec, trig_in);
  if (!s.scan.restart_request.empty()) s.status["restartRequestHandled"] = s.scan.restart_request;

  {
    // Only survivors' peer-lost exits so far: the culprit's own report is usually a moment behind. Put the exits back
    // and look again when the grace is over or sooner, when another report wakes the job (report_exit enqueues it).
    std::vector<TriggerFacts> facts;
    for (const Trigger& t : s.scan.triggers) facts.push_back({t.reason, t.pod, t.permanent, t.peer_lost, t.age});
    if (milliseconds hold = hold_for_culprit(facts, opts_.culprit_grace); hold.count() > 0) {
      {
        std::lock_guard lock(mu_);
        auto& pending = exits_[s.key];
        for (const WorkerExit& e : s.exits)
          if (e.generation == s.gen) pending.push_back(e);
      }
      s.scan.triggers.clear();
      s.keep_min(hold);
    }
  }
  if (!s.scan.triggers.empty()) {
    // A lost node or pod after the last step is not a failure of the job: re-read the end of the generation.
    const std::vector<PodPtr> now_pods = pods_of(s.job);
    const auto now_progress = fresh_progress(s);
    if (Completion c = completion_now(s, now_pods, now_progress); c.done) return complete(s, c, now_progress, now_pods);
  }
  return std::nullopt;
}

void Controller::replace_into_forming(Sync& s) {
  // A pod lost before it joined the generation a restart opened (the survivor's exit 200 opened it, then the node
  // went NotReady) is replaced into that generation: one fault, one generation, one restart (lifecycle.h).
  if (!s.scan.triggers.empty() && s.agent && s.rdzv) {
    FormingGeneration forming;
    // The current generation is the one the last restart opened (the rendezvous record says whether it formed).
    forming.restarting = true;
    forming.rendezvous_known = s.progress.has_value();
    if (s.progress) {
      forming.world_complete = s.progress->world_complete;
      forming.missing = s.progress->missing;
    }
    Json last = s.status.value("lastRestart", Json::object());
    if (!last.is_object()) last = Json::object();
    if (last.value("generation", Json(-1)) != Json(s.gen)) forming.restarting = false;  // not this generation's restart
    for (const Json& p : last.value("replacedPods", Json::array()))
      if (p.is_string()) forming.replaced.push_back(p.get<std::string>());
    std::vector<TriggerFacts> facts;
    for (const Trigger& t : s.scan.triggers) facts.push_back({t.reason, t.pod, t.permanent});
    if (replace_into_forming_generation(forming, facts)) {
      Json uids = last.value("podUIDs", Json::array());
      Json replaced = last.value("replacedPods", Json::array());
      for (const Trigger& t : s.scan.triggers) {
        if (!t.uid.empty()) uids.push_back(t.uid);
        replaced.push_back(t.pod);
        s.events.push_back({true, "ReplacingPod",
                            "generation " + std::to_string(s.gen) + ": " + t.reason + ": " + t.detail + " [detector " +
                                t.detector + "]; the pod never joined this generation, so its replacement joins it " +
                                "(no new generation, restart " + std::to_string(s.restarts) + " continues)"});
      }
      while (uids.size() > kMaxHandledUids) uids.erase(uids.begin());
      last["podUIDs"] = uids;
      last["replacedPods"] = replaced;
      s.status["lastRestart"] = last;
      s.scan.triggers.clear();
      s.replaced_now = true;
    }
  }
}

std::optional<std::chrono::milliseconds> Controller::restart_or_fail(Sync& s) {
  if (s.scan.triggers.empty()) return std::nullopt;
  Json& status = s.status;
  RestartInputs in;
  in.restarts = s.restarts;
  in.generation = s.gen;
  in.triggers = s.scan.triggers;
  in.handled_uids = s.handled;
  in.now_s = s.now_s;
  in.now = std::chrono::system_clock::now();
  in.step = status.value("step", Json(0));
  if (s.progress && s.progress->generation == s.gen) in.last_progress = s.progress->last_step_at;
  in.restart_request = s.scan.restart_request;
  const RestartPlan plan = plan_restart(s.spec, in);
  const Trigger& t = s.scan.triggers[plan.attributed];
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
