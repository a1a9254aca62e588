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
  s.gang = gang_state(s.name, s.spec.replicas, s.by_index, s.created, s.scan.node_by_pod);
  s.members = world_members(s.spec, s.name, s.capacity_short, s.gang.healthy);
  s.m = static_cast<int>(s.members.size());
  if (s.gen > 0 && !s.old_members.empty() && s.members != s.old_members && !s.resumed) {
    if (!s.restarted_now) {
      // The creates and binds above took a while: the world may have trained its last step meanwhile (a grow that
      // meets the end of the job). Opening the grow would leave it waiting for agents that have exited.
      const std::vector<PodPtr> now_pods = pods_of(s.job);
      const auto now_progress = fresh_progress(s);
      if (Completion c = completion_now(s, now_pods, now_progress); c.done)
        return complete(s, c, now_progress, now_pods);
      s.gen++;
      s.status["generation"] = s.gen;
      // The restart's world shrank before it formed (its lost pod's replacement found no room): the fault's
      // recovery ends with the first step of this generation.
      if (condition_true(s.status, "Restarting") && s.status.contains("lastRestart") &&
          s.status["lastRestart"].is_object() &&
          s.status["lastRestart"].value("generation", Json(-1)) == Json(s.gen - 1) &&
          !s.status["lastRestart"].contains("recoveredTime"))
        s.status["lastRestart"]["generation"] = s.gen;
    }
    std::string msg = "replicas " + std::to_string(s.old_members.size()) + " -> " + std::to_string(s.m) +
                      " in generation " + std::to_string(s.gen);
    if (s.m < s.spec.replicas)
      msg += " (capacity for " + std::to_string(s.m) + " of " + std::to_string(s.spec.replicas) +
             " pods, elastic.minReplicas " + std::to_string(s.spec.min_replicas.value_or(s.spec.replicas)) + ")";
    set_condition(s.status, "Resizing", true, s.m > static_cast<int>(s.old_members.size()) ? "ScaledUp" : "ScaledDown",
                  msg, s.now_s);
    s.events.push_back({false, "Resizing", msg});
  }
  return std::nullopt;
}

void Controller::plan_world(Sync& s) {
  s.world_spec = s.spec;  // with auto, an elastic world of m < n replicas gets its own plan
  if (s.auto_plan && s.m != s.spec.replicas) {
    AutoPlanOutcome resized = plan_parallelism(s.spec, s.m, node_inventory());
    if (resized.plan) {
      apply_plan(s.world_spec, *resized.plan);
      s.auto_plan = resized.plan;
    }
  }
  // Mixed GPU types under auto: the batch split by the speed of the nodes the world's pods are bound to (the plan's
  // split assumed a proportional share of each type), passed to the workers as parallelism.dpSplit.
  if (s.auto_plan && s.auto_plan->mixed) {
    const auto inventory = node_inventory();
    std::vector<std::string> pod_types;
    for (const auto& pod_name : s.members) {
      auto it = s.gang.node_of.find(pod_name);
      if (it == s.gang.node_of.end()) break;
      for (const NodeInfo& ni : inventory)
        if (ni.name == it->second) {
          auto label = ni.labels.find(wellknown::kGpuTypeLabel);
          pod_types.push_back(label == ni.labels.end() ? "" : label->second);
        }
    }
    if (pod_types.size() == s.members.size()) {
      std::optional<MixedSplit> placed_split = mixed_split(s.world_spec, pod_types);
      if (placed_split) {
        s.auto_plan->status["mixed"] = placed_split->status;
        s.dp_split = placed_split->dp_split;
      } else {
        s.auto_plan->status["mixed"] = {{"split", "even"}, {"why", "the pods are bound to nodes of one GPU type"}};
      }
    }
  }
  if (s.auto_plan) {
    s.status["plan"] = s.auto_plan->status;
    if (!s.orig.contains("plan") || s.orig["plan"].value("data", 0) != s.auto_plan->layout.dp ||
        s.orig["plan"].value("tensor", 0) != s.auto_plan->layout.tp ||
        s.orig["plan"].value("pipeline", 0) != s.auto_plan->layout.pp ||
        s.orig["plan"].value("zero", -1) != s.auto_plan->layout.zero ||
        s.orig["plan"].value("microBatch", 0) != s.auto_plan->layout.micro_batch ||
        s.orig["plan"].value("recompute", "") != s.auto_plan->status.value("recompute", "") ||
        s.orig["plan"].value("offload", "") != s.auto_plan->status.value("offload", "") ||
        s.orig["plan"].value("expert", 0) != s.auto_plan->status.value("expert", 0) ||
        s.orig["plan"].value("context", 1) != s.auto_plan->status.value("context", 1))
      s.events.push_back({false, "Planned", s.auto_plan->message});
  }
}

