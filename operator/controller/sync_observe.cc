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
  // What the rendezvous service saw.
  {
    std::lock_guard lock(mu_);
    s.rdzv = rdzv_;
    if (auto it = exits_.find(s.key); it != exits_.end()) {
      s.exits = std::move(it->second);
      exits_.erase(it);
    }
    if (auto it = timeouts_.find(s.key); it != timeouts_.end()) {
      s.timeouts = std::move(it->second);
      timeouts_.erase(it);
    }
  }
  if (s.rdzv && s.gen > 0) {
    s.progress = s.rdzv->progress(s.key);
    if (s.progress && s.progress->generation != s.gen) s.progress.reset();
  }
  for (const JoinTimeout& t : s.timeouts) {
    if (t.generation != s.gen) continue;
    std::string missing;
    for (const auto& m : t.missing) missing += (missing.empty() ? "" : ", ") + m;
    s.join_timeout = "generation " + std::to_string(s.gen) + ": pods never joined the rendezvous: " + missing;
    s.events.push_back({true, "JoinTimeout", s.join_timeout});
  }
  if (s.join_timeout.empty()) {
    // A timeout seen by an earlier reconcile stays visible until the world completes or the generation moves on.
    auto c = find_condition(s.orig, "Running");
    if (c && c->value("reason", "") == "JoinTimeout" &&
        c->value("message", "").rfind("generation " + std::to_string(s.gen) + ":", 0) == 0)
      s.join_timeout = c->value("message", "");
  }

  // The pods of the current generation's world (status.world.pods; older statuses only have world.size).
  if (s.status.contains("world") && s.status["world"].is_object()) {
    if (s.status["world"].contains("pods") && s.status["world"]["pods"].is_array()) {
      for (const Json& p : s.status["world"]["pods"])
        if (p.is_string()) s.old_members.push_back(p.get<std::string>());
    } else if (s.status["world"].contains("size")) {
      int size = s.status["world"]["size"].get<int>() / std::max(1, s.spec.procs_per_replica);
      for (int i = 0; i < size; ++i) s.old_members.push_back(worker_pod_name(s.name, i));
    }
  }

  for (const PodPtr& p : s.pods) {
    int i = replica_index_of(*p);
    if (i >= 0 && i < s.spec.replicas && !s.by_index.count(i))
      s.by_index[i] = p;
    else
      s.extra.push_back(p);
  }

  s.agent = uses_agent(s.job);
}

}  // namespace railyard::op
