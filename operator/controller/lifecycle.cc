#include "operator/controller/lifecycle.h"

#include <algorithm>

#include "operator/controller/pod_builder.h"

namespace railyard::op {

namespace {
bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}
}  // namespace

FinishedJob finished_job(const FinishedFacts& f) {
  FinishedJob out;
  if (f.phase == "Succeeded" || f.phase == "Failed")
    out.result = f.phase;
  else if (f.succeeded_condition)
    out.result = "Succeeded";
  else if (f.failed_condition)
    out.result = "Failed";
  else
    return out;
  out.finished = true;
  const std::string kept = ": the job already " + out.result +
                           "; phase, conditions and status are kept (a finished job is not reopened: delete it and "
                           "apply it again to run it again)";
  if (f.observed_generation >= 0 && f.generation > f.observed_generation) {
    out.spec_ignored = true;
    out.ignored.push_back("spec change ignored (generation " + std::to_string(f.observed_generation) + " -> " +
                          std::to_string(f.generation) + ")" + kept);
  }
  if (!f.restart_request.empty() && f.restart_request != f.restart_handled && f.restart_request != f.request_handled) {
    out.restart_ignored = true;
    // The monitor's request is JSON with its evidence: the event names its start.
    const std::string req =
        f.restart_request.size() > 120 ? f.restart_request.substr(0, 120) + "..." : f.restart_request;
    out.ignored.push_back("restart request '" + req + "' ignored" + kept);
  }
  return out;
}

Completion job_completion(const CompletionSignals& s) {
  Completion c;
  if (s.generation <= 0) return c;
  if (s.rendezvous_all_succeeded) {
    c.done = c.by_rendezvous = true;
    c.reason = "AllRanksSucceeded";
    c.message = "every rank of generation " + std::to_string(s.generation) + " exited 0";
    return c;
  }
  std::vector<std::string> succeeded;
  for (const auto& pod : s.world)
    if (auto it = s.pod_phase.find(pod); it != s.pod_phase.end() && it->second == "Succeeded") succeeded.push_back(pod);
  if (!s.world.empty() && succeeded.size() == s.world.size()) {
    c.done = true;
    c.reason = "AllPodsSucceeded";
    c.message = "all " + std::to_string(s.world.size()) + " worker pods succeeded";
    return c;
  }
  if (s.agent && !succeeded.empty()) {
    c.done = true;
    c.reason = "AgentSucceeded";
    c.message = "the agent of pod " + succeeded.front() + " exited 0 after its workers finished the job (generation " +
                std::to_string(s.generation) + " had not formed yet)";
  }
  return c;
}

bool replace_into_forming_generation(const FormingGeneration& g, const std::vector<TriggerFacts>& triggers) {
  if (triggers.empty() || !g.restarting || !g.rendezvous_known || g.world_complete) return false;
  for (const TriggerFacts& t : triggers) {
    if (t.permanent || t.pod.empty()) return false;
    if (t.reason != "PodFailed" && t.reason != "NodeLost" && t.reason != "NodeExcluded" && t.reason != "AgentSilent")
      return false;
    if (!contains(g.missing, t.pod) || contains(g.replaced, t.pod)) return false;
  }
  return true;
}

std::chrono::milliseconds hold_for_culprit(const std::vector<TriggerFacts>& triggers, std::chrono::milliseconds grace) {
  if (triggers.empty()) return std::chrono::milliseconds(0);
  std::chrono::milliseconds oldest{0};
  for (const TriggerFacts& t : triggers) {
    if (t.reason != "WorkerExit" || !t.peer_lost || t.permanent) return std::chrono::milliseconds(0);
    oldest = std::max(oldest, t.age);
  }
  return oldest < grace ? grace - oldest : std::chrono::milliseconds(0);
}

size_t attribution(const std::vector<TriggerFacts>& triggers) {
  for (size_t i = 0; i < triggers.size(); ++i)
    if (triggers[i].permanent) return i;
  for (size_t i = 0; i < triggers.size(); ++i)
    if (triggers[i].reason == "RestartRequested") return i;
  for (size_t i = 0; i < triggers.size(); ++i)
    if (!triggers[i].peer_lost) return i;
  return 0;
}