void Controller::write_observed_status(Sync& s) {
  const WorldLayout w = world_layout(s.world_spec, s.m);
  s.status["world"] = {
      {"size", w.size}, {"data", w.data}, {"tensor", w.tensor}, {"pipeline", w.pipeline}, {"pods", s.members}};
  if (w.context > 1) s.status["world"]["context"] = w.context;
  if (w.expert > 1) s.status["world"]["expert"] = w.expert;
  const GangState& gang = s.gang;
  const Json placed = gang.placed;
  s.status["replicas"] = gang.exist;
  if (gang.bound == s.spec.replicas) {
    Json pl = {{"nodes", placed}};
    if (s.placed_hops >= 0)
      pl["hops"] = s.placed_hops;
    else if (s.orig.contains("placement") && s.orig["placement"].value("nodes", Json()) == placed &&
             s.orig["placement"].contains("hops"))
      pl["hops"] = s.orig["placement"]["hops"];
    s.status["placement"] = pl;
  }
  // `progress` was fetched for the generation this reconcile started with: a generation opened or a restart decided
  // above moved `gen` on, and that generation has neither formed nor trained a first step yet.
  const RendezvousService::Progress* progress = s.progress && s.progress->generation == s.gen ? &*s.progress : nullptr;
  WorldFacts facts;
  facts.replicas = s.spec.replicas;
  facts.world = s.m;
  facts.exist = gang.exist;
  facts.bound = gang.bound;
  for (const auto& pod_name : s.members)
    if (auto it = gang.up.find(pod_name); it != gang.up.end() && it->second) facts.running++;
  facts.generation = s.gen;
  facts.rendezvous = s.agent && s.rdzv;
  facts.world_formed = progress && progress->world_complete;
  facts.join_timeout = s.join_timeout;
  facts.restarting = condition_true(s.status, "Restarting");
  facts.resizing = condition_true(s.status, "Resizing");
  const WorldStatus world = world_status(facts);
  for (const ConditionChange& c : world.conditions)
    set_condition(s.status, c.type, c.value, c.reason, c.message, s.now_s);
  s.status["phase"] = world.phase;
  if (progress && progress->first_step > 0 && s.status.contains("lastRestart") && s.status["lastRestart"].is_object()) {
    // Recovered: the new generation reported its first step (progress files are per generation, so any step seen
    // here was trained after the restart). Time and work lost are kept in status and observed once.
    Json& last = s.status["lastRestart"];
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
    goodput::note_worker_times(s.status, s.gen, progress->checkpoint_stall_seconds, progress->restore_seconds);
  if (s.progress) {
    s.status["step"] = s.progress->step;
    s.status["loss"] = s.progress->loss;
    s.status["tokensPerSecond"] = s.progress->tokens_per_second;
    s.status["progress"] = progress_text(s.progress->step, s.spec.steps);
  }
  // The rendezvous service has no callback for a completed world or progress: poll it while the job runs; each
  // second while the world waits for its first step or retrains lost steps, so the goodput ledger (goodput.h) sees
  // those end within a second.
  if (s.agent && s.rdzv) {
    const std::string ledger_state = goodput::state_of(s.status);
    const bool short_state = ledger_state == "rendezvousAndInit" || ledger_state == "recomputing";
    s.keep_min(!world.world_up ? milliseconds(500) : short_state ? milliseconds(1000) : milliseconds(5000));
  }
  if (status_differs(s.orig, s.status)) write_status(s.job, s.status);
  emit(s.job, s.events);
}

}  // namespace railyard::op
