#include "operator/scheduler/rail_aware.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>

namespace railyard::op::sched {

std::vector<CommEdge> gang_edges(int pods, int procs_per_pod, int tensor, int pipeline) {
  std::vector<CommEdge> out;
  if (pods <= 1) return out;
  const int p = std::max(1, procs_per_pod);
  const long long ranks = static_cast<long long>(pods) * p;
  int tp = std::max(1, tensor), pp = std::max(1, pipeline);
  if (ranks % (static_cast<long long>(tp) * pp) != 0) tp = pp = 1;
  const long long dp = ranks / (static_cast<long long>(tp) * pp);
  // Relative volume per step: a tensor group exchanges activations every layer (heaviest); data-parallel rings move
  // the gradients once per step and pipeline neighbours the activations of each micro-batch (comparable).
  constexpr double kTensor = 4.0, kData = 1.0, kPipeline = 1.0;
  std::map<std::pair<int, int>, double> w;
  auto rank = [&](long long t, long long d, long long s) { return t + tp * (d + dp * s); };
  auto add = [&](long long r1, long long r2, double weight) {
    int a = static_cast<int>(r1 / p), b = static_cast<int>(r2 / p);
    if (a == b) return;
    if (a > b) std::swap(a, b);
    w[{a, b}] += weight;
  };
  for (long long s = 0; s < pp; ++s)
    for (long long d = 0; d < dp; ++d)
      for (long long t = 0; t < tp; ++t) {
        const long long r = rank(t, d, s);
        if (dp > 1 && (dp > 2 || d == 0)) add(r, rank(t, (d + 1) % dp, s), kData);
        if (s + 1 < pp) add(r, rank(t, d, s + 1), kPipeline);
        if (tp > 1 && (tp > 2 || t == 0)) add(r, rank((t + 1) % tp, d, s), kTensor);
      }
  out.reserve(w.size());
  for (const auto& [ab, weight] : w) out.push_back({ab.first, ab.second, weight});
  return out;
}

GangCost gang_cost(const Topology& topo, const std::vector<int>& node_of_pod, const std::vector<CommEdge>& edges) {
  GangCost c;
  int counted = 0;
  long long hop_sum = 0;
  for (const CommEdge& e : edges) {
    if (e.a >= static_cast<int>(node_of_pod.size()) || e.b >= static_cast<int>(node_of_pod.size())) continue;
    const int na = node_of_pod[e.a], nb = node_of_pod[e.b];
    if (na < 0 || nb < 0) continue;
    const int hops = topo.same_rail(na, nb).hops;
    c.cost += e.weight * hops;
    c.worst_hops = std::max(c.worst_hops, hops);
    hop_sum += hops;
    counted++;
  }
  c.mean_hops = counted ? static_cast<double>(hop_sum) / counted : 0.0;
  return c;
}

plan::PlacedTiers placed_tiers(const Topology& topo, const std::vector<int>& node_of_pod, int procs_per_pod, int tensor,
                               int pipeline) {
  plan::PlacedTiers out{0, 0};
  const int p = std::max(1, procs_per_pod);
  const long long ranks = static_cast<long long>(node_of_pod.size()) * p;
  const long long tp = std::max(1, tensor), pp = std::max(1, pipeline);
  if (ranks % (tp * pp) != 0) return out;
  const long long dp = ranks / (tp * pp);
  auto node = [&](long long t, long long d, long long s) { return node_of_pod[(t + tp * (d + dp * s)) / p]; };
  // The planner's tiers stop at the spine; wider (across spines) counts as the spine.
  auto tier = [&](int a, int b) { return a < 0 || b < 0 ? 0 : std::min(topo.tier(a, b), 3); };
  for (long long s = 0; s < pp; ++s)
    for (long long t = 0; t < tp; ++t) {
      // The narrowest domain holding a group is the widest tier between its first member and any other.
      int first = -1;
      for (long long d = 0; d < dp; ++d) {
        const int n = node(t, d, s);
        if (n < 0) continue;
        if (first < 0) first = n;
        out.dp = std::max(out.dp, tier(first, n));
        if (s + 1 < pp) out.pp = std::max(out.pp, tier(n, node(t, d, s + 1)));
      }
    }
  return out;
}

double predicted_step(const PlacementStepModel& model, const Topology& topo, const std::vector<int>& node_of_pod,
                      int procs_per_pod) {
  plan::Cluster c = model.cluster;
  c.topology.gpus_per_node = std::max(1, procs_per_pod);
  c.topology.nodes = 0;  // the placement says where the pods are
  c.gpus = static_cast<int>(node_of_pod.size()) * c.topology.gpus_per_node;
  const plan::Layout& l = model.layout;
  if (!plan::check_layout(model.job, c, l).empty()) return -1;
  return plan::estimate(model.job, c, l, placed_tiers(topo, node_of_pod, procs_per_pod, l.tp, l.pp)).time.step;
}

namespace {

enum class Why { kFits, kNotReady, kExcluded, kAvoided, kFiltered, kTainted, kBusy, kNoRoom };

Why classify(const NodeInfo& n, const PlacementRequest& req, bool avoid) {
  if (!n.ready || n.unschedulable) return Why::kNotReady;
  if (req.excluded_nodes.count(n.name)) return Why::kExcluded;
  for (const auto& [k, v] : req.node_selector) {
    auto it = n.labels.find(k);
    if (it == n.labels.end() || it->second != v) return Why::kFiltered;
  }
  if (!matches_node_affinity(req.node_affinity, n)) return Why::kFiltered;
  for (const Json& t : n.taints)
    if (!tolerates(req.tolerations, t)) return Why::kTainted;
  if (n.jobs.count(req.job_key)) return Why::kBusy;
  if (req.gpus_per_pod > 0 ? n.gpu_allocatable - n.gpu_used < req.gpus_per_pod : n.worker_pods > 0) return Why::kBusy;
  if (!resource_shortfall(n, req.requests).empty()) return Why::kNoRoom;
  if (avoid && req.avoided_nodes.count(n.name)) return Why::kAvoided;
  return Why::kFits;
}

std::string need_text(const PlacementRequest& req) {
  return req.gpus_per_pod > 0 ? "with " + std::to_string(req.gpus_per_pod) + " free " + kGpuResource
                              : "without a Railyard worker pod";
}

// `short_of`: the resources the nodes without room lack (kNoRoom), named in its text.
std::string why_text(Why w, const PlacementRequest& req, const std::string& short_of) {
  switch (w) {
    case Why::kNotReady:
      return "not Ready or cordoned";
    case Why::kExcluded:
      return "excluded by failure";
    case Why::kAvoided:
      return "lost a pod of the job";
    case Why::kFiltered:
      return "not selected by nodeSelector or affinity";
    case Why::kTainted:
      return "tainted";
    case Why::kBusy:
      return req.gpus_per_pod > 0 ? "without " + std::to_string(req.gpus_per_pod) + " free " + kGpuResource
                                  : "already running a worker pod";
    case Why::kNoRoom:
      return "without room for the pod's " + (short_of.empty() ? std::string("resource requests") : short_of) +
             " (other pods' requests counted)";
    case Why::kFits:
      break;
  }
  return "fits";
}

std::string fmt_mean(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// One attempt: the smallest domain that holds the gang, the best-fit nodes inside it.
class Search {
 public:
  Search(const Topology& topo, const std::vector<NodeInfo>& nodes, const PlacementRequest& req, bool avoid)
      : topo_(topo), nodes_(nodes), req_(req), levels_(topo.levels()) {
    const int n = topo.size();
    why_.resize(n);
    preferred_.resize(n);
    for (int i = 0; i < n; ++i) {
      why_[i] = classify(nodes[i], req, avoid);
      preferred_[i] = preferred_affinity_score(req.node_affinity, nodes[i]);
    }
    // Level levels_ is the whole cluster (one domain).
    count_.assign(levels_ + 1, {});
    anchors_.assign(levels_ + 1, {});
    children_.assign(levels_ + 1, {});
    for (int l = 0; l <= levels_; ++l) {
      const int domains = l < levels_ ? topo.domain_count(l) : 1;
      count_[l].assign(domains, 0);
      anchors_[l].assign(domains, 0);
      children_[l].assign(domains, {});
    }
    std::vector<std::set<std::pair<int, int>>> seen(levels_ + 1);
    for (int i = 0; i < n; ++i) {
      const bool fits = why_[i] == Why::kFits;
      for (int l = 0; l <= levels_; ++l) {
        const int d = dom(i, l);
        if (fits) count_[l][d]++;
        if (l == 0) {
          if (fits) children_[0][d].push_back(i);
        } else if (const int child = dom(i, l - 1); seen[l].insert({d, child}).second) {
          children_[l][d].push_back(child);
        }
      }
    }
    for (const auto& [index, node] : req.bound) {
      const int i = topo.index(node);
      if (i < 0) continue;
      anchor_nodes_.push_back(i);
      for (int l = 0; l <= levels_; ++l) anchors_[l][dom(i, l)]++;
    }
  }

  int dom(int node, int level) const { return level < levels_ ? topo_.domain(node, level) : 0; }
  Why why(int node) const { return why_[node]; }
  int fitting() const { return count_[levels_][0]; }
  int count(int level, int d) const { return count_[level][d]; }
  int domains(int level) const { return static_cast<int>(count_[level].size()); }
  std::string domain_name(int level, int d) const { return level < levels_ ? topo_.domain_name(level, d) : "cluster"; }

  // The chosen domain's nodes for `pods` new pods, or empty. `level`/`domain` say where.
  struct Choice {
    std::vector<int> nodes;
    GangCost cost;
    int level = -1, domain = -1;
    double step = -1;  // the cost model's step time (seconds), -1 without a model
  };

  Choice best(int max_level, const std::vector<CommEdge>& edges, const std::vector<int>& indices, int gang) const {
    const int pods = static_cast<int>(indices.size());
    const int total_anchors = static_cast<int>(anchor_nodes_.size());
    // The replica orders tried on each candidate's nodes (in topology order): the rank order (stages contiguous, so
    // data-parallel groups share the nearest nodes) and, when the cost model can tell them apart (dp and pp > 1),
    // pipelines contiguous (adjacent stages share the nearest nodes).
    std::vector<std::vector<int>> orders{indices};
    const PlacementStepModel* model = req_.step_model.get();
    if (model && req_.pipeline > 1) {
      const long long p = std::max(1, req_.procs_per_pod), tp = std::max(1, req_.tensor), pp = req_.pipeline;
      const long long ranks = static_cast<long long>(gang) * p;
      if (ranks % (tp * pp) == 0 && ranks / (tp * pp) > 1) {
        const long long dp = ranks / (tp * pp);
        std::vector<int> by_pipeline = indices;
        auto key = [&](int replica) {
          const long long r = replica * p;
          return std::make_tuple((r / tp) % dp, r / (tp * dp), r % tp);
        };
        std::stable_sort(by_pipeline.begin(), by_pipeline.end(), [&](int a, int b) { return key(a) < key(b); });
        if (by_pipeline != indices) orders.push_back(std::move(by_pipeline));
      }
    }
    using Key = std::tuple<double, int64_t, std::vector<int>, std::string>;
    // The predicted step decides unless two are within 0.1% (the same hop structure); then today's rules: least hop
    // cost, the preferred node affinity, the fullest domain, ..., the name.
    auto better = [](double step_a, const Key& a, double step_b, const Key& b) {
      if (step_a >= 0 && step_b >= 0 && std::abs(step_a - step_b) > 1e-3 * std::min(step_a, step_b))
        return step_a < step_b;
      return a < b;
    };
    for (int l = 0; l <= max_level; ++l) {
      Choice best;
      Key best_key;
      for (int d = 0; d < domains(l); ++d) {
        if (count_[l][d] < pods || anchors_[l][d] != total_anchors) continue;
        std::vector<int> chosen;
        select(l, d, pods, chosen);
        order(chosen);
        // Least cost, then the user's preferred node affinity, then the fullest domain, then the fullest parent, ...
        // (best fit leaves the emptier domains whole for larger gangs).
        int64_t preferred = 0;
        for (int node : chosen) preferred += preferred_[node];
        std::vector<int> fullness{count_[l][d]};
        if (const int rep = any_node(l, d); rep >= 0)
          for (int up = l + 1; up <= levels_; ++up) fullness.push_back(count_[up][dom(rep, up)]);
        for (const std::vector<int>& replicas : orders) {
          std::vector<int> node_of_pod(gang, -1);
          for (const auto& [index, node] : req_.bound)
            if (index >= 0 && index < gang) node_of_pod[index] = topo_.index(node);
          for (int k = 0; k < pods; ++k) node_of_pod[replicas[k]] = chosen[k];
          GangCost c = gang_cost(topo_, node_of_pod, edges);
          const double step = model ? predicted_step(*model, topo_, node_of_pod, req_.procs_per_pod) : -1;
          Key key = std::make_tuple(c.cost, -preferred, fullness, domain_name(l, d));
          if (best.nodes.empty() || better(step, key, best.step, best_key)) {
            // Nodes in the order of `indices` (the pods the caller asked for).
            std::vector<int> nodes(pods);
            for (int k = 0; k < pods; ++k) nodes[k] = node_of_pod[indices[k]];
            best = {std::move(nodes), c, l, d, step};
            best_key = key;
          }
        }
      }
      if (!best.nodes.empty()) return best;
    }
    return {};
  }

  // A fitting node inside domain d of `level` (-1: none).
  int any_node(int level, int d) const {
    while (level > 0) {
      int next = -1;
      for (int c : children_[level][d])
        if (count_[level - 1][c] > 0) {
          next = c;
          break;
        }
      if (next < 0) return -1;
      d = next;
      level--;
    }
    return children_[0][d].empty() ? -1 : children_[0][d][0];
  }

  // The domain of `level` with the most fitting nodes.
  int largest(int level) const {
    int best = 0;
    for (int d = 1; d < domains(level); ++d)
      if (count_[level][d] > count_[level][best]) best = d;
    return best;
  }

 private:
  // Best fit, top-down: one child that holds all r (the fullest such), else the largest children whole and the best
  // fit for the rest. Children holding the gang's bound pods come first, so a replacement lands near its gang.
  void select(int level, int d, int r, std::vector<int>& out) const {
    if (r <= 0) return;
    if (level == 0) {
      std::vector<int> ns = children_[0][d];
      // Preferred nodes first, then the fullest (fewest GPUs left after the pod), so whole nodes stay free.
      std::sort(ns.begin(), ns.end(), [&](int a, int b) {
        auto fa = nodes_[a].gpu_allocatable - nodes_[a].gpu_used, fb = nodes_[b].gpu_allocatable - nodes_[b].gpu_used;
        auto pa = -preferred_[a], pb = -preferred_[b];
        return std::tie(pa, fa, topo_.name(a)) < std::tie(pb, fb, topo_.name(b));
      });
      for (int k = 0; k < r && k < static_cast<int>(ns.size()); ++k) out.push_back(ns[k]);
      return;
    }
    std::vector<int> kids;
    for (int c : children_[level][d])
      if (count_[level - 1][c] > 0) kids.push_back(c);
    std::vector<char> used(kids.size(), 0);
    int remaining = r;
    while (remaining > 0) {
      int fit = -1, big = -1;
      for (int k = 0; k < static_cast<int>(kids.size()); ++k) {
        if (used[k]) continue;
        const int c = kids[k];
        auto fit_key = [&](int x) {
          return std::make_tuple(-anchors_[level - 1][x], count_[level - 1][x], domain_name(level - 1, x));
        };
        auto big_key = [&](int x) {
          return std::make_tuple(-anchors_[level - 1][x], -count_[level - 1][x], domain_name(level - 1, x));
        };
        if (count_[level - 1][c] >= remaining && (fit < 0 || fit_key(c) < fit_key(kids[fit]))) fit = k;
        if (big < 0 || big_key(c) < big_key(kids[big])) big = k;
      }
      if (big < 0) return;  // cannot happen: count_ said the domain holds r
      const int k = fit >= 0 ? fit : big;
      used[k] = 1;
      const int take = std::min(remaining, count_[level - 1][kids[k]]);
      select(level - 1, kids[k], take, out);
      remaining -= take;
    }
  }

  // Topology order (widest domain first, then name): consecutive replicas are neighbours in the network.
  void order(std::vector<int>& chosen) const {
    std::sort(chosen.begin(), chosen.end(), [&](int a, int b) {
      for (int l = levels_ - 1; l >= 0; --l) {
        const int da = topo_.domain(a, l), db = topo_.domain(b, l);
        if (da != db) return std::tie(topo_.domain_name(l, da), da) < std::tie(topo_.domain_name(l, db), db);
      }
      return topo_.name(a) < topo_.name(b);
    });
  }

  const Topology& topo_;
  const std::vector<NodeInfo>& nodes_;
  const PlacementRequest& req_;
  const int levels_;
  std::vector<Why> why_;
  std::vector<int64_t> preferred_;  // preferred node affinity score per node
  std::vector<std::vector<int>> count_, anchors_;
  std::vector<std::vector<std::vector<int>>> children_;
  std::vector<int> anchor_nodes_;
};

// The gang a request places: the replica indices of the pods asked for, the gang's size (those, the bound pods and
// the request's count) and its communication edges.
struct Gang {
  std::vector<int> indices;
  int size = 0;
  std::vector<CommEdge> edges;
};

Gang gang_of(const PlacementRequest& req) {
  Gang g;
  g.indices = req.pod_indices;
  if (static_cast<int>(g.indices.size()) != req.pods) {
    g.indices.resize(req.pods);
    std::iota(g.indices.begin(), g.indices.end(), 0);
  }
  g.size = req.pods + static_cast<int>(req.bound.size());
  for (int i : g.indices) g.size = std::max(g.size, i + 1);
  for (const auto& [i, node] : req.bound) g.size = std::max(g.size, i + 1);
  g.edges = gang_edges(g.size, req.procs_per_pod, req.tensor, req.pipeline);
  return g;
}

// The hops of the placed gang (`chosen`: the nodes of the pods asked for, bound pods where they are) into `r`, and
// its message: the domains used and the same-rail hops.
void describe_gang(PlacementResult& r, const Topology& topo, const PlacementRequest& req, const Gang& gang,
                   const std::vector<int>& chosen) {
  std::vector<int> node_of_pod(gang.size, -1);
  for (const auto& [index, node] : req.bound)
    if (index >= 0 && index < gang.size) node_of_pod[index] = topo.index(node);
  for (int k = 0; k < req.pods; ++k) node_of_pod[gang.indices[k]] = chosen[k];
  GangCost c = gang_cost(topo, node_of_pod, gang.edges);
  r.worst_hops = c.worst_hops;
  r.mean_hops = c.mean_hops;
  std::set<int> units;
  for (int n : node_of_pod)
    if (n >= 0) units.insert(topo.domain(n, 0));
  r.message = std::to_string(units.size()) + " " + topo.level_noun(0) + (units.size() == 1 ? "" : "s") +
              ", same-rail hops worst " + std::to_string(c.worst_hops) + " mean " + fmt_mean(c.mean_hops);
}

// placement.railAware false: SimplePlacement's first fit, with the hops it comes to.
PlacementResult first_fit(const PlacementRequest& req, const std::vector<NodeInfo>& nodes, const Topology& topo,
                          const Gang& gang) {
  PlacementResult r = SimplePlacement().place(req, nodes);
  if (r.ok) {
    std::vector<int> chosen;
    for (const auto& n : r.nodes) chosen.push_back(topo.index(n));
    describe_gang(r, topo, req, gang, chosen);
    r.message = "first fit (placement.railAware false): " + r.message;
  }
  return r;
}

// The rail-aware search: first without the nodes that lost a pod of the job, then (only when some did) with them.
// nullopt when neither fits.
std::optional<PlacementResult> search_placement(const PlacementRequest& req, const std::vector<NodeInfo>& nodes,
                                                const Topology& topo, const Gang& gang) {
  const int max_level = req.hard ? topo.levels() - 1 : topo.levels();
  for (bool avoid : {true, false}) {
    if (!avoid && req.avoided_nodes.empty()) break;
    Search s(topo, nodes, req, avoid);
    auto choice = s.best(max_level, gang.edges, gang.indices, gang.size);
    if (choice.nodes.empty()) continue;
    PlacementResult r;
    r.ok = true;
    for (int n : choice.nodes) r.nodes.push_back(topo.name(n));
    describe_gang(r, topo, req, gang, choice.nodes);
    std::string where = choice.level < topo.levels()
                            ? topo.level_noun(choice.level) + " " + s.domain_name(choice.level, choice.domain)
                            : "whole cluster";
    r.message = "rail-aware: " + where + ", " + r.message;
    if (choice.step >= 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, ", predicted step %.3g s", choice.step);
      r.message += buf;
    }
    if (!avoid) r.message += " (uses a node that lost a pod of the job: nothing else fits)";
    return r;
  }
  return std::nullopt;
}

// What the nodes without room lack (the first short resource of each, e.g. memory, example.com/nic), so that the
// message names the resource to add rather than "resources".
std::string short_resources(const Search& s, const Topology& topo, const std::vector<NodeInfo>& nodes,
                            const PlacementRequest& req) {
  std::set<std::string> short_set;
  for (const NodeInfo& n : nodes)
    if (const int i = topo.index(n.name); i >= 0 && s.why(i) == Why::kNoRoom)
      if (auto name = resource_shortfall(n, req.requests); !name.empty()) short_set.insert(name);
  std::string short_of;
  for (const auto& name : short_set) short_of += (short_of.empty() ? "" : ", ") + name;
  return short_of;
}

// placement.mode hard with enough fitting nodes, but no one widest domain holding the gang: the largest such domain
// and why (up to four of) its other nodes do not fit.
PlacementResult refuse_hard(const Search& s, const Topology& topo, const PlacementRequest& req, const std::string& need,
                            const std::string& short_of) {
  PlacementResult r;
  const int level = topo.levels() - 1;
  const int d = s.largest(level);
  std::string unfit;
  int listed = 0;
  for (int i = 0; i < topo.size() && listed < 4; ++i)
    if (topo.domain(i, level) == d && s.why(i) != Why::kFits) {
      unfit += (listed++ ? ", " : "") + topo.name(i) + " " + why_text(s.why(i), req, short_of);
    }
  r.missing = req.pods - s.count(level, d);
  r.message = need + "; largest " + topo.level_noun(level) + " " + s.domain_name(level, d) + " has " +
              std::to_string(s.count(level, d)) + (unfit.empty() ? "" : " (" + unfit + ")") + "; none bound";
  return r;
}

// Too few fitting nodes: how many fit, and how many of the others fail each check (the excluded ones named).
PlacementResult refuse_short(const Search& s, const Topology& topo, const PlacementRequest& req,
                             std::map<Why, int>& by_why, const std::string& need, const std::string& short_of) {
  PlacementResult r;
  r.missing = std::max(1, req.pods - s.fitting());
  std::string detail;
  for (Why w : {Why::kNotReady, Why::kExcluded, Why::kFiltered, Why::kTainted, Why::kBusy, Why::kNoRoom}) {
    if (!by_why[w]) continue;
    detail += ", " + std::to_string(by_why[w]) + " " + why_text(w, req, short_of);
    if (w == Why::kExcluded) {
      std::string names;
      int listed = 0;
      for (int i = 0; i < topo.size() && listed < 4; ++i)
        if (s.why(i) == Why::kExcluded) names += (listed++ ? ", " : "") + topo.name(i);
      detail += " (" + names + (by_why[w] > listed ? ", ..." : "") + ")";
    }
  }
  r.message = need + "; " + std::to_string(s.fitting()) + " of " + std::to_string(topo.size()) + " nodes fit" + detail +
              "; none bound";
  return r;
}

// Why not: counted with the avoided nodes usable, since they were tried last.
PlacementResult refuse(const PlacementRequest& req, const std::vector<NodeInfo>& nodes, const Topology& topo) {
  Search s(topo, nodes, req, false);
  std::map<Why, int> by_why;
  for (int i = 0; i < topo.size(); ++i) by_why[s.why(i)]++;
  const std::string short_of = by_why[Why::kNoRoom] ? short_resources(s, topo, nodes, req) : std::string();
  const int widest = topo.levels() - 1;
  const std::string need = "needs " + std::to_string(req.pods) + " node" + (req.pods == 1 ? " " : "s ") +
                           need_text(req) +
                           (req.hard ? " in one " + topo.level_noun(widest) + " (placement.mode hard)" : "");
  if (req.hard && s.fitting() >= req.pods) return refuse_hard(s, topo, req, need, short_of);
  return refuse_short(s, topo, req, by_why, need, short_of);
}

}  // namespace

PlacementResult RailAwarePlacement::place(const PlacementRequest& req, const std::vector<NodeInfo>& nodes) {
  PlacementResult r;
  if (req.pods <= 0) {
    r.ok = true;
    return r;
  }
  Topology topo(nodes, req.topology_keys);
  const Gang gang = gang_of(req);
  if (!req.rail_aware) return first_fit(req, nodes, topo, gang);
  if (auto placed = search_placement(req, nodes, topo, gang)) return *placed;
  return refuse(req, nodes, topo);
}

}  // namespace railyard::op::sched
