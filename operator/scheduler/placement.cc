#include "operator/scheduler/placement.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "common/checked_math.h"
#include "common/kube/client.h"
#include "common/wellknown.h"

namespace railyard::op {

using kube::field;

bool node_ready(const Json& node) {
  for (const Json& c : field(field(node, "status"), "conditions"))
    if (field(c, "type") == "Ready") return field(c, "status") == "True";
  return false;
}

namespace {
int64_t quantity(const Json& q) {
  if (q.is_number_integer()) return q.get<int64_t>();
  // A double beyond int64 converts to undefined behaviour: such a count is no count (0, as an unreadable one).
  if (q.is_number()) return std::fabs(q.get<double>()) < 9.2e18 ? static_cast<int64_t>(q.get<double>()) : 0;
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
  const Json& phase = field(field(pod, "status"), "phase");
  return phase == "Succeeded" || phase == "Failed";
}
}  // namespace

std::optional<int64_t> parse_quantity_milli(const std::string& q) {
  // number [suffix]: binary (Ki..Ei), decimal (n u m "" k M G T P E) or an exponent (e3, E6).
  size_t i = 0;
  if (i < q.size() && (q[i] == '+' || q[i] == '-')) i++;
  const size_t digits_start = i;
  while (i < q.size() && (std::isdigit(static_cast<unsigned char>(q[i])) || q[i] == '.')) i++;
  if (i == digits_start) return std::nullopt;
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(q.substr(0, i), &used);
    if (used != i) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  const std::string suffix = q.substr(i);
  static const std::map<std::string, double> factors = {{"", 1},
                                                        {"n", 1e-9},
                                                        {"u", 1e-6},
                                                        {"m", 1e-3},
                                                        {"k", 1e3},
                                                        {"M", 1e6},
                                                        {"G", 1e9},
                                                        {"T", 1e12},
                                                        {"P", 1e15},
                                                        {"E", 1e18},
                                                        {"Ki", 1024.0},
                                                        {"Mi", 1048576.0},
                                                        {"Gi", 1073741824.0},
                                                        {"Ti", 1099511627776.0},
                                                        {"Pi", 1125899906842624.0},
                                                        {"Ei", 1152921504606846976.0}};
  double factor = 0;
  if (auto it = factors.find(suffix); it != factors.end()) {
    factor = it->second;
  } else if (suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    try {
      size_t used = 0;
      const int exp = std::stoi(suffix.substr(1), &used);
      if (used != suffix.size() - 1 || exp < -18 || exp > 18) return std::nullopt;
      factor = std::pow(10.0, exp);
    } catch (...) {
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  const double milli = std::ceil(value * factor * 1000.0 - 1e-6);
  if (!(std::fabs(milli) < 9.2e18)) return std::nullopt;
  return static_cast<int64_t>(milli);
}

namespace {
int64_t quantity_milli(const Json& q) {
  if (q.is_number()) {
    const double milli = std::ceil(q.get<double>() * 1000.0);
    return std::fabs(milli) < 9.2e18 ? static_cast<int64_t>(milli) : 0;  // as parse_quantity_milli refuses it
  }
  if (q.is_string()) return parse_quantity_milli(q.get<std::string>()).value_or(0);
  return 0;
}
// Resources counted apart from `scalar`: cpu and memory have fields of their own, GPUs are the placements' own
// check, and pods is the node's pod count.
bool scalar_resource(const std::string& name) {
  return name != "cpu" && name != "memory" && name != "pods" && name != kGpuResource;
}
// requests (limits standing in for missing requests) or spec.overhead: a resource list.
PodRequests resource_list(const Json& requests, const Json& limits) {
  PodRequests r;
  std::set<std::string> given;  // a resource the requests name, even as 0, takes no value from the limits
  auto take = [&](const Json& list) {
    if (!list.is_object()) return;
    for (const auto& [name, q] : list.items()) {
      if (!given.insert(name).second) continue;
      const int64_t milli = std::max<int64_t>(0, quantity_milli(q));
      if (name == "cpu") {
        r.cpu_milli = milli;
      } else if (name == "memory") {
        r.memory = saturating_add(milli, 999) / 1000;
      } else if (scalar_resource(name) && milli > 0) {
        r.scalar[name] = milli;
      }
    }
  };
  take(requests);
  take(limits);  // a limit stands in for a missing request
  return r;
}
PodRequests container_requests(const Json& c) {
  const Json& res = field(c, "resources");
  return resource_list(field(res, "requests"), field(res, "limits"));
}
// Totals saturate: a template's quantities are the user's (9e18 each would wrap an int64 sum negative).
void add_into(PodRequests& to, const PodRequests& r) {
  to.cpu_milli = saturating_add(to.cpu_milli, r.cpu_milli);
  to.memory = saturating_add(to.memory, r.memory);
  for (const auto& [name, v] : r.scalar) to.scalar[name] = saturating_add(to.scalar[name], v);
}
void max_into(PodRequests& to, const PodRequests& r) {
  to.cpu_milli = std::max(to.cpu_milli, r.cpu_milli);
  to.memory = std::max(to.memory, r.memory);
  for (const auto& [name, v] : r.scalar) to.scalar[name] = std::max(to.scalar[name], v);
}
}  // namespace

PodRequests pod_requests(const Json& pod) {
  PodRequests sum, init;
  const Json& spec = field(pod, "spec");
  for (const Json& c : field(spec, "containers")) add_into(sum, container_requests(c));
  for (const Json& c : field(spec, "initContainers")) max_into(init, container_requests(c));
  max_into(sum, init);
  // The RuntimeClass's overhead, which the admission controller copied into the pod, is asked of the node too.
  add_into(sum, resource_list(field(spec, "overhead"), Json()));
  return sum;
}

std::string resource_shortfall(const NodeInfo& n, const PodRequests& r) {
  if (n.pods_allocatable >= 0 && n.pods_used + 1 > n.pods_allocatable) return "pods";
  if (r.cpu_milli > 0 && saturating_add(n.cpu_used_milli, r.cpu_milli) > n.cpu_allocatable_milli) return "cpu";
  if (r.memory > 0 && saturating_add(n.memory_used, r.memory) > n.memory_allocatable) return "memory";
  for (const auto& [name, want] : r.scalar) {
    if (want <= 0) continue;
    auto alloc = n.scalar_allocatable.find(name);
    auto used = n.scalar_used.find(name);
    const int64_t have = alloc == n.scalar_allocatable.end() ? 0 : alloc->second;
    if (saturating_add(used == n.scalar_used.end() ? 0 : used->second, want) > have) return name;
  }
  return "";
}

int64_t pod_resource(const Json& pod, const std::string& resource) {
  int64_t total = 0;
  for (const Json& c : field(field(pod, "spec"), "containers")) {
    const Json& res = field(c, "resources");
    for (const char* part : {"limits", "requests"}) {
      if (const Json& q = field(field(res, part), resource); !q.is_null()) {
        total = saturating_add(total, quantity(q));
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
  std::vector<const Json*> n, p;
  for (const Json& x : nodes) n.push_back(&x);
  for (const Json& x : pods) p.push_back(&x);
  return build_inventory_of(n, p);
}

std::vector<NodeInfo> build_inventory_of(const std::vector<const Json*>& nodes, const std::vector<const Json*>& pods) {
  // Reads the informers' objects in place: 1,000 nodes and their pods are read on every placement.
  auto string_of = [](const Json& j) { return j.is_string() ? j.get<std::string>() : std::string(); };
  std::map<std::string, NodeInfo> by_name;
  for (const Json* np : nodes) {
    const Json& n = *np;
    const Json& meta = field(n, "metadata");
    NodeInfo info;
    info.name = string_of(field(meta, "name"));
    info.ready = node_ready(n);
    const Json& spec = field(n, "spec");
    info.unschedulable = field(spec, "unschedulable") == true;
    if (const Json& taints = field(spec, "taints"); taints.is_array()) info.taints = taints;
    for (const auto& [key, value] : field(meta, "labels").items())
      if (value.is_string()) info.labels[key] = value.get<std::string>();
    const Json& annotations = field(meta, "annotations");
    info.rail_hcas = string_of(field(annotations, wellknown::kRailHcasAnnotation));
    info.socket_ifname = string_of(field(annotations, wellknown::kSocketIfnameAnnotation));
    const Json& status = field(n, "status");
    const Json& alloc =
        field(status, "allocatable").is_object() ? field(status, "allocatable") : field(status, "capacity");
    if (const Json& q = field(alloc, kGpuResource); !q.is_null()) info.gpu_allocatable = quantity(q);
    if (const Json& q = field(alloc, "cpu"); !q.is_null()) info.cpu_allocatable_milli = quantity_milli(q);
    if (const Json& q = field(alloc, "memory"); !q.is_null()) info.memory_allocatable = quantity_milli(q) / 1000;
    if (const Json& q = field(alloc, "pods"); !q.is_null()) info.pods_allocatable = quantity(q);
    if (alloc.is_object())
      for (const auto& [name, q] : alloc.items())
        if (scalar_resource(name)) info.scalar_allocatable[name] = std::max<int64_t>(0, quantity_milli(q));
    by_name[info.name] = std::move(info);
  }
  for (const Json* pp : pods) {
    const Json& p = *pp;
    const Json& node = field(field(p, "spec"), "nodeName");
    if (!node.is_string() || terminated(p)) continue;
    auto it = by_name.find(node.get_ref<const std::string&>());
    if (it == by_name.end()) continue;
    it->second.gpu_used = saturating_add(it->second.gpu_used, pod_resource(p, kGpuResource));
    const PodRequests r = pod_requests(p);
    it->second.cpu_used_milli = saturating_add(it->second.cpu_used_milli, r.cpu_milli);
    it->second.memory_used = saturating_add(it->second.memory_used, r.memory);
    for (const auto& [name, v] : r.scalar)
      it->second.scalar_used[name] = saturating_add(it->second.scalar_used[name], v);
    it->second.pods_used++;
    const Json& meta = field(p, "metadata");
    if (const Json& job = field(field(meta, "labels"), wellknown::kJobLabel); job.is_string()) {
      it->second.worker_pods++;
      it->second.jobs.insert(string_of(field(meta, "namespace")) + "/" + job.get<std::string>());
    }
  }
  std::vector<NodeInfo> out;
  for (auto& [name, info] : by_name) out.push_back(std::move(info));
  return out;
}

ReservingPlacement::ReservingPlacement(std::unique_ptr<Placement> inner, std::chrono::milliseconds hold)
    : inner_(std::move(inner)), hold_(hold) {}

PlacementResult ReservingPlacement::place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  std::vector<NodeInfo> view = nodes;
  std::map<std::string, NodeInfo*> by_name;
  for (NodeInfo& n : view) by_name[n.name] = &n;
  std::vector<int> indices = req.pod_indices;
  for (int i = static_cast<int>(indices.size()); i < req.pods; ++i) indices.push_back(i);
  const std::set<int> placing(indices.begin(), indices.end());
  std::vector<Reservation> kept;
  for (Reservation& r : reserved_) {
    auto it = by_name.find(r.node);
    // Gone when it expired, when the cache shows the job on that node (the binding has arrived), or when the same pod
    // is being placed again.
    if (r.until <= now || (it != by_name.end() && it->second->jobs.count(r.job_key)) ||
        (r.job_key == req.job_key && placing.count(r.index)))
      continue;
    if (it != by_name.end()) add_pod(*it->second, r.job_key, r.gpus, r.requests);
    kept.push_back(std::move(r));
  }
  reserved_ = std::move(kept);
  const std::vector<std::string> ahead = book_ahead(req, view);
  PlacementResult result = inner_->place(req, view);
  if (!result.ok && !ahead.empty()) {
    std::string names;
    for (size_t i = 0; i < ahead.size() && i < 3; ++i) names += (i ? ", " : "") + ahead[i];
    if (ahead.size() > 3) names += ", ...";
    result.message += "; room held first for " + std::to_string(ahead.size()) + " waiting gang" +
                      (ahead.size() == 1 ? "" : "s") + " of higher priority (" + names + ")";
  }
  if (result.ok)
    for (size_t k = 0; k < result.nodes.size() && k < indices.size(); ++k)
      reserved_.push_back({req.job_key, result.nodes[k], indices[k], req.gpus_per_pod, req.requests, now + hold_});
  return result;
}

std::vector<std::string> ReservingPlacement::book_ahead(const PlacementRequest& req, std::vector<NodeInfo>& view) {
  std::vector<std::string> booked;
  std::map<std::string, NodeInfo*> by_name;
  for (NodeInfo& n : view) by_name[n.name] = &n;
  for (const PlacementRequest& a : req.ahead) {
    // A gang placed moments ago holds its reservations already (its pods are not in the cache yet).
    if (a.job_key == req.job_key ||
        std::any_of(reserved_.begin(), reserved_.end(), [&](const Reservation& r) { return r.job_key == a.job_key; }))
      continue;
    const PlacementResult r = inner_->place(a, view);
    if (!r.ok) continue;
    for (const std::string& node : r.nodes)
      if (auto it = by_name.find(node); it != by_name.end())
        add_pod(*it->second, a.job_key, a.gpus_per_pod, a.requests);
    booked.push_back(a.job_key);
  }
  return booked;
}

void add_pod(NodeInfo& node, const std::string& job_key, int64_t gpus, const PodRequests& requests) {
  node.gpu_used = saturating_add(node.gpu_used, gpus);
  node.worker_pods++;
  node.cpu_used_milli = saturating_add(node.cpu_used_milli, requests.cpu_milli);
  node.memory_used = saturating_add(node.memory_used, requests.memory);
  for (const auto& [name, v] : requests.scalar) node.scalar_used[name] = saturating_add(node.scalar_used[name], v);
  node.pods_used++;
  node.jobs.insert(job_key);
}

void apply_job_options(const Json& job, PlacementRequest& req) {
  const Json spec = job.value("spec", Json::object());
  const Json pl = spec.value("placement", Json::object());
  if (pl.is_object()) {
    if (pl.contains("railAware") && pl["railAware"].is_boolean()) req.rail_aware = pl["railAware"].get<bool>();
    req.hard = pl.value("mode", "soft") == "hard";
    for (const Json& k : pl.value("topologyKeys", Json::array()))
      if (k.is_string() && !k.get<std::string>().empty()) req.topology_keys.push_back(k.get<std::string>());
  }
  const Json tmpl = spec.value("template", Json::object());
  if (tmpl.is_object()) {
    const Json tspec = tmpl.value("spec", Json::object());
    if (tspec.is_object() && tspec.contains("affinity") && tspec["affinity"].is_object() &&
        tspec["affinity"].contains("nodeAffinity"))
      req.node_affinity = tspec["affinity"]["nodeAffinity"];
  }
  const Json fp = spec.value("failurePolicy", Json::object());
  bool exclude = true;  // the CRD default
  if (fp.is_object() && fp.contains("excludeFailedNodes") && fp["excludeFailedNodes"].is_boolean())
    exclude = fp["excludeFailedNodes"].get<bool>();
  if (!exclude) return;
  const Json ann = job.contains("metadata") ? job["metadata"].value("annotations", Json::object()) : Json::object();
  if (ann.contains(kExcludeNodesAnnotation) && ann[kExcludeNodesAnnotation].is_string())
    req.excluded_nodes = parse_node_list(ann[kExcludeNodesAnnotation].get<std::string>());
  const Json status = job.value("status", Json::object());
  if (status.is_object() && status.contains("lastRestart") && status["lastRestart"].is_object()) {
    const Json& last = status["lastRestart"];
    if (last.value("reason", "") == "NodeLost" && !last.value("node", "").empty())
      req.avoided_nodes.insert(last.value("node", ""));
  }
}

namespace {
bool label_expression_holds(const Json& e, const std::map<std::string, std::string>& labels) {
  const std::string key = e.value("key", ""), op = e.value("operator", "");
  const Json values = e.value("values", Json::array());
  auto it = labels.find(key);
  const bool has = it != labels.end();
  auto in_values = [&] {
    if (!has) return false;
    for (const Json& v : values)
      if (v.is_string() && v.get<std::string>() == it->second) return true;
    return false;
  };
  auto compare = [&](bool greater) {
    if (!has || values.size() != 1 || !values[0].is_string()) return false;
    try {
      long long have = std::stoll(it->second), want = std::stoll(values[0].get<std::string>());
      return greater ? have > want : have < want;
    } catch (...) {
      return false;
    }
  };
  if (op == "In") return in_values();
  if (op == "NotIn") return !in_values();
  if (op == "Exists") return has;
  if (op == "DoesNotExist") return !has;
  if (op == "Gt") return compare(true);
  if (op == "Lt") return compare(false);
  return false;  // an unknown operator matches nothing, as in kube-scheduler
}
}  // namespace

bool matches_node_affinity(const Json& node_affinity, const NodeInfo& node) {
  if (!node_affinity.is_object()) return true;
  const Json req = node_affinity.value("requiredDuringSchedulingIgnoredDuringExecution", Json());
  if (!req.is_object()) return true;
  const Json terms = req.value("nodeSelectorTerms", Json::array());
  if (!terms.is_array() || terms.empty()) return true;
  const std::map<std::string, std::string> fields{{"metadata.name", node.name}};
  for (const Json& term : terms) {
    if (!term.is_object()) continue;
    const Json exprs = term.value("matchExpressions", Json::array());
    const Json field_exprs = term.value("matchFields", Json::array());
    if (exprs.empty() && field_exprs.empty()) continue;  // an empty term matches no objects
    bool all = true;
    for (const Json& e : exprs) all = all && e.is_object() && label_expression_holds(e, node.labels);
    for (const Json& e : field_exprs) all = all && e.is_object() && label_expression_holds(e, fields);
    if (all) return true;
  }
  return false;
}

metrics::Family<metrics::Histogram>& placement_hops(metrics::Registry& registry) {
  return registry.histogram(metrics::names::kOperatorPlacementHops,
                            "Worst same-rail switch hops between communicating pods of each gang placed (0: one node, "
                            "1: one unit, 3: one leaf, 5: one spine).",
                            {0, 1, 3, 5, 7, 9});
}

int64_t preferred_affinity_score(const Json& node_affinity, const NodeInfo& node) {
  if (!node_affinity.is_object()) return 0;
  const Json terms = node_affinity.value("preferredDuringSchedulingIgnoredDuringExecution", Json::array());
  if (!terms.is_array()) return 0;
  int64_t score = 0;
  for (const Json& t : terms) {
    if (!t.is_object() || !t.contains("preference") || !t["preference"].is_object()) continue;
    const Json& pref = t["preference"];
    const Json exprs = pref.value("matchExpressions", Json::array());
    if (!exprs.is_array() || exprs.empty()) continue;
    bool all = true;
    for (const Json& e : exprs) all = all && e.is_object() && label_expression_holds(e, node.labels);
    const Json w = t.value("weight", Json(0));
    if (all && w.is_number_integer()) score = saturating_add(score, w.get<int64_t>());
  }
  return score;
}

namespace {
std::string join_names(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "resource requests" : out;
}
}  // namespace

PlacementResult SimplePlacement::place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) {
  PlacementResult r;
  std::vector<const NodeInfo*> sorted;
  for (const NodeInfo& n : nodes) sorted.push_back(&n);
  // Name order, with the nodes to avoid last.
  std::sort(sorted.begin(), sorted.end(), [&](auto* a, auto* b) {
    return std::pair(req.avoided_nodes.count(a->name), a->name) < std::pair(req.avoided_nodes.count(b->name), b->name);
  });
  int not_ready = 0, busy = 0, filtered = 0, excluded = 0, no_room = 0;
  std::set<std::string> short_of;  // what the nodes without room lack, named in the message
  for (const NodeInfo* n : sorted) {
    if (static_cast<int>(r.nodes.size()) == req.pods) break;
    if (!n->ready || n->unschedulable) {
      not_ready++;
      continue;
    }
    if (req.excluded_nodes.count(n->name)) {
      excluded++;
      continue;
    }
    bool selected = std::all_of(req.node_selector.begin(), req.node_selector.end(), [&](const auto& kv) {
      auto it = n->labels.find(kv.first);
      return it != n->labels.end() && it->second == kv.second;
    });
    bool tolerated =
        std::all_of(n->taints.begin(), n->taints.end(), [&](const Json& t) { return tolerates(req.tolerations, t); });
    if (!selected || !tolerated || !matches_node_affinity(req.node_affinity, *n)) {
      filtered++;
      continue;
    }
    bool fits = !n->jobs.count(req.job_key);
    if (req.gpus_per_pod > 0)
      fits = fits && saturating_add(n->gpu_used, req.gpus_per_pod) <= n->gpu_allocatable;
    else
      fits = fits && n->worker_pods == 0;
    if (!fits) {
      busy++;
      continue;
    }
    if (auto name = resource_shortfall(*n, req.requests); !name.empty()) {
      no_room++;
      short_of.insert(name);
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
              (excluded ? std::to_string(excluded) + " excluded by failure, " : "") + std::to_string(filtered) +
              " excluded by selector, affinity or taints, " + std::to_string(busy) +
              (req.gpus_per_pod > 0 ? " without " + std::to_string(req.gpus_per_pod) + " free GPUs"
                                    : " already running a worker pod") +
              (no_room ? ", " + std::to_string(no_room) + " without room for the pod's " + join_names(short_of) : "") +
              "); none bound";
  return r;
}

}  // namespace railyard::op
