// Act: make the decided generation durable, delete and create pods, bind the gang, open the generation at the
// rendezvous service. Every change to the cluster a reconcile makes (besides status and events) is here.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <set>

#include "common/log.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/lifecycle.h"
#include "operator/controller/nccl_env.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/slow_start.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"

namespace railyard::op {

namespace {
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr const char* kLog = "controller";
}  // namespace

void Controller::start_generation(Sync& s) {
  const std::string& ns = s.ns;
  const std::string& name = s.name;
  Json& job = s.job;
  const std::string& now_s = s.now_s;
  Json& status = s.status;
  Json& orig = s.orig;
  const int n = s.spec.replicas;
  bool& resumed = s.resumed;
  int64_t& gen = s.gen;
  std::vector<std::string>& old_members = s.old_members;
  const std::string& restart_request = s.scan.restart_request;
  bool& replaced_now = s.replaced_now;
  bool& restarted_now = s.restarted_now;
  int64_t& label_gen = s.label_gen;
  if (gen == 0 || resumed) {
    gen++;
    status["generation"] = gen;
  }
  if (!status.contains("startTime")) status["startTime"] = now_s;
  // A change of the world (kubectl scale, or an elastic job losing or regaining capacity) opens a new generation
  // below, once the pods are placed; pods created for a scale-up carry that coming generation.
  const bool started_now = gen != orig.value("generation", Json(0)).get<int64_t>() && !restarted_now;
  label_gen = gen + ((!restarted_now && !started_now && static_cast<int>(old_members.size()) != n) ? 1 : 0);

  // A restart or failure decision is made durable before acting on it, so a crash cannot count it twice or lose it.
  if (restarted_now || replaced_now || status["generation"] != orig.value("generation", Json(0))) {
    Json written = write_status(job, status);
    job["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"];
    orig = status;  // what we just wrote is the baseline for the final comparison
  }
  if (!restart_request.empty())
    client_.patch(kube::resources::trainingjobs, ns, name,
                  {{"metadata", {{"annotations", {{kRestartHandledAnnotation, restart_request}}}}}});
}

void Controller::create_pods(Sync& s) {
  const std::string& key = s.key;
  const std::string& ns = s.ns;
  const std::string& name = s.name;
  Json& job = s.job;
  std::vector<PendingEvent>& events = s.events;
  const JobSpec& spec = s.spec;
  const int n = s.spec.replicas;
  int64_t& gen = s.gen;
  std::map<int, Json>& by_index = s.by_index;
  std::vector<Json>& extra = s.extra;
  const std::vector<std::pair<std::string, bool>>& to_delete = s.scan.to_delete;
  int64_t& label_gen = s.label_gen;
  std::string& token = s.token;
  std::vector<std::string>& created = s.created;
  std::vector<std::string>& unbound = s.unbound;
  bool& exists_uncached = s.exists_uncached;
  // Pods: delete lost/failed and surplus ones, create missing ones, bind the unbound part of the gang.
  token = ensure_token(job);
  ensure_network_policy(job, spec);
  for (const auto& [pod_name, force] : to_delete) {
    delete_pod(ns, pod_name, force);
    for (auto it = by_index.begin(); it != by_index.end(); ++it)
      if (kube::name_of(it->second) == pod_name) {
        by_index.erase(it);
        break;
      }
  }
  for (const Json& p : extra)
    if (!terminating(p)) delete_pod(ns, kube::name_of(p), false);
  if (!extra.empty() && std::any_of(extra.begin(), extra.end(), [](const Json& p) { return !terminating(p); }))
    events.push_back(
        {false, "DeletedPods",
         "deleted " + std::to_string(extra.size()) + " surplus pods (replicas " + std::to_string(n) + ")"});
  const bool deleting = !to_delete.empty();
  std::vector<Json> to_create;  // built from `job` (our own copy read from the server), never from the cache
  for (int i = 0; i < n; ++i) {
    auto it = by_index.find(i);
    if (it != by_index.end()) {
      const Json& p = it->second;
      if (!terminating(p) && node_of(p).empty() && phase_of(p) != "Failed") unbound.push_back(kube::name_of(p));
      continue;
    }
    if (deleting && std::any_of(to_delete.begin(), to_delete.end(),
                                [&](const auto& d) { return d.first == worker_pod_name(name, i); }))
      continue;  // the old pod of this name is still going; its deletion event brings us back
    to_create.push_back(build_worker_pod(job, spec, i, label_gen, opts_.pod));
  }
  if (!to_create.empty()) {
    // Slow-start batches (1, 2, 4, ...; docs/operator.md): a gang of 1,000 is created at the API server's pace,
    // a template the server refuses costs one request. Names are fixed per replica index, so a pod that already
    // exists (ours, not yet in the cache, or one still terminating) counts as done and a rerun after a crash
    // creates only what is missing.
    std::vector<char> made(to_create.size(), 0);
    std::atomic<bool> already{false};
    SlowStartResult r = run_slow_start(static_cast<int>(to_create.size()), opts_.api_parallelism, [&](int k) {
      try {
        client_.create(kube::resources::pods, ns, to_create[k]);
        made[k] = 1;
      } catch (const kube::AlreadyExists&) {
        already = true;
      }
    });
    exists_uncached = already;
    for (size_t k = 0; k < to_create.size(); ++k)
      if (made[k]) {
        created.push_back(kube::name_of(to_create[k]));
        unbound.push_back(kube::name_of(to_create[k]));
      }
    if (r.first_error) {
      log::warn(kLog, "pod creation stopped at the first failure",
                {{"job", key},
                 {"created", std::to_string(created.size())},
                 {"left", std::to_string(to_create.size() - r.attempted)}});
      std::rethrow_exception(r.first_error);
    }
  }
  if (!created.empty())
    events.push_back(
        {false, "CreatedPods", "created " + name_summary(created) + " (generation " + std::to_string(gen) + ")"});
}

void Controller::bind_gang(Sync& s) {
  const std::string& key = s.key;
  const std::string& ns = s.ns;
  const std::string& name = s.name;
  Json& job = s.job;
  const std::string& now_s = s.now_s;
  Json& status = s.status;
  std::vector<PendingEvent>& events = s.events;
  auto keep_min = [&s](milliseconds d) { s.keep_min(d); };
  const JobSpec& spec = s.spec;
  const int n = s.spec.replicas;
  int64_t& gen = s.gen;
  std::map<int, Json>& by_index = s.by_index;
  PlacementRequest& job_placement = s.job_placement;
  std::map<std::string, std::string>& node_by_pod = s.scan.node_by_pod;
  std::vector<std::string>& created = s.created;
  std::vector<std::string>& unbound = s.unbound;
  bool& exists_uncached = s.exists_uncached;
  int& placed_hops = s.placed_hops;
  bool& capacity_short = s.capacity_short;
  int bound_now = 0;
  if (spec.scheduler != kRailyardScheduler) {
    // The cluster's scheduler binds the pods (spec.placement.scheduler). The gang is still all or nothing for training:
    // the rendezvous holds every joined pod until the whole world has joined (or reports JoinTimeout).
    if (!unbound.empty()) {
      const std::string msg = std::to_string(unbound.size()) + " of " + std::to_string(n) +
                              " pods wait for scheduler " + spec.scheduler +
                              " to bind them; training starts when every pod has joined";
      if (set_condition(status, "Scheduled", false, "WaitingForScheduler", msg, now_s))
        events.push_back({false, "WaitingForScheduler", msg});
    }
    return;
  }
  if (exists_uncached && !unbound.empty()) {
    // Some of the gang exist at the server but not yet in the cache (our own creates of an earlier reconcile):
    // binding now would place part of the gang. Their watch events bring us back; the requeue is a safety net.
    keep_min(milliseconds(1000));
  } else if (!unbound.empty()) {
    PlacementRequest req = job_placement;
    req.job_key = key;
    req.pods = static_cast<int>(unbound.size());
    const Json worker_pod = build_worker_pod(job, spec, 0, gen, opts_.pod);
    req.gpus_per_pod = pod_resource(worker_pod, kGpuResource);
    req.requests = pod_requests(worker_pod);
    req.node_selector = spec.node_selector;
    if (job["spec"].contains("template") && job["spec"]["template"].is_object())
      req.tolerations = job["spec"]["template"].value("spec", Json::object()).value("tolerations", Json::array());
    for (int i = 0; i < n; ++i) {
      const std::string pod_name = worker_pod_name(name, i);
      if (std::find(unbound.begin(), unbound.end(), pod_name) != unbound.end())
        req.pod_indices.push_back(i);
      else if (auto it = by_index.find(i); it != by_index.end() && !node_of(it->second).empty())
        req.bound[i] = node_of(it->second);
    }
    req.procs_per_pod = spec.procs_per_replica;
    const WorldLayout layout = world_layout(spec, n);
    req.tensor = layout.tensor;
    req.pipeline = layout.pipeline;
    auto t0 = Clock::now();
    const auto inventory = node_inventory();
    req.step_model = placement_step_model(spec, layout, n, inventory);
    PlacementResult r = placement_->place(req, inventory);
    if (!r.ok && spec.min_replicas) {
      // Elastic: bind the part that fits now; the world shrinks to the pods placed (never below minReplicas) and
      // grows back when the rest fit.
      capacity_short = true;
      std::string why = r.message;
      for (int k = req.pods - 1; k >= 1 && !r.ok; --k) {
        PlacementRequest part = req;
        part.pods = k;
        part.pod_indices.resize(k);
        r = placement_->place(part, inventory);
      }
      if (r.ok) {
        unbound.resize(r.nodes.size());
        set_condition(status, "Scheduled", false, "Unschedulable",
                      why + "; elastic: bound " + std::to_string(r.nodes.size()) + " of them", now_s);
      } else {
        r.message = why;
      }
    }
    placement_seconds_.add({}).observe(std::chrono::duration<double>(Clock::now() - t0).count());
    if (r.ok) {
      // GPU pods: the node's NCCL settings ride on the Binding as pod annotations (the API server sets them with
      // spec.nodeName, in one write), where the pod's env reads them at container start (nccl_env.h).
      std::vector<Json> binding_annotations(unbound.size(), Json::object());
      if (req.gpus_per_pod > 0) {
        std::set<std::string> warned;
        for (size_t i = 0; i < unbound.size(); ++i) {
          auto node = std::find_if(inventory.begin(), inventory.end(),
                                   [&](const NodeInfo& info) { return info.name == r.nodes[i]; });
          if (node == inventory.end()) continue;
          std::string warning;
          binding_annotations[i] = nccl_binding_annotations(*node, &warning);
          if (!warning.empty() && warned.insert(node->name).second)
            events.push_back({true, "NodeRailHcas", warning + "; NCCL_IB_HCA left empty (NCCL's own choice)"});
        }
      }
      // Bound in slow-start batches like the creates. A failure leaves part of the gang bound; the next
      // reconcile places the rest around it (req.bound).
      SlowStartResult b = run_slow_start(static_cast<int>(unbound.size()), opts_.api_parallelism, [&](int i) {
        Json binding = {{"apiVersion", "v1"},
                        {"kind", "Binding"},
                        {"metadata", {{"name", unbound[i]}}},
                        {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", r.nodes[i]}}}};
        if (!binding_annotations[i].empty()) binding["metadata"]["annotations"] = binding_annotations[i];
        try {
          client_.create_subresource(kube::resources::pods, ns, unbound[i], "binding", binding);
        } catch (const kube::Conflict&) {
          // Already bound (an earlier attempt whose answer we did not see).
        }
      });
      if (b.first_error) std::rethrow_exception(b.first_error);
      std::vector<std::string> pairs;
      for (size_t i = 0; i < unbound.size(); ++i) {
        node_by_pod[unbound[i]] = r.nodes[i];
        pairs.push_back(unbound[i] + " -> " + r.nodes[i]);
        bound_now++;
      }
      events.push_back({false, "Bound",
                        "bound " + std::to_string(unbound.size()) + " pods: " + name_summary(pairs) +
                            (r.message.empty() ? "" : " (" + r.message + ")")});
      if (r.worst_hops >= 0) {
        placement_hops(registry_).add({}).observe(r.worst_hops);
        placed_hops = r.worst_hops;
      }
    } else {
      capacity_short = true;
      if (set_condition(status, "Scheduled", false, "Unschedulable", r.message, now_s) || created.size())
        events.push_back({true, "Unschedulable", r.message});
      keep_min(opts_.unschedulable_retry);
    }
  }
}

void Controller::open_generation(Sync& s) {
  const std::string& key = s.key;
  const JobSpec& spec = s.spec;
  int64_t& gen = s.gen;
  RendezvousService*& rdzv = s.rdzv;
  const bool agent = s.agent;
  std::string& token = s.token;
  std::vector<std::string>& members = s.members;
  int& m = s.m;
  JobSpec& world_spec = s.world_spec;
  std::vector<int>& dp_split = s.dp_split;
  // Open the (durable) generation at the rendezvous service once per generation and leader.
  if (rdzv && agent) {
    bool open = false;
    {
      std::lock_guard lock(mu_);
      auto it = opened_.find(key);
      open = it == opened_.end() || it->second != gen;
    }
    if (open) {
      GenerationSpec g;
      g.job_key = key;
      g.generation = gen;
      g.pods = members;
      g.procs_per_pod = spec.procs_per_replica;
      g.config = resolved_config(world_spec, m);
      g.config.generation = gen;
      if (g.config.parallelism) g.config.parallelism->dp_split = dp_split;
      if (gen > 1 && !world_spec.checkpoint_path.empty())
        g.config.restore = world_spec.checkpoint_path;
      else if (gen > 1 && world_spec.memory_interval_steps > 0)
        g.config.restore = "auto";  // the in-memory tier alone (no path): the worker falls back to a fresh start
      g.token = token;
      rdzv->open_generation(g);
      std::lock_guard lock(mu_);
      opened_[key] = gen;
    }
  }
}

}  // namespace railyard::op
