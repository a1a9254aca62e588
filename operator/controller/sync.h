// One reconcile of one TrainingJob as it passes through the controller's stages (README.md in this folder): what was
// observed, what was decided, what was done. Controller::reconcile creates it with observe() and hands it on; each
// stage reads what the stages before it filled in.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "operator/api.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/pending_event.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/restart_triggers.h"
#include "operator/rendezvous/rendezvous.h"
#include "operator/scheduler/placement.h"

namespace railyard::op {

struct Sync {
  // Observed (sync_observe.cc): the job as read from the API server, its pods, and (observe_generation) what the
  // rendezvous service and the pods say about the current generation.
  std::string key, ns, name;
  Json job;
  std::chrono::system_clock::time_point now;
  std::string now_s;
  Json status, orig;         // the status being built; the status read (or last written), for the final comparison
  std::vector<PodPtr> pods;  // the informer's objects: read, never changed
  int existing = 0;          // pods not being deleted
  RendezvousService* rdzv = nullptr;
  std::vector<WorkerExit> exits;
  std::vector<JoinTimeout> timeouts;
  std::optional<RendezvousService::Progress> progress;  // the current generation's record, when the service has it
  std::string join_timeout;                             // why the world is incomplete, for the Running condition
  std::vector<std::string> old_members;                 // the current world's pods (status.world.pods)
  std::map<int, PodPtr> by_index;                       // pods at replica indices 0..replicas-1
  std::vector<PodPtr> extra;                            // pods beyond replicas (or duplicates)
  bool agent = true;                                    // the pods run the worker agent (uses the rendezvous)

  // Decided (sync_decide.cc).
  JobSpec spec;  // validated; with parallelism.auto, the plan applied
  std::optional<AutoPlan> auto_plan;
  bool resumed = false;  // runPolicy.suspend went back to false in this reconcile
  int64_t gen = 0;       // the generation, moved on by a start, a restart or a resize
  int restarts = 0;
  PlacementRequest job_placement;  // spec.placement and the failure exclusions (excludeFailedNodes)
  std::set<std::string> handled;   // pod uids a restart already handled (status.lastRestart.podUIDs)
  TriggerScan scan;                // the restart triggers (restart_triggers.h)
  bool replaced_now = false;       // a lost pod was replaced into the forming generation
  bool restarted_now = false;      // a restart opened a new generation
  int64_t label_gen = 0;           // the generation new pods are labelled with

  // Placed (sync_place.cc): where the pods without a node go, when the operator places them (scheduler railyard).
  // The pods it is about to create are placed with the existing unbound ones, as one gang, and created with their node
  // (one write per pod); the existing ones are bound (pods/binding).
  struct GangPlacement {
    bool tried = false;
    std::map<int, std::string> node;  // replica index -> node, for the pods placed now
    std::map<int, Json> annotations;  // replica index -> annotations that go with the node (NCCL settings of GPU pods)
    std::string how;                  // how it was placed, for the Bound event
  } placement;

  // Done (sync_act.cc).
  std::string token;
  std::vector<std::string> created;      // pods created now
  std::vector<int> unbound;              // replica indices of pods that exist (or were just created) without a node
  std::vector<std::string> bound_pairs;  // "pod -> node" of every pod given its node now (created with it or bound)
  bool exists_uncached = false;          // a create found the pod already there although the cache does not have it
  int placed_hops = -1;                  // the gang's worst same-rail hops, when placed now
  bool capacity_short = false;

  // The world and status (sync_status.cc).
  GangState gang;                    // the replica pods after the creates and binds (lifecycle.h gang_state)
  std::vector<std::string> members;  // the world's pods
  int m = 0;                         // members.size()
  JobSpec world_spec;                // with auto, an elastic world of m < replicas gets its own plan
  std::vector<int> dp_split;

  std::vector<PendingEvent> events;
  std::chrono::milliseconds requeue{0};
  // Requeue after `d` unless an earlier requeue is already asked for.
  void keep_min(std::chrono::milliseconds d) {
    if (d.count() > 0 && (requeue.count() == 0 || d < requeue)) requeue = d;
  }
};

// "a, b, c" for a short list; the first 20 and a count for a gang of hundreds (an event message stays readable).
inline std::string name_summary(const std::vector<std::string>& items) {
  constexpr size_t kShown = 20;
  std::string out;
  for (size_t i = 0; i < items.size() && i < kShown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > kShown) out += ", ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

}  // namespace railyard::op
