// Decisions of the reconcile kept free of the API server so they can be tested alone: whether a job has finished for
// good (Succeeded and Failed are terminal), whether the job's current generation already finished (completion wins
// over any resize or restart), and whether a pod lost while a restart's generation is still forming is replaced into
// that generation instead of opening (and counting) another one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "operator/api.h"
#include "operator/controller/pod_state.h"

namespace railyard::op {

// What decides whether a job has finished, and what was asked of it since.
struct FinishedFacts {
  std::string phase;                 // status.phase
  bool succeeded_condition = false;  // condition Succeeded is True
  bool failed_condition = false;     // condition Failed is True
  int64_t generation = 0;            // metadata.generation (the spec's version)
  int64_t observed_generation = -1;  // status.observedGeneration; -1 when absent
  std::string restart_request;       // annotation railyard.dev/restart-request
  std::string restart_handled;       // annotation railyard.dev/restart-handled
  std::string request_handled;       // status.restartRequestHandled
};

struct FinishedJob {
  bool finished = false;
  std::string result;                // Succeeded or Failed
  bool spec_ignored = false;         // the spec changed after the job finished (a scale, an edit, a suspend)
  bool restart_ignored = false;      // a restart request arrived after the job finished
  std::vector<std::string> ignored;  // one event message (reason IgnoredAfterFinish) per ignored request
};

// Succeeded and Failed are terminal, as for a Kubernetes Job: once status.phase (or, for a status an older operator
// overwrote, condition Succeeded or Failed) says so, no spec change, scale or restart request reopens the job. The
// reconcile keeps phase, conditions and the result in status; it only acknowledges what it ignored (observedGeneration,
// the restart-handled annotation) and reports it, once, in an event.
FinishedJob finished_job(const FinishedFacts& f);

// What the controller can observe about the end of a generation. All of it is level state: pod phases from the API
// server and the rendezvous service's record of the generation, never an event remembered by the operator.
struct CompletionSignals {
  int64_t generation = 0;
  bool agent = true;               // the pods run railyard-worker's agent (the template sets no command)
  std::vector<std::string> world;  // the pods of the current world (status.world.pods, else every replica)
  std::map<std::string, std::string> pod_phase;  // worker pod name -> status.phase
  bool rendezvous_all_succeeded = false;         // every rank of `generation` reported exit 0
};

struct Completion {
  bool done = false;
  bool by_rendezvous = false;  // the rendezvous service saw every rank exit 0 (its step/loss are final)
  std::string reason;          // condition reason: AllRanksSucceeded, AllPodsSucceeded, AgentSucceeded
  std::string message;
};

// Done when every rank of the generation exited 0, when every world pod Succeeded, or (agent jobs) when any world
// pod Succeeded: an agent exits 0 only after the rendezvous service told it the job is done (or closed the job
// after its workers succeeded), so one such pod proves the job trained its last step even when a later
// generation (a grow or a restart opened as the last step finished) waits for it in vain.
Completion job_completion(const CompletionSignals& s);

// A restart trigger, as far as the replacement rule needs it.
struct TriggerFacts {
  std::string reason;  // PodFailed, NodeLost, NodeExcluded, WorkerExit, ...
  std::string pod;
  bool permanent = false;
  bool peer_lost = false;            // WorkerExit with kExitPeerLost: a survivor whose collective lost a peer
  std::chrono::milliseconds age{0};  // WorkerExit: since the operator received the report
};

// The generation a restart opened, while it forms.
struct FormingGeneration {
  bool restarting = false;            // condition Restarting is True: the restart's world was never seen complete
  bool rendezvous_known = false;      // the rendezvous service has this generation open
  bool world_complete = false;        // every pod joined it (its workers may be running)
  std::vector<std::string> missing;   // pods that have not joined it
  std::vector<std::string> replaced;  // pods already replaced into it (status.lastRestart.replacedPods)
};

// True when every trigger is the loss of a pod (PodFailed, NodeLost, NodeExcluded; not permanent) that never joined
// the generation a restart opened and is still forming, and that was not replaced into it before: the pod is
// replaced and its successor joins the same generation, so one fault (a node loss first reported by the survivor's
// exit, then by the node going NotReady) is one generation and one restart. Each pod is replaced at most once per
// generation, so a pod that keeps failing before it joins still spends the restart budget.
bool replace_into_forming_generation(const FormingGeneration& g, const std::vector<TriggerFacts>& triggers);

// A killed rank's survivors see the loss in their next collective and exit kExitPeerLost, and their reports can reach
// the operator before the killed rank's own. When every trigger is such a survivor's exit, the restart is held until
// the oldest report is `grace` old, so the culprit's report (a signal, another code) names the failure instead of a
// survivor. Returns how much longer to hold: 0 means restart now (some trigger is a cause, or the grace is over).
// The recovery does not change, only its attribution (status.lastRestart, node exclusion of WorkerExit).
std::chrono::milliseconds hold_for_culprit(const std::vector<TriggerFacts>& triggers, std::chrono::milliseconds grace);

// Which trigger the restart is attributed to (status.lastRestart, events, the restarts metric's reason): a permanent
// failure first (it decides the job), then a restart request (the monitor's diagnosis), then the first trigger that
// is not a survivor's peer-lost exit (once the culprit's report is in, it names the failure, whichever report came
// first), else the first. Index into `triggers` (0 when empty).
size_t attribution(const std::vector<TriggerFacts>& triggers);

// What the world's pods and the rendezvous service say about the current generation, for its conditions and phase.
struct WorldFacts {
  int replicas = 0;           // spec.replicas
  int world = 0;              // the world's pods (an elastic world short of capacity runs fewer)
  int exist = 0;              // replica pods that exist and are not being deleted
  int bound = 0;              // of those, bound to a node
  int running = 0;            // world pods running (or already finished)
  int64_t generation = 0;     // the current generation
  bool rendezvous = false;    // the pods join the rendezvous service (agent jobs with the service on)
  bool world_formed = false;  // the service says every pod joined `generation` (its record of that generation)
  std::string join_timeout;   // why the world is incomplete after the join timeout; empty when it is not
  bool restarting = false;    // condition Restarting is True (a restart waits for its world)
  bool resizing = false;      // condition Resizing is True
};

struct ConditionChange {
  std::string type;
  bool value = false;
  std::string reason, message;
};

struct WorldStatus {
  bool world_up = false;                    // every world pod runs and, with the rendezvous, the generation formed
  std::vector<ConditionChange> conditions;  // to set, in order (status.h set_condition)
  std::string phase;
};

// Created (every replica's pod exists), Scheduled (every one bound), Running (the world up, else why not: the join
// timeout's message once every pod runs, else how many run); a restart or resize ends (Recovered, Resized) when the
// world is up. The phase: Restarting or Resizing while those wait, then Running, Scheduled, Created, Pending.
WorldStatus world_status(const WorldFacts& f);

// The gang's gaps: replica indices without a pod get one now (`create`), unless the old pod of that name is still
// being deleted (`deleting`: its deletion event brings the reconcile back); pods that exist without a node, not
// terminating nor failed, wait for one (`unbound`). Both in index order.
struct GangGaps {
  std::vector<int> create;
  std::vector<int> unbound;
};
GangGaps gang_gaps(int replicas, const std::map<int, PodPtr>& pods_by_index, const std::set<int>& deleting);

// The gang after this reconcile's creates: the replica pods that exist (not being deleted; a pod created now counts,
// though the cache has not seen it), which of them are bound and where, which are healthy (bound and not failed: an
// elastic world short of capacity runs those) and which run (or already finished: the job runs until every pod is
// done).
struct GangState {
  int exist = 0;
  int bound = 0;
  std::vector<std::string> placed;             // the bound pods' nodes, in index order
  std::map<std::string, std::string> node_of;  // bound pod -> its node
  std::vector<std::string> healthy;            // in index order
  std::map<std::string, bool> up;              // pod -> Running or Succeeded
};
// `created`: the pods this reconcile created; `known_nodes`: pod -> node as this reconcile knows it (the bound pods the
// trigger scan saw, and those it created on a node or bound now), for pods the cache does not show bound yet.
GangState gang_state(const std::string& job_name, int replicas, const std::map<int, PodPtr>& pods_by_index,
                     const std::vector<std::string>& created, const std::map<std::string, std::string>& known_nodes);

// The world: every replica, or for an elastic job short of capacity the first healthy pods it can run with
// (common/job_spec.h elastic_world_replicas).
std::vector<std::string> world_members(const JobSpec& spec, const std::string& job_name, bool capacity_short,
                                       const std::vector<std::string>& healthy);

}  // namespace railyard::op
