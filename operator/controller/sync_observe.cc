// Observe: what the API server says about the job (the job as read from the server, its pods) and what the
// rendezvous service and the pods say about its current generation. Nothing here changes the cluster.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <set>

#include "common/log.h"
#include "operator/controller/controller.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/lifecycle.h"
#include "operator/scheduler/nccl_env.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"

namespace railyard::op {

namespace {
using std::chrono::milliseconds;

// A job whose template sets its own command runs no agent, so nobody joins the rendezvous: pod phases decide.
bool uses_agent(const Json& job) {
  const Json& spec = job["spec"];
  if (!spec.contains("template") || !spec["template"].is_object()) return true;
  const Json tspec = spec["template"].value("spec", Json::object());
  const Json cs = tspec.value("containers", Json::array());
  return !(cs.is_array() && !cs.empty() && cs[0].is_object() && cs[0].contains("command"));
}
}  // namespace

Sync Controller::observe(const std::string& key, Json job) {
  Sync s;
  s.key = key;
  const auto slash = key.find('/');
  s.ns = slash == std::string::npos ? "" : key.substr(0, slash);
  s.name = slash == std::string::npos ? key : key.substr(slash + 1);
  s.job = std::move(job);
  s.now = std::chrono::system_clock::now();
  s.now_s = kube::format_rfc3339(s.now);
  s.status = s.job.contains("status") && s.job["status"].is_object() ? s.job["status"] : Json::object();
  s.orig = s.status;
  s.status["observedGeneration"] = s.job["metadata"].value("generation", 0);
  s.status["selector"] = job_selector(s.name);
  s.pods = pods_of(s.job);
  for (const PodPtr& p : s.pods)
    if (!terminating(*p)) s.existing++;
  return s;
}

void Controller::observe_generation(Sync& s) {
  const std::string& key = s.key;
  const std::string& name = s.name;
  Json& status = s.status;
  Json& orig = s.orig;
  std::vector<PendingEvent>& events = s.events;
  const std::vector<PodPtr>& pods = s.pods;
  const JobSpec& spec = s.spec;
  const int n = s.spec.replicas;
  int64_t& gen = s.gen;
  RendezvousService*& rdzv = s.rdzv;
  std::vector<WorkerExit>& exits = s.exits;
  std::vector<JoinTimeout>& timeouts = s.timeouts;
  std::optional<RendezvousService::Progress>& progress = s.progress;
  std::string& join_timeout = s.join_timeout;
  std::vector<std::string>& old_members = s.old_members;
  std::map<int, PodPtr>& by_index = s.by_index;
  std::vector<PodPtr>& extra = s.extra;
  // What the rendezvous service saw.
  {
    std::lock_guard lock(mu_);
    rdzv = rdzv_;
    if (auto it = exits_.find(key); it != exits_.end()) {
      exits = std::move(it->second);
      exits_.erase(it);
    }
    if (auto it = timeouts_.find(key); it != timeouts_.end()) {
      timeouts = std::move(it->second);
      timeouts_.erase(it);
    }
  }
  if (rdzv && gen > 0) {
    progress = rdzv->progress(key);
    if (progress && progress->generation != gen) progress.reset();
  }
  for (const JoinTimeout& t : timeouts) {
    if (t.generation != gen) continue;
    std::string missing;
    for (const auto& m : t.missing) missing += (missing.empty() ? "" : ", ") + m;
    join_timeout = "generation " + std::to_string(gen) + ": pods never joined the rendezvous: " + missing;
    events.push_back({true, "JoinTimeout", join_timeout});
  }
  if (join_timeout.empty()) {
    // A timeout seen by an earlier reconcile stays visible until the world completes or the generation moves on.
    auto c = find_condition(orig, "Running");
    if (c && c->value("reason", "") == "JoinTimeout" &&
        c->value("message", "").rfind("generation " + std::to_string(gen) + ":", 0) == 0)
      join_timeout = c->value("message", "");
  }

  // The pods of the current generation's world (status.world.pods; older statuses only have world.size).
  if (status.contains("world") && status["world"].is_object()) {
    if (status["world"].contains("pods") && status["world"]["pods"].is_array()) {
      for (const Json& p : status["world"]["pods"])
        if (p.is_string()) old_members.push_back(p.get<std::string>());
    } else if (status["world"].contains("size")) {
      int size = status["world"]["size"].get<int>() / std::max(1, spec.procs_per_replica);
      for (int i = 0; i < size; ++i) old_members.push_back(worker_pod_name(name, i));
    }
  }

  for (const PodPtr& p : pods) {
    int i = replica_index_of(*p);
    if (i >= 0 && i < n && !by_index.count(i))
      by_index[i] = p;
    else
      extra.push_back(p);
  }

  s.agent = uses_agent(s.job);
}

}  // namespace railyard::op