WorldStatus world_status(const WorldFacts& f) {
  WorldStatus w;
  const std::string n = std::to_string(f.replicas), gen = std::to_string(f.generation);
  const bool all_exist = f.exist == f.replicas, all_bound = f.bound == f.replicas;
  w.conditions.push_back({"Created", all_exist, all_exist ? "PodsCreated" : "CreatingPods",
                          std::to_string(f.exist) + " of " + n + " worker pods exist"});
  if (all_bound) w.conditions.push_back({"Scheduled", true, "Bound", "all " + n + " pods are bound to nodes"});
  w.world_up = f.running == f.world && (!f.rendezvous || f.world_formed);
  if (w.world_up) {
    w.conditions.push_back({"Running", true, "AllPodsRunning",
                            f.rendezvous ? "every pod joined generation " + gen
                                         : std::to_string(f.world) + " of " + n + " worker pods are running"});
    if (f.restarting) w.conditions.push_back({"Restarting", false, "Recovered", "generation " + gen + " is running"});
    if (f.resizing)
      w.conditions.push_back(
          {"Resizing", false, "Resized", "generation " + gen + " runs " + std::to_string(f.world) + " replicas"});
  } else if (!f.join_timeout.empty() && f.running == f.world) {
    w.conditions.push_back({"Running", false, "JoinTimeout", f.join_timeout});
  } else {
    w.conditions.push_back(
        {"Running", false, "PodsNotRunning",
         std::to_string(f.running) + " of " + std::to_string(f.world) + " worker pods of the world running"});
  }
  if (f.restarting && !w.world_up)
    w.phase = "Restarting";
  else if (f.resizing && !w.world_up)
    w.phase = "Resizing";
  else if (w.world_up)
    w.phase = "Running";
  else if (all_bound)
    w.phase = "Scheduled";
  else if (all_exist)
    w.phase = "Created";
  else
    w.phase = "Pending";
  return w;
}

GangGaps gang_gaps(int replicas, const std::map<int, PodPtr>& pods_by_index, const std::set<int>& deleting) {
  GangGaps g;
  for (int i = 0; i < replicas; ++i) {
    auto it = pods_by_index.find(i);
    if (it == pods_by_index.end()) {
      if (!deleting.count(i)) g.create.push_back(i);
      continue;
    }
    const Json& p = *it->second;
    if (!terminating(p) && node_of(p).empty() && phase_of(p) != "Failed") g.unbound.push_back(i);
  }
  return g;
}

GangState gang_state(const std::string& job_name, int replicas, const std::map<int, PodPtr>& pods_by_index,
                     const std::vector<std::string>& created, const std::map<std::string, std::string>& known_nodes) {
  GangState g;
  for (int i = 0; i < replicas; ++i) {
    const std::string pod_name = worker_pod_name(job_name, i);
    auto it = pods_by_index.find(i);
    const PodPtr pod = it != pods_by_index.end() ? it->second : nullptr;
    if (!pod && !contains(created, pod_name)) continue;
    if (pod && terminating(*pod)) continue;
    g.exist++;
    std::string node = pod ? node_of(*pod) : "";
    if (node.empty())
      if (auto k = known_nodes.find(pod_name); k != known_nodes.end()) node = k->second;
    const std::string phase = pod ? phase_of(*pod) : "";
    if (!node.empty()) {
      g.bound++;
      g.node_of[pod_name] = node;
      g.placed.push_back(node);
      if (phase != "Failed") g.healthy.push_back(pod_name);
    }
    g.up[pod_name] = phase == "Running" || phase == "Succeeded";
  }
  return g;
}

std::vector<std::string> world_members(const JobSpec& spec, const std::string& job_name, bool capacity_short,
                                       const std::vector<std::string>& healthy) {
  std::vector<std::string> members;
  if (capacity_short) {
    const int k = elastic_world_replicas(spec, static_cast<int>(healthy.size()));
    if (k > 0) members.assign(healthy.begin(), healthy.begin() + k);
  }
  if (members.empty())
    for (int i = 0; i < spec.replicas; ++i) members.push_back(worker_pod_name(job_name, i));
  return members;
}

}  // namespace railyard::op
