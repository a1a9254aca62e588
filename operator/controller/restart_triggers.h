// Why a job restarts: every restart trigger of one reconcile, found in what the API server (pods, nodes, the job's
// annotations and status) and the rendezvous service (worker exits) report. Pure, so it is tested without a server
// (restart_triggers_test.cc). What happens next (holding for the culprit, replacing into a forming generation, which
// trigger the restart is attributed to, the failure policy) is decided in lifecycle.h and failure_policy.h.
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "operator/api.h"
#include "operator/controller/pod_state.h"
#include "operator/rendezvous/rendezvous.h"

namespace railyard::op {

struct Trigger {
  std::string reason, detail, pod, node, detector, uid;
  int rank = -1;
  bool permanent = false;
  bool peer_lost = false;            // a survivor's exit kExitPeerLost, not the cause
  std::chrono::milliseconds age{0};  // since the operator received the exit report
  // The failed process's own words, when it left any (the agent's exit report message; a Failed pod's
  // terminated.message): a tenant's text, sanitized and bounded where it is shown (failure_policy.h with_cause).
  std::string cause{};
  double onset = 0;  // Hang: when the hang began; AgentSilent: when the pod was last heard (unix seconds), for the time
                     // to detect
};

struct TriggerInputs {
  std::string name;                        // the job's name (pod names derive from it)
  int64_t generation = 0;                  // the current generation (0: never started, nothing can fail)
  std::map<int, PodPtr> pods_by_index;     // the job's pods at replica indices 0..replicas-1
  std::vector<std::string> world;          // the current world's pods (status.world.pods); empty: every replica
  std::set<std::string> handled_uids;      // pods whose loss a restart already handled (lastRestart.podUIDs)
  bool was_running = false;                // condition Running was True
  bool agent = true;                       // the pods run the pod agent (its infrastructure exits are retryable)
  bool in_transition = false;              // condition Restarting or Resizing was True
  std::map<std::string, bool> node_ready;  // each node the pods are bound to: Ready or not; absent: the node is gone
  std::set<std::string> excluded_nodes;    // railyard.dev/exclude-nodes (with excludeFailedNodes)
  std::vector<WorkerExit> exits;           // reported by the rendezvous service since the last reconcile
  std::chrono::steady_clock::time_point now{};
  std::string restart_request;                  // annotation railyard.dev/restart-request
  std::string restart_detector = "annotation";  // annotation railyard.dev/restart-detector, when set
  std::string request_handled;                  // status.restartRequestHandled
};

// A pod to delete: by name, on the condition that it is still the pod observed (its UID), so a delete decided on a
// stale view can never remove a replacement that took the name meanwhile (fenced by identity, not by name alone).
struct PodDeletion {
  std::string pod;
  std::string uid;
  bool force = true;  // grace period 0: its processes ended, or its node cannot confirm a graceful deletion
  bool operator==(const PodDeletion&) const = default;
};

struct TriggerScan {
  std::vector<Trigger> triggers;
  std::vector<PodDeletion> to_delete;              // failed pods and pods on lost/excluded nodes
  std::map<std::string, std::string> node_by_pod;  // bound pods -> their node
  // Nodes of pods that fell silent (AgentSilent): the job's replacements stay off them a while (suspect_nodes.h), as
  // such a node may be frozen and still look Ready.
  std::vector<std::string> suspect_nodes;
  std::string restart_request;  // a restart request not handled before (this reconcile handles it), else empty
};

// Triggers: PodLost (a pod of a Running world vanished), PodFailed (with its exit code through the failure policy),
// PodDeleted, NodeLost (not Ready or gone), NodeExcluded, AgentRestarted, WorkerExit and Hang (an agent found its rank
// hung; for the current generation), AgentSilent (the rendezvous service heard nothing from a pod for the silence
// threshold: the pod, with that UID, is deleted with force and replaced), RestartRequested (a new annotation value; its
// rank and node from the monitor's request).
TriggerScan scan_triggers(const JobSpec& spec, const TriggerInputs& in);

}  // namespace railyard::op
