#include "operator/controller/restart_triggers.h"

#include <algorithm>

#include "common/rendezvous_protocol.h"
#include "common/restart_request.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"

namespace railyard::op {

namespace {

// The pods: lost, failed, deleted, or on a node that is lost or excluded.
void scan_pods(const JobSpec& spec, const TriggerInputs& in, TriggerScan& out) {
  const int per = spec.procs_per_replica;
  for (int i = 0; i < spec.replicas && in.generation > 0; ++i) {
    const std::string pod_name = worker_pod_name(in.name, i);
    auto it = in.pods_by_index.find(i);
    if (it == in.pods_by_index.end()) {
      // Only a pod of the running world can be lost; one the job is growing into (scale up) is yet to be created.
      const bool in_world = in.world.empty() || std::find(in.world.begin(), in.world.end(), pod_name) != in.world.end();
      if (in.was_running && !in.in_transition && in_world)
        out.triggers.push_back({"PodLost", "pod " + pod_name + " disappeared", pod_name, "", "operator", "", i * per});
      continue;
    }
    const Json& p = *it->second;
    const std::string uid = uid_of(p), node = node_of(p), ph = phase_of(p);
    const bool handled = in.handled_uids.count(uid) > 0;
    out.node_by_pod[pod_name] = node;
    if (ph == "Failed") {
      if (!handled) {
        int code = pod_exit_code(p);
        // The agent's own infrastructure exits (service unreachable, fenced) say nothing about the training.
        bool permanent = code > 0 && classify_exit(spec, code) == ExitClass::Permanent &&
                         !(in.agent && rdzv::is_agent_infrastructure_exit(code));
        out.triggers.push_back({"PodFailed", "pod " + pod_name + " failed with exit code " + std::to_string(code),
                                pod_name, node, "operator", uid, i * per, permanent});
        out.triggers.back().cause = pod_termination_message(p);
      }
      // Deleted too, even when its deletion is under way: its processes ended (pod_state.h processes_ended), and only
      // the kubelet's clean-up would hold the name its replacement needs (seconds).
      out.to_delete.push_back({pod_name, uid, true});
    } else if (terminating(p)) {
      if (!handled && !in.in_transition && ph != "Succeeded")
        out.triggers.push_back(
            {"PodDeleted", "pod " + pod_name + " is being deleted", pod_name, node, "operator", uid, i * per});
      // Its processes ended: only the kubelet's clean-up holds the name its replacement needs (pod_state.h).
      if (processes_ended(p)) out.to_delete.push_back({pod_name, uid, true});
    } else if (!node.empty()) {
      auto ready = in.node_ready.find(node);
      if (ready == in.node_ready.end() || !ready->second) {
        if (!handled)
          out.triggers.push_back(
              {"NodeLost",
               "node " + node + " of pod " + pod_name + " is " + (ready != in.node_ready.end() ? "not Ready" : "gone"),
               pod_name, node, "operator", uid, i * per});
        out.to_delete.push_back({pod_name, uid, true});
      } else if (in.excluded_nodes.count(node)) {
        // The node was blamed for a failure (railyard.dev/exclude-nodes): move the pod off it.
        if (!handled)
          out.triggers.push_back({"NodeExcluded",
                                  "node " + node + " of pod " + pod_name + " is in " + kExcludeNodesAnnotation,
                                  pod_name, node, "operator", uid, i * per});
        out.to_delete.push_back({pod_name, uid, true});
      }
    }
  }
}

// The exits the agents reported for the current generation.
void scan_exits(const JobSpec& spec, const TriggerInputs& in, TriggerScan& out) {
  for (const WorkerExit& e : in.exits) {
    if (e.generation != in.generation || e.reason == "stopped") continue;
    const std::string node = out.node_by_pod.count(e.pod) ? out.node_by_pod.at(e.pod) : "";
    // A trigger from this report: its pod and node, the process's own words and how long ago the report came.
    auto reported = [&](const char* reason, std::string detail, const char* detector) {
      Trigger tr{reason, std::move(detail), e.pod, node, detector, "", -1};
      tr.cause = e.message;
      tr.age = std::chrono::duration_cast<std::chrono::milliseconds>(in.now - e.received);
      return tr;
    };
    if (e.reason == "agent_restarted") {
      out.triggers.push_back(
          {"AgentRestarted",
           "the agent of pod " + e.pod + " restarted during generation " + std::to_string(in.generation), e.pod, node,
           "agent", "", -1});
      continue;
    }
    if (e.reason == kExitSilent) {
      // The service heard nothing from the pod for the silence threshold while a peer was heard: it is frozen,
      // partitioned or gone with its node, whose kubelet may still say Ready. Replaced at once (force: a frozen
      // kubelet never confirms), fenced by its UID should it wake. Only the pod that fell silent: a replacement of the
      // same name, or a pod that failed or is being deleted (scan_pods has it), is not.
      const Json* pod = nullptr;
      for (const auto& [i, p] : in.pods_by_index)
        if (worker_pod_name(in.name, i) == e.pod) pod = p.get();
      if (!pod || e.uid.empty() || uid_of(*pod) != e.uid || in.handled_uids.count(e.uid) || terminating(*pod) ||
          phase_of(*pod) == "Failed" || phase_of(*pod) == "Succeeded")
        continue;
      Trigger tr = reported("AgentSilent", "pod " + e.pod + (node.empty() ? "" : " on node " + node) + " fell silent",
                            "rendezvous");
      tr.uid = e.uid;
      tr.onset = e.onset;
      out.triggers.push_back(tr);
      out.to_delete.push_back({e.pod, e.uid, true});
      if (!node.empty()) out.suspect_nodes.push_back(node);
      continue;
    }
    if (e.reason == rdzv::kExitHung) {
      // The rank runs, but its agent saw it stopped, or blocked with no step and no CPU: the message says which.
      Trigger tr = reported("Hang", "rank " + std::to_string(e.global_rank) + " (pod " + e.pod + ") hung", "agent");
      tr.rank = e.global_rank;
      tr.onset = e.onset;
      out.triggers.push_back(tr);
      continue;
    }
    if (e.exit_code == 0 && e.signal == 0) continue;
    ExitClass cls = classify_exit(spec, e.exit_code, e.signal);
    std::string how = e.signal > 0 ? "was killed by signal " + std::to_string(e.signal)
                                   : "exited with code " + std::to_string(e.exit_code);
    Trigger tr =
        reported("WorkerExit", "rank " + std::to_string(e.global_rank) + " (pod " + e.pod + ") " + how, "agent");
    tr.rank = e.global_rank;
    tr.permanent = cls == ExitClass::Permanent;
    tr.peer_lost = e.signal == 0 && e.exit_code == rdzv::kExitPeerLost;
    out.triggers.push_back(tr);
  }
}

// A restart request (railyard.dev/restart-request) whose value was not handled yet.
void scan_request(const TriggerInputs& in, TriggerScan& out) {
  const std::string& req = in.restart_request;
  if (req.empty() || req == in.request_handled) return;
  out.restart_request = req;
  if (in.generation <= 0) return;
  Trigger tr{"RestartRequested",
             "restart requested (" + std::string(kRestartRequestAnnotation) + "=" + req + ")",
             "",
             "",
             in.restart_detector,
             "",
             -1};
  // The monitor's request names the rank and node it blames; a hand-written one may be any text.
  if (const std::optional<RestartRequest> r = parse_restart_request(req)) {
    if (r->rank >= 0) tr.rank = r->rank;
    tr.node = r->node;
    for (const auto& [pod, node] : out.node_by_pod)
      if (!tr.node.empty() && node == tr.node) tr.pod = pod;
  }
  out.triggers.push_back(tr);
}

}  // namespace

TriggerScan scan_triggers(const JobSpec& spec, const TriggerInputs& in) {
  TriggerScan out;
  scan_pods(spec, in, out);
  scan_exits(spec, in, out);
  scan_request(in, out);
  return out;
}

}  // namespace railyard::op
