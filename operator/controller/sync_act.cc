// Act: make the decided generation durable, delete and create pods, bind the gang, open the generation at the
// rendezvous service. Every change to the cluster a reconcile makes (besides status and events) is here.
#include <algorithm>
#include <atomic>
#include <optional>
#include <set>

#include "common/log.h"
#include "operator/controller/controller.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"

namespace railyard::op {

namespace {
using std::chrono::milliseconds;
constexpr const char* kLog = "controller";
}  // namespace

void Controller::start_generation(Sync& s) {
  if (s.gen == 0 || s.resumed) {
    s.gen++;
    s.status["generation"] = s.gen;
  }
  if (!s.status.contains("startTime")) s.status["startTime"] = s.now_s;
  // A change of the world (kubectl scale, or an elastic job losing or regaining capacity) opens a new generation
  // below, once the pods are placed; pods created for a scale-up carry that coming generation.
  const bool started_now = s.gen != s.orig.value("generation", Json(0)).get<int64_t>() && !s.restarted_now;
  s.label_gen =
      s.gen + ((!s.restarted_now && !started_now && static_cast<int>(s.old_members.size()) != s.spec.replicas) ? 1 : 0);

  // A restart or failure decision is made durable before acting on it, so a crash cannot count it twice or lose it.
  if (s.restarted_now || s.replaced_now || s.status["generation"] != s.orig.value("generation", Json(0))) {
    Json written = write_status(s.job, s.status);
    s.job["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"];
    if (written.contains("status") && written["status"].contains("goodput"))
      s.status["goodput"] = written["status"]["goodput"];  // brought up to now by the write
    s.orig = s.status;  // what we just wrote is the baseline for the final comparison
  }
  if (!s.scan.restart_request.empty())
    client_.patch(kube::resources::trainingjobs, s.ns, s.name,
                  {{"metadata", {{"annotations", {{kRestartHandledAnnotation, s.scan.restart_request}}}}}});
}

void Controller::delete_pods(Sync& s) {
  // A pod that fell silent: its node is suspect (frozen or cut off, though it may look Ready for a while). Noted
  // before the pod is deleted, so its replacement's placement stays off it (suspect_nodes.h).
  for (const std::string& node : s.scan.suspect_nodes) suspects_.add(s.key, node, s.now);
  for (const PodDeletion& d : s.scan.to_delete) {
    delete_pod(s.ns, d.pod, d.uid, d.force);
    for (auto it = s.by_index.begin(); it != s.by_index.end(); ++it)
      if (kube::name_of(*it->second) == d.pod) {
        s.by_index.erase(it);
        break;
      }
  }
  bool surplus = false;
  for (const PodPtr& p : s.extra)
    if (!terminating(*p)) {
      delete_pod(s.ns, *p);
      surplus = true;
    }
  if (surplus)
    s.events.push_back({false, "DeletedPods",
                        "deleted " + std::to_string(s.extra.size()) + " surplus pods (replicas " +
                            std::to_string(s.spec.replicas) + ")"});
}

// Pods: delete lost/failed and surplus ones, create missing ones (placed first, scheduler railyard).
void Controller::create_pods(Sync& s) {
  s.token = ensure_token(s.job);
  ensure_network_policy(s.job, s.spec);
  ensure_service(s.job);
  const std::optional<Json> claim = ensure_storage(s.job, s.spec, s.events);
  log::debug(kLog, "secret, network policy, service and storage in place", {{"job", s.key}});
  delete_pods(s);
  // Indices whose old pod is still going: one name per missing index, not one per index and deletion (a gang of
  // 10,000 that lost 1,000 pods would build ten million names).
  std::set<std::string> going;
  for (const PodDeletion& d : s.scan.to_delete) going.insert(d.pod);
  std::set<int> deleting;
  if (!going.empty())
    for (int i = 0; i < s.spec.replicas; ++i)
      if (!s.by_index.count(i) && going.count(worker_pod_name(s.name, i))) deleting.insert(i);
  // Replica indices to create. Each pod is built from `job` (our own copy read from the server, never the cache) only
  // as its create is sent, so a reconcile holds as many pods as requests in flight (api_parallelism), not the whole
  // gang: kMaxReplicas copies of a large template would be gigabytes before the first create (issue #40).
  const GangGaps gaps = gang_gaps(s.spec.replicas, s.by_index, deleting);
  s.unbound = gaps.unbound;
  const std::vector<int>& to_create_index = gaps.create;
  if (to_create_index.empty()) return;
  std::vector<int> unplaced = gaps.unbound;  // the new pods and the existing unbound ones, in index order
  unplaced.insert(unplaced.end(), to_create_index.begin(), to_create_index.end());
  std::sort(unplaced.begin(), unplaced.end());
  const WorkerPodBuilder builder(s.job, s.spec, s.label_gen, opts_.pod);  // the gang's common pod, built once
  // The pods take the job-wide env from it (envFrom): it exists, as this spec builds it, before any of them.
  ensure_job_object(s.job, kube::resources::configmaps, builder.env_configmap(), "EnvConfigMapConflict",
                    "rename or delete it (each job's job-wide env is kept in the ConfigMap <job>-env)");
  // The new pods and the existing unbound ones are placed as one gang; a new pod that got a node is created on it.
  if (s.spec.scheduler == kRailyardScheduler) {
    place_gang(s, unplaced, true);
    if (claim) select_storage_node(s.job, *claim, s.placement.node);
  }
  send_creates(s, builder, to_create_index);
}

void Controller::send_creates(Sync& s, const WorkerPodBuilder& builder, const std::vector<int>& to_create_index) {
  const size_t count = to_create_index.size();
  // Pod k as it is created: the gang's common pod with its index, and its node (and the node's annotations) when
  // placed. Called concurrently: it only reads the builder and the placement.
  auto build = [&](size_t k) {
    Json pod = builder.pod(to_create_index[k]);
    auto node = s.placement.node.find(to_create_index[k]);
    if (node == s.placement.node.end()) return pod;
    pod["spec"]["nodeName"] = node->second;
    if (auto a = s.placement.annotations.find(to_create_index[k]); a != s.placement.annotations.end()) {
      Json& annotations = pod["metadata"]["annotations"];
      if (!annotations.is_object()) annotations = Json::object();
      annotations.update(a->second);
    }
    return pod;
  };
  // Slow-start batches (1, 2, 4, ...; docs/operator.md): a gang of 1,000 is created at the API server's pace, a
  // template the server refuses costs one request. Names are fixed per replica index, so a pod that already exists
  // (ours, not yet in the cache, or one still terminating) counts as done and a rerun after a crash creates only what
  // is missing.
  log::debug(kLog, "creating pods", {{"job", s.key}, {"count", std::to_string(count)}});
  std::vector<char> made(count, 0);
  std::vector<std::string> made_node(count);  // each k is written by the one request that creates it
  std::atomic<bool> already{false};
  SlowStartResult r = run_slow_start(static_cast<int>(count), opts_.api_parallelism, [&](int k) {
    const Json pod = build(static_cast<size_t>(k));
    try {
      client_.create_only(kube::resources::pods, s.ns, pod);
      made[k] = 1;
      made_node[k] = node_of(pod);
    } catch (const kube::AlreadyExists&) {
      already = true;
    }
  });
  s.exists_uncached = already;
  log::debug(kLog, "pods created", {{"job", s.key}, {"attempted", std::to_string(r.attempted)}});
  for (size_t k = 0; k < count; ++k) {
    if (!made[k]) continue;
    const std::string pod_name = worker_pod_name(s.name, to_create_index[k]);
    s.created.push_back(pod_name);
    const std::string& node = made_node[k];
    if (node.empty()) {
      s.unbound.push_back(to_create_index[k]);
    } else {
      s.scan.node_by_pod[pod_name] = node;
      s.bound_pairs.push_back(pod_name + " -> " + node);
    }
  }
  std::sort(s.unbound.begin(), s.unbound.end());
  if (!s.created.empty())
    s.events.push_back(
        {false, "CreatedPods", "created " + name_summary(s.created) + " (generation " + std::to_string(s.gen) + ")"});
  if (r.first_error) {
    log::warn(
        kLog, "pod creation stopped at the first failure",
        {{"job", s.key}, {"created", std::to_string(s.created.size())}, {"left", std::to_string(count - r.attempted)}});
    std::rethrow_exception(r.first_error);
  }
}

void Controller::bind_gang(Sync& s) {
  if (s.spec.scheduler != kRailyardScheduler) {
    // The cluster's scheduler binds the pods (spec.placement.scheduler). The gang is still all or nothing for training:
    // the rendezvous holds every joined pod until the whole world has joined (or reports JoinTimeout).
    if (!s.unbound.empty()) {
      const std::string msg = std::to_string(s.unbound.size()) + " of " + std::to_string(s.spec.replicas) +
                              " pods wait for scheduler " + s.spec.scheduler +
                              " to bind them; training starts when every pod has joined";
      if (set_condition(s.status, "Scheduled", false, "WaitingForScheduler", msg, s.now_s))
        s.events.push_back({false, "WaitingForScheduler", msg});
    }
    return;
  }
  if (s.exists_uncached && !s.unbound.empty()) {
    // Some of the gang exist at the server but not yet in the cache (our own creates of an earlier reconcile):
    // binding now would place part of the gang. Their watch events bring us back; the requeue is a safety net.
    s.keep_min(milliseconds(1000));
  } else if (!s.unbound.empty()) {
    if (!s.placement.tried) place_gang(s, s.unbound, false);
    std::vector<int> to_bind;  // replica indices placed now
    for (int i : s.unbound)
      if (s.placement.node.count(i)) to_bind.push_back(i);
    // Bound in slow-start batches like the creates. A failure leaves part of the gang bound; the next reconcile places
    // the rest around it (PlacementRequest::bound).
    SlowStartResult b = run_slow_start(static_cast<int>(to_bind.size()), opts_.api_parallelism, [&](int k) {
      const int i = to_bind[k];
      const std::string pod_name = worker_pod_name(s.name, i);
      Json binding = {{"apiVersion", "v1"},
                      {"kind", "Binding"},
                      {"metadata", {{"name", pod_name}}},
                      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", s.placement.node.at(i)}}}};
      if (auto a = s.placement.annotations.find(i); a != s.placement.annotations.end())
        binding["metadata"]["annotations"] = a->second;
      try {
        client_.create_subresource(kube::resources::pods, s.ns, pod_name, "binding", binding);
      } catch (const kube::Conflict&) {
        // Already bound (an earlier attempt whose answer we did not see).
      }
    });
    if (b.first_error) std::rethrow_exception(b.first_error);
    for (int i : to_bind) {
      const std::string pod_name = worker_pod_name(s.name, i), &node = s.placement.node.at(i);
      s.scan.node_by_pod[pod_name] = node;
      s.bound_pairs.push_back(pod_name + " -> " + node);
    }
  }
  if (!s.bound_pairs.empty())
    s.events.push_back({false, "Bound",
                        "bound " + std::to_string(s.bound_pairs.size()) + " pods: " + name_summary(s.bound_pairs) +
                            (s.placement.how.empty() ? "" : " (" + s.placement.how + ")")});
}

void Controller::open_generation(Sync& s) {
  // Open the (durable) generation at the rendezvous service once per generation and leader.
  if (s.rdzv && s.agent) {
    // Which pod holds each name now (every reconcile: a pod replaced under its name is fenced from then on).
    std::map<std::string, std::string> uids;
    for (const auto& [i, pod] : s.by_index)
      if (!terminating(*pod)) uids[worker_pod_name(s.name, i)] = uid_of(*pod);
    bool open = false;
    {
      std::lock_guard lock(mu_);
      auto it = opened_.find(s.key);
      open = it == opened_.end() || it->second != s.gen;
    }
    if (open) {
      GenerationSpec g;
      g.job_key = s.key;
      g.generation = s.gen;
      g.pods = s.members;
      g.procs_per_pod = s.spec.procs_per_replica;
      g.config = resolved_config(s.world_spec, s.m);
      g.config.generation = s.gen;
      if (g.config.parallelism) g.config.parallelism->dp_split = s.dp_split;
      if (s.gen > 1 && !s.world_spec.checkpoint_path.empty())
        g.config.restore = s.world_spec.checkpoint_path;
      else if (s.gen > 1 && s.world_spec.memory_interval_steps > 0)
        g.config.restore = "auto";  // the in-memory tier alone (no path): the worker falls back to a fresh start
      g.token = s.token;
      g.pod_uids = uids;
      s.rdzv->open_generation(g);
      std::lock_guard lock(mu_);
      opened_[s.key] = s.gen;
    } else {
      s.rdzv->set_pod_uids(s.key, std::move(uids));
    }
  }
}

}  // namespace railyard::op
