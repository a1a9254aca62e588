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
#include "operator/controller/restart_plan.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"
#include "operator/scheduler/nccl_env.h"

namespace railyard::op {

namespace {
using std::chrono::milliseconds;
}  // namespace

std::optional<std::chrono::milliseconds> Controller::resize_world(Sync& s) {
  const std::string& now_s = s.now_s;
  Json& status = s.status;
  std::vector<PendingEvent>& events = s.events;
  const JobSpec& spec = s.spec;
  const int n = s.spec.replicas;
  int64_t& gen = s.gen;
  const std::vector<std::string>& old_members = s.old_members;
  std::vector<std::string>& members = s.members;
  int& m = s.m;
  s.gang = gang_state(s.name, n, s.by_index, s.created, s.scan.node_by_pod);
  members = world_members(spec, s.name, s.capacity_short, s.gang.healthy);
  m = static_cast<int>(members.size());
  if (gen > 0 && !old_members.empty() && members != old_members && !s.resumed) {
    if (!s.restarted_now) {
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
  const std::map<std::string, std::string>& node_of_pod_name = s.gang.node_of;
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
  Json& status = s.status;
  const int n = s.spec.replicas;
  const WorldLayout w = world_layout(s.world_spec, s.m);
  status["world"] = {
      {"size", w.size}, {"data", w.data}, {"tensor", w.tensor}, {"pipeline", w.pipeline}, {"pods", s.members}};
  if (w.context > 1) status["world"]["context"] = w.context;
  if (w.expert > 1) status["world"]["expert"] = w.expert;
  const GangState& gang = s.gang;
  const Json placed = gang.placed;
  status["replicas"] = gang.exist;
  if (gang.bound == n) {
    Json pl = {{"nodes", placed}};
    if (s.placed_hops >= 0)
      pl["hops"] = s.placed_hops;
    else if (s.orig.contains("placement") && s.orig["placement"].value("nodes", Json()) == placed &&
             s.orig["placement"].contains("hops"))
      pl["hops"] = s.orig["placement"]["hops"];
    status["placement"] = pl;
  }
  // `progress` was fetched for the generation this reconcile started with: a generation opened or a restart decided
  // above moved `gen` on, and that generation has neither formed nor trained a first step yet.
  const RendezvousService::Progress* progress = s.progress && s.progress->generation == s.gen ? &*s.progress : nullptr;
  WorldFacts facts;
  facts.replicas = n;
  facts.world = s.m;
  facts.exist = gang.exist;
  facts.bound = gang.bound;
  for (const auto& pod_name : s.members)
    if (auto it = gang.up.find(pod_name); it != gang.up.end() && it->second) facts.running++;
  facts.generation = s.gen;
  facts.rendezvous = s.agent && s.rdzv;
  facts.world_formed = progress && progress->world_complete;
  facts.join_timeout = s.join_timeout;
  facts.restarting = condition_true(status, "Restarting");
  facts.resizing = condition_true(status, "Resizing");
  const WorldStatus world = world_status(facts);
  for (const ConditionChange& c : world.conditions)
    set_condition(status, c.type, c.value, c.reason, c.message, s.now_s);
  status["phase"] = world.phase;
  if (progress && progress->first_step > 0 && status.contains("lastRestart") && status["lastRestart"].is_object()) {
    // Recovered: the new generation reported its first step (progress files are per generation, so any step seen
    // here was trained after the restart). Time and work lost are kept in status and observed once.
    Json& last = status["lastRestart"];
    if (const std::optional<double> secs = mark_recovered(last, s.gen, progress->first_step_at, progress->first_step)) {
      bool first_time = false;
      {
        std::lock_guard lock(mu_);
        auto [it, inserted] = recovery_observed_.emplace(s.key, s.gen);
        first_time = inserted || it->second != s.gen;
        it->second = s.gen;
      }
      if (first_time) recovery_seconds_.add({{"reason", last.value("reason", "")}}).observe(*secs);
    }
  }
  if (progress)
    goodput::note_worker_times(status, s.gen, progress->checkpoint_stall_seconds, progress->restore_seconds);
  if (s.progress) {
    status["step"] = s.progress->step;
    status["loss"] = s.progress->loss;
    status["tokensPerSecond"] = s.progress->tokens_per_second;
    status["progress"] = progress_text(s.progress->step, s.spec.steps);
  }
  // The rendezvous service has no callback for a completed world or progress: poll it while the job runs; each
  // second while the world waits for its first step or retrains lost steps, so the goodput ledger (goodput.h) sees
  // those end within a second.
  if (s.agent && s.rdzv) {
    const std::string ledger_state = goodput::state_of(status);
    const bool short_state = ledger_state == "rendezvousAndInit" || ledger_state == "recomputing";
    s.keep_min(!world.world_up ? milliseconds(500) : short_state ? milliseconds(1000) : milliseconds(5000));
  }
  if (status_differs(s.orig, status)) write_status(s.job, status);
  emit(s.job, s.events);
}

}  // namespace railyard::op
