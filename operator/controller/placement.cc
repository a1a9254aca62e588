#include "operator/controller/placement.h"

#include <algorithm>

#include "operator/controller/pod_builder.h"

namespace railyard::op {

bool node_ready(const Json& node) {
  const Json conds = node.contains("status") ? node["status"].value("conditions", Json::array()) : Json::array();
  for (const Json& c : conds)
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  return false;
}

namespace {
int64_t quantity(const Json& q) {
  if (q.is_number_integer()) return q.get<int64_t>();
  if (q.is_number()) return static_cast<int64_t>(q.get<double>());
  if (q.is_string()) {
    try {
      return std::stoll(q.get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}
bool terminated(const Json& pod) {
  const std::string phase = pod.contains("status") ? pod["status"].value("phase", "") : "";
  return phase == "Succeeded" || phase == "Failed";
}
}  // namespace

int64_t pod_resource(const Json& pod, const std::string& resource) {
  int64_t total = 0;
  if (!pod.contains("spec")) return 0;
  for (const Json& c : pod["spec"].value("containers", Json::array())) {
    const Json res = c.value("resources", Json::object());
    for (const char* part : {"limits", "requests"}) {
      if (res.contains(part) && res[part].contains(resource)) {
        total += quantity(res[part][resource]);
        break;
      }
    }
  }
  return total;
}

bool tolerates(const Json& tolerations, const Json& taint) {
  const std::string effect = taint.value("effect", "");
  if (effect != "NoSchedule" && effect != "NoExecute") return true;  // PreferNoSchedule never blocks
  if (!tolerations.is_array()) return false;
  for (const Json& t : tolerations) {
    const std::string op = t.value("operator", "Equal");
    const std::string key = t.value("key", "");
    const std::string t_effect = t.value("effect", "");
    if (!t_effect.empty() && t_effect != effect) continue;
    if (key.empty() && op == "Exists") return true;
    if (key != taint.value("key", "")) continue;
    if (op == "Exists" || t.value("value", "") == taint.value("value", "")) return true;
  }
  return false;
}

std::vector<NodeInfo> build_inventory(const std::vector<Json>& nodes, const std::vector<Json>& pods) {
  std::map<std::string, NodeInfo> by_name;
  for (const Json& n : nodes) {
    NodeInfo info;
    info.name = n["metadata"].value("name", "");
    info.ready = node_ready(n);
    const Json spec = n.value("spec", Json::object());
    info.unschedulable = spec.value("unschedulable", false);
    info.taints = spec.value("taints", Json::array());
    const Json labels = n["metadata"].value("labels", Json::object());
    for (auto it = labels.begin(); it != labels.end(); ++it)
      if (it.value().is_string()) info.labels[it.key()] = it.value().get<std::string>();
    const Json status = n.value("status", Json::object());
    const Json alloc = status.value("allocatable", status.value("capacity", Json::object()));
    if (alloc.contains(kGpuResource)) info.gpu_allocatable = quantity(alloc[kGpuResource]);
    by_name[info.name] = std::move(info);
  }
  for (const Json& p : pods) {
    const std::string node = p.contains("spec") ? p["spec"].value("nodeName", "") : "";
    auto it = by_name.find(node);
    if (node.empty() || it == by_name.end() || terminated(p)) continue;
    it->second.gpu_used += pod_resource(p, kGpuResource);
    const Json labels = p["metadata"].value("labels", Json::object());
    if (labels.contains(kJobLabel)) {
      it->second.worker_pods++;
      it->second.jobs.insert(p["metadata"].value("namespace", "") + "/" + labels[kJobLabel].get<std::string>());
    }
  }
  std::vector<NodeInfo> out;
  for (auto& [name, info] : by_name) out.push_back(std::move(info));
  return out;
}

PlacementResult SimplePlacement::place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) {
  PlacementResult r;
  std::vector<const NodeInfo*> sorted;
  for (const NodeInfo& n : nodes) sorted.push_back(&n);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  int not_ready = 0, busy = 0, filtered = 0;
  for (const NodeInfo* n : sorted) {
    if (static_cast<int>(r.nodes.size()) == req.pods) break;
    if (!n->ready || n->unschedulable) {
      not_ready++;
      continue;
    }
    bool selected = std::all_of(req.node_selector.begin(), req.node_selector.end(), [&](const auto& kv) {
      auto it = n->labels.find(kv.first);
      return it != n->labels.end() && it->second == kv.second;
    });
    bool tolerated =
        std::all_of(n->taints.begin(), n->taints.end(), [&](const Json& t) { return tolerates(req.tolerations, t); });
    if (!selected || !tolerated) {
      filtered++;
      continue;
    }
    bool fits = !n->jobs.count(req.job_key);
    if (req.gpus_per_pod > 0)
      fits = fits && n->gpu_allocatable - n->gpu_used >= req.gpus_per_pod;
    else
      fits = fits && n->worker_pods == 0;
    if (!fits) {
      busy++;
      continue;
    }
    r.nodes.push_back(n->name);
  }
  if (static_cast<int>(r.nodes.size()) == req.pods) {
    r.ok = true;
    return r;
  }
  r.missing = req.pods - static_cast<int>(r.nodes.size());
  r.nodes.clear();
  r.message = std::to_string(r.missing) + " of " + std::to_string(req.pods) + " pods do not fit (" +
              std::to_string(nodes.size()) + " nodes: " + std::to_string(not_ready) + " not ready or cordoned, " +
              std::to_string(filtered) + " excluded by selector or taints, " + std::to_string(busy) +
              (req.gpus_per_pod > 0 ? " without " + std::to_string(req.gpus_per_pod) + " free GPUs"
                                    : " already running a worker pod") +
              "); none bound";
  return r;
}

}  // namespace railyard::op
