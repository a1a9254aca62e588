// Place: where the worker pods without a node go, when the operator is their scheduler (spec.placement.scheduler
// railyard). The pods about to be created and the existing unbound ones are placed together as one gang, all or
// nothing (an elastic job short of capacity: the part that fits). create_pods then creates the new pods with their
// node in spec.nodeName, one write per pod, and bind_gang binds the existing ones (sync_act.cc).
#include <algorithm>
#include <set>
#include <unordered_map>

#include "common/wellknown.h"
#include "operator/controller/controller.h"
#include "operator/controller/plan_glue.h"
#include "operator/controller/pod_builder.h"
#include "operator/controller/pod_state.h"
#include "operator/controller/status.h"
#include "operator/controller/sync.h"
#include "operator/scheduler/nccl_env.h"

namespace railyard::op {

namespace {
using Clock = std::chrono::steady_clock;

// At most this many waiting gangs are booked ahead of one placement (each costs one placement of its own).
constexpr size_t kMaxGangsAhead = 32;

// What each worker pod of the job asks of a node and where it may go, onto `req` (its placement options already in):
// the worker pod as built for generation `gen`, the template's tolerations, the world layout.
void fill_gang_request(PlacementRequest& req, const Json& job, const JobSpec& spec, int64_t gen,
                       const PodOptions& pod_opts) {
  const Json worker_pod = build_worker_pod(job, spec, 0, gen, pod_opts);
  req.gpus_per_pod = pod_resource(worker_pod, kGpuResource);
  req.requests = pod_requests(worker_pod);
  req.node_selector = spec.node_selector;
  if (job["spec"].contains("template") && job["spec"]["template"].is_object())
    req.tolerations = job["spec"]["template"].value("spec", Json::object()).value("tolerations", Json::array());
  req.procs_per_pod = spec.procs_per_replica;
  const WorldLayout layout = world_layout(spec, spec.replicas);
  req.tensor = layout.tensor;
  req.pipeline = layout.pipeline;
}
}  // namespace

std::vector<PlacementRequest> Controller::gangs_ahead(const Sync& s) {
  std::vector<const Json*> classes;
  const auto class_objects = priority_classes_->snapshot();
  for (const auto& c : class_objects) classes.push_back(c.get());
  const GangOrder mine = gang_order(s.job, classes);
  // Jobs with a pod bound to a node (and not going away) are placed: only the others wait for nodes. A waiting gang's
  // pods may exist, unbound (created before they fit; bound once the whole gang does).
  std::set<std::string> placed;
  for (const auto& p : pods_->snapshot()) {
    const Json& meta = kube::field(*p, "metadata");
    const Json& job = kube::field(kube::field(meta, "labels"), wellknown::kJobLabel);
    if (job.is_string() && !terminating(*p) && !node_of(*p).empty())
      placed.insert(kube::namespace_of(*p) + "/" + job.get<std::string>());
  }
  std::vector<std::pair<GangOrder, std::shared_ptr<const Json>>> waiting;
  for (auto& j : jobs_->snapshot()) {
    GangOrder o = gang_order(*j, classes);
    if (o.key == s.key || !goes_before(o, mine) || placed.count(o.key) || !waiting_gang(*j)) continue;
    waiting.emplace_back(std::move(o), std::move(j));
  }
  std::sort(waiting.begin(), waiting.end(), [](const auto& a, const auto& b) { return goes_before(a.first, b.first); });
  std::vector<PlacementRequest> out;
  for (const auto& [order, job] : waiting) {
    if (out.size() == kMaxGangsAhead) break;
    const ParsedJob parsed = parse_job(*job);
    if (parsed.violation || parsed.spec.suspend || parsed.spec.scheduler != kRailyardScheduler) continue;
    PlacementRequest req;
    apply_job_options(*job, req);
    req.job_key = order.key;
    req.pods = parsed.spec.replicas;
    try {
      fill_gang_request(req, *job, parsed.spec, 1, opts_.pod);
    } catch (const std::exception&) {
      continue;  // its own reconcile reports why its pods cannot be built
    }
    out.push_back(std::move(req));
  }
  return out;
}

// indices: replica indices of the pods to place, ascending. creating: some of them are about to be created (their
// Unschedulable event is new even when the condition already says so).
void Controller::place_gang(Sync& s, const std::vector<int>& indices, bool creating) {
  const int n = s.spec.replicas;
  Sync::GangPlacement& out = s.placement;
  out.tried = true;
  if (indices.empty()) return;

  PlacementRequest req = s.job_placement;
  req.job_key = s.key;
  // Nodes where a pod of this job fell silent lately: they may look Ready and be frozen (suspect_nodes.h).
  for (const std::string& node :
       suspects_.active(s.key, std::chrono::system_clock::now(), [this](const std::string& node_name) {
         const auto obj = nodes_->get_shared(node_name);
         return obj ? ready_transition(*obj) : std::optional<SuspectNodes::Time>();
       }))
    req.excluded_nodes.insert(node);
  req.pods = static_cast<int>(indices.size());
  req.pod_indices = indices;
  fill_gang_request(req, s.job, s.spec, s.gen, opts_.pod);
  for (int i = 0; i < n; ++i) {
    if (std::binary_search(indices.begin(), indices.end(), i)) continue;
    if (auto it = s.by_index.find(i); it != s.by_index.end() && !node_of(*it->second).empty())
      req.bound[i] = node_of(*it->second);
  }
  req.ahead = gangs_ahead(s);
  const WorldLayout layout = world_layout(s.spec, n);

  const auto t0 = Clock::now();
  const auto inventory = node_inventory();
  req.step_model = placement_step_model(s.spec, layout, n, inventory);
  PlacementResult r = placement_->place(req, inventory);
  if (!r.ok && s.spec.min_replicas) {
    // Elastic: place the part that fits now (the lowest indices); the world shrinks to the pods placed (never below
    // minReplicas) and grows back when the rest fit.
    s.capacity_short = true;
    const std::string why = r.message;
    // The most pods that fit, by bisection (if k pods fit, fewer do): a few placements, not one per replica, each of
    // which also books the gangs ahead (req.ahead).
    PlacementResult best;
    for (int lo = 1, hi = req.pods - 1; lo <= hi;) {
      const int k = lo + (hi - lo) / 2;
      PlacementRequest part = req;
      part.pods = k;
      part.pod_indices.resize(k);
      PlacementResult attempt = placement_->place(part, inventory);
      if (attempt.ok) {
        best = std::move(attempt);
        lo = k + 1;
      } else {
        hi = k - 1;
      }
    }
    if (best.ok) r = std::move(best);
    if (r.ok)
      set_condition(s.status, "Scheduled", false, "Unschedulable",
                    why + "; elastic: bound " + std::to_string(r.nodes.size()) + " of them", s.now_s);
    else
      r.message = why;
  }
  placement_seconds_.add({}).observe(std::chrono::duration<double>(Clock::now() - t0).count());

  if (!r.ok) {
    s.capacity_short = true;
    if (set_condition(s.status, "Scheduled", false, "Unschedulable", r.message, s.now_s) || creating)
      s.events.push_back({true, "Unschedulable", r.message});
    s.keep_min(opts_.unschedulable_retry);
    return;
  }
  // GPU pods: the node's NCCL settings go onto the pod as annotations with its node (at creation, or on the Binding,
  // which the API server applies with spec.nodeName in one write); the pod's env reads them at container start.
  std::unordered_map<std::string, const NodeInfo*> info_of;
  if (req.gpus_per_pod > 0)
    for (const NodeInfo& info : inventory) info_of[info.name] = &info;
  std::set<std::string> warned;
  for (size_t j = 0; j < r.nodes.size(); ++j) {
    out.node[indices[j]] = r.nodes[j];
    auto node = info_of.find(r.nodes[j]);
    if (node == info_of.end()) continue;
    std::string warning;
    if (Json a = nccl_binding_annotations(*node->second, &warning); !a.empty())
      out.annotations[indices[j]] = std::move(a);
    if (!warning.empty() && warned.insert(r.nodes[j]).second)
      s.events.push_back({true, "NodeRailHcas", warning + "; NCCL_IB_HCA left empty (NCCL's own choice)"});
  }
  out.how = r.message;
  if (r.worst_hops >= 0) {
    placement_hops(registry_).add({}).observe(r.worst_hops);
    s.placed_hops = r.worst_hops;
  }
}

}  // namespace railyard::op
