// Status: the world the job runs (members, resizes, its plan) and the conditions, phase, recovery and progress
// derived from what was observed and done; written once, with the events, at the end of the reconcile.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <set>

#include "common/log.h"
#include "common/wellknown.h"
#include "operator/controller/controller.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/goodput.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"
#include "operator/scheduler/nccl_env.h"

namespace railyard::op {

namespace {
using std::chrono::milliseconds;
}  // namespace

std::optional<std::chrono::milliseconds> Controller::resize_world(Sync& s) {
  const std::string& name = s.name;
  const std::string& now_s = s.now_s;
  Json& status = s.status;
  std::vector<PendingEvent>& events = s.events;
  const JobSpec& spec = s.spec;
  const int n = s.spec.replicas;
  bool& resumed = s.resumed;
  int64_t& gen = s.gen;
  std::vector<std::string>& old_members = s.old_members;
  std::map<int, PodPtr>& by_index = s.by_index;
  std::map<std::string, std::string>& node_by_pod = s.scan.node_by_pod;
  bool& restarted_now = s.restarted_now;
  std::vector<std::string>& created = s.created;
  bool& capacity_short = s.capacity_short;
  std::map<std::string, std::string>& node_of_pod_name = s.node_of_pod_name;
  int& exist = s.exist;
  int& bound = s.bound;
  Json& placed = s.placed;
  std::vector<std::string>& healthy = s.healthy;
  std::map<std::string, bool>& up = s.up;
  std::vector<std::string>& members = s.members;
  int& m = s.m;
  // Observed state -> conditions and phase.
  // Bound pods -> their nodes (the mixed-GPU split reads the nodes' GPU types).
  for (int i = 0; i < n; ++i) {
    const std::string pod_name = worker_pod_name(name, i);
    auto it = by_index.find(i);
    bool just_created = std::find(created.begin(), created.end(), pod_name) != created.end();
    if (it == by_index.end() && !just_created) continue;
    if (it != by_index.end() && terminating(*it->second)) continue;
    exist++;
    std::string node = it != by_index.end() ? node_of(*it->second) : "";
    if (node.empty() && node_by_pod.count(pod_name)) node = node_by_pod[pod_name];
    if (!node.empty()) {
      bound++;
      node_of_pod_name[pod_name] = node;
      placed.push_back(node);
    }
    if (!node.empty() && (it == by_index.end() || phase_of(*it->second) != "Failed")) healthy.push_back(pod_name);
    // A pod whose worker already finished still counts: the job runs until every pod is done.
    up[pod_name] = it != by_index.end() && (phase_of(*it->second) == "Running" || phase_of(*it->second) == "Succeeded");
  }
  // The world: every replica, or for an elastic job short of capacity the healthy pods it can run with.
  if (capacity_short) {
    int k = elastic_world_replicas(spec, static_cast<int>(healthy.size()));
    if (k > 0) members.assign(healthy.begin(), healthy.begin() + k);
  }
  if (members.empty())
    for (int i = 0; i < n; ++i) members.push_back(worker_pod_name(name, i));
  m = static_cast<int>(members.size());
  if (gen > 0 && !old_members.empty() && members != old_members && !resumed) {
    if (!restarted_now) {
      // The creates and binds above took a while: the world may have trained its last step meanwhile (a grow that
      // meets the end of the job). Opening the grow would leave it waiting for agents that have exited.
      const std::vector<PodPtr> now_pods = pods_of(s.job);
      const auto now_progress = fresh_progress(s);
      if (Completion c = completion_now(s, now_pods, now_progress); c.done)
        return complete(s, c, now_progress, now_pods);
      gen++;
      status["generation"] = gen;
      // The restart's world shrank before it formed (its lost pod's replacement found no room): the fault's
      // recovery ends with the first step of this generation.
      if (condition_true(status, "Restarting") && status.contains("lastRestart") && status["lastRestart"].is_object() &&
          status["lastRestart"].value("generation", Json(-1)) == Json(gen - 1) &&
          !status["lastRestart"].contains("recoveredTime"))
        status["lastRestart"]["generation"] = gen;
    }
    std::string msg = "replicas " + std::to_string(old_members.size()) + " -> " + std::to_string(m) +
                      " in generation " + std::to_string(gen);
    if (m < n)
      msg += " (capacity for " + std::to_string(m) + " of " + std::to_string(n) + " pods, elastic.minReplicas " +
             std::to_string(spec.min_replicas.value_or(n)) + ")";
    set_condition(status, "Resizing", true, m > static_cast<int>(old_members.size()) ? "ScaledUp" : "ScaledDown", msg,
                  now_s);
    events.push_back({false, "Resizing", msg});
  }
  return std::nullopt;
}

void Controller::plan_world(Sync& s) {
  Json& status = s.status;
  Json& orig = s.orig;
  std::vector<PendingEvent>& events = s.events;
  const JobSpec& spec = s.spec;
  const int n = s.spec.replicas;
  std::optional<AutoPlan>& auto_plan = s.auto_plan;
  std::map<std::string, std::string>& node_of_pod_name = s.node_of_pod_name;
  std::vector<std::string>& members = s.members;
  int& m = s.m;
  JobSpec& world_spec = s.world_spec;
  std::vector<int>& dp_split = s.dp_split;
  world_spec = spec;  // with auto, an elastic world of m < n replicas gets its own plan
  if (auto_plan && m != n) {
    AutoPlanOutcome resized = plan_parallelism(spec, m, node_inventory());
    if (resized.plan) {
      apply_plan(world_spec, *resized.plan);
      auto_plan = resized.plan;
    }
  }
  // Mixed GPU types under auto: the batch split by the speed of the nodes the world's pods are bound to (the plan's
  // split assumed a proportional share of each type), passed to the workers as parallelism.dpSplit.
  if (auto_plan && auto_plan->mixed) {
    const auto inventory = node_inventory();
    std::vector<std::string> pod_types;
    for (const auto& pod_name : members) {
      auto it = node_of_pod_name.find(pod_name);
      if (it == node_of_pod_name.end()) break;
      for (const NodeInfo& ni : inventory)
        if (ni.name == it->second) {
          auto label = ni.labels.find(wellknown::kGpuTypeLabel);
          pod_types.push_back(label == ni.labels.end() ? "" : label->second);
        }
    }
    if (pod_types.size() == members.size()) {
      std::optional<MixedSplit> placed_split = mixed_split(world_spec, pod_types);
      if (placed_split) {
        auto_plan->status["mixed"] = placed_split->status;
        dp_split = placed_split->dp_split;
      } else {
        auto_plan->status["mixed"] = {{"split", "even"}, {"why", "the pods are bound to nodes of one GPU type"}};
      }
    }
  }
  if (auto_plan) {
    status["plan"] = auto_plan->status;
    if (!orig.contains("plan") || orig["plan"].value("data", 0) != auto_plan->layout.dp ||
        orig["plan"].value("tensor", 0) != auto_plan->layout.tp ||
        orig["plan"].value("pipeline", 0) != auto_plan->layout.pp ||
        orig["plan"].value("zero", -1) != auto_plan->layout.zero ||
        orig["plan"].value("microBatch", 0) != auto_plan->layout.micro_batch ||
        orig["plan"].value("recompute", "") != auto_plan->status.value("recompute", "") ||
        orig["plan"].value("offload", "") != auto_plan->status.value("offload", "") ||
        orig["plan"].value("expert", 0) != auto_plan->status.value("expert", 0) ||
        orig["plan"].value("context", 1) != auto_plan->status.value("context", 1))
      events.push_back({false, "Planned", auto_plan->message});
  }
}

void Controller::write_observed_status(Sync& s) {
  const std::string& key = s.key;
  Json& job = s.job;
  const std::string& now_s = s.now_s;
  Json& status = s.status;
  Json& orig = s.orig;
  std::vector<PendingEvent>& events = s.events;
  auto keep_min = [&s](milliseconds d) { s.keep_min(d); };
  const JobSpec& spec = s.spec;
  const int n = s.spec.replicas;
  int64_t& gen = s.gen;
  RendezvousService*& rdzv = s.rdzv;
  std::optional<RendezvousService::Progress>& progress = s.progress;
  std::string& join_timeout = s.join_timeout;
  const bool agent = s.agent;
  int& placed_hops = s.placed_hops;
  int& exist = s.exist;
  int& bound = s.bound;
  Json& placed = s.placed;
  std::map<std::string, bool>& up = s.up;
  std::vector<std::string>& members = s.members;
  int& m = s.m;
  JobSpec& world_spec = s.world_spec;
  WorldLayout w = world_layout(world_spec, m);
  status["world"] = {
      {"size", w.size}, {"data", w.data}, {"tensor", w.tensor}, {"pipeline", w.pipeline}, {"pods", members}};
  if (w.context > 1) status["world"]["context"] = w.context;
  if (w.expert > 1) status["world"]["expert"] = w.expert;
  int running = 0;
  for (const auto& pod_name : members)
    if (up[pod_name]) running++;
  status["replicas"] = exist;
  if (bound == n) {
    Json pl = {{"nodes", placed}};
    if (placed_hops >= 0)
      pl["hops"] = placed_hops;
    else if (orig.contains("placement") && orig["placement"].value("nodes", Json()) == placed &&
             orig["placement"].contains("hops"))
      pl["hops"] = orig["placement"]["hops"];
    status["placement"] = pl;
  }
  set_condition(status, "Created", exist == n, exist == n ? "PodsCreated" : "CreatingPods",
                std::to_string(exist) + " of " + std::to_string(n) + " worker pods exist", now_s);
  if (bound == n)
    set_condition(status, "Scheduled", true, "Bound", "all " + std::to_string(n) + " pods are bound to nodes", now_s);
  bool world_up = running == m;
  // `progress` is the generation this reconcile started with: a generation opened above has not formed yet.
  if (world_up && agent && rdzv) world_up = progress && progress->generation == gen && progress->world_complete;
  if (world_up) {
    set_condition(status, "Running", true, "AllPodsRunning",
                  agent && rdzv ? "every pod joined generation " + std::to_string(gen)
                                : std::to_string(m) + " of " + std::to_string(n) + " worker pods are running",
                  now_s);
    if (condition_true(status, "Restarting"))
      set_condition(status, "Restarting", false, "Recovered", "generation " + std::to_string(gen) + " is running",
                    now_s);
    if (condition_true(status, "Resizing"))
      set_condition(status, "Resizing", false, "Resized",
                    "generation " + std::to_string(gen) + " runs " + std::to_string(m) + " replicas", now_s);
  } else {
    if (!join_timeout.empty() && running == m)
      set_condition(status, "Running", false, "JoinTimeout", join_timeout, now_s);
    else
      set_condition(status, "Running", false, "PodsNotRunning",
                    std::to_string(running) + " of " + std::to_string(m) + " worker pods of the world running", now_s);
  }
  if (condition_true(status, "Restarting"))
    status["phase"] = "Restarting";
  else if (condition_true(status, "Resizing"))
    status["phase"] = "Resizing";
  else if (world_up)
    status["phase"] = "Running";
  else if (bound == n)
    status["phase"] = "Scheduled";
  else if (exist == n)
    status["phase"] = "Created";
  else
    status["phase"] = "Pending";
  // `progress` was fetched for the generation this reconcile started with; a restart above moved `gen` on, and the
  // old generation's first step must not count as the new one's recovery.
  if (progress && progress->generation == gen && progress->first_step > 0 && status.contains("lastRestart") &&
      status["lastRestart"].is_object()) {
    // Recovered: the new generation reported its first step (progress files are per generation, so any step seen
    // here was trained after the restart). Time and work lost are kept in status and observed once.
    Json& last = status["lastRestart"];
    if (last.value("generation", Json(-1)) == Json(gen) && !last.contains("recoveredTime") && last.contains("time") &&
        last["time"].is_string()) {
      // Timed by when the rendezvous service received the first step, not by this (polling) reconcile.
      const double secs =
          std::chrono::duration<double>(progress->first_step_at - kube::parse_rfc3339(last["time"].get<std::string>()))
              .count();
      last["recoveredTime"] = kube::format_rfc3339(progress->first_step_at);
      last["recoverySeconds"] = std::round(std::max(0.0, secs) * 10) / 10;
      // The first step the service received: within one agent poll period of the first step trained, so not the
      // step after the restored checkpoint (the worker logs that one).
      last["resumedStep"] = progress->first_step;
      bool first_time = false;
      {
        std::lock_guard lock(mu_);
        auto [it, inserted] = recovery_observed_.emplace(key, gen);
        first_time = inserted || it->second != gen;
        it->second = gen;
      }
      if (first_time) recovery_seconds_.add({{"reason", last.value("reason", "")}}).observe(std::max(0.0, secs));
    }
  }
  if (progress && progress->generation == gen)
    goodput::note_worker_times(status, gen, progress->checkpoint_stall_seconds, progress->restore_seconds);
  if (progress) {
    status["step"] = progress->step;
    status["loss"] = progress->loss;
    status["tokensPerSecond"] = progress->tokens_per_second;
    status["progress"] = progress_text(progress->step, spec.steps);
  }
  // The rendezvous service has no callback for a completed world or progress: poll it while the job runs; each
  // second while the world waits for its first step or retrains lost steps, so the goodput ledger (goodput.h) sees
  // those end within a second.
  if (agent && rdzv) {
    const std::string ledger_state = goodput::state_of(status);
    const bool short_state = ledger_state == "rendezvousAndInit" || ledger_state == "recomputing";
    keep_min(!world_up ? milliseconds(500) : short_state ? milliseconds(1000) : milliseconds(5000));
  }
  if (status_differs(orig, status)) write_status(job, status);
  emit(job, events);
}

}  // namespace railyard::op
