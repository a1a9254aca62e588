#include "operator/scheduler/topology.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "common/wellknown.h"
#include "operator/scheduler/nccl_env.h"

namespace railyard::op::sched {

namespace {

// Per-GPU NVLink and per-rail NIC bandwidth in GB/s by GPU type (unidirectional, nominal): what a ring step can move
// in the best case. Unknown types get PCIe-class NVLink and a 200 Gb/s NIC.
struct GpuLinks {
  double nvlink, nic;
};
GpuLinks links_for(const std::string& gpu_type) {
  std::string t = gpu_type;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  auto starts = [&](const char* p) { return t.rfind(p, 0) == 0; };
  if (starts("gb200") || starts("b200") || starts("b100")) return {900, 100};
  if (starts("h100") || starts("h200") || starts("h800") || starts("gh200")) return {450, 50};
  if (starts("a100") || starts("a800")) return {300, 25};
  return {32, 25};
}

// Oversubscription of the switch tier a path climbs to: rails and leaves non-blocking, spines 2:1, beyond 4:1.
double oversubscription(int tier) {
  if (tier <= 2) return 1.0;
  return tier == 3 ? 2.0 : 4.0;
}

}  // namespace

Topology::Topology(const std::vector<NodeInfo>& nodes, std::vector<std::string> keys) : keys_(std::move(keys)) {
  if (keys_.empty()) keys_ = {wellknown::kUnitLabel, wellknown::kLeafLabel, wellknown::kSpineLabel};
  const int n = static_cast<int>(nodes.size());
  const int levels = static_cast<int>(keys_.size());
  names_.reserve(n);
  domain_.assign(levels, std::vector<int>(n, 0));
  domain_names_.assign(levels, {});
  std::vector<std::map<std::string, int>> ids(levels);
  for (int i = 0; i < n; ++i) {
    const NodeInfo& node = nodes[i];
    names_.push_back(node.name);
    by_name_[node.name] = i;
    // Missing labels: the narrowest level defaults to the node itself, a middle level to the domain below it (a unit
    // without a leaf label is its own leaf), the widest to one shared domain. Identities are qualified by the wider
    // domains, so "u0" under two different leaves are two units.
    std::vector<std::string> value(levels), display(levels);
    for (int l = 0; l < levels; ++l) {
      auto it = node.labels.find(keys_[l]);
      if (it != node.labels.end() && !it->second.empty()) {
        value[l] = "=" + it->second;
        display[l] = it->second;
      } else if (l == 0) {
        value[l] = "#" + node.name;
        display[l] = node.name;
      } else if (l + 1 == levels) {
        value[l] = "*";
        display[l] = "(default " + level_noun(l) + ")";
      } else {
        value[l] = value[l - 1];
        display[l] = display[l - 1];
      }
    }
    std::string path;
    for (int l = levels - 1; l >= 0; --l) {
      path += "/" + value[l];
      auto [it, fresh] = ids[l].emplace(path, static_cast<int>(domain_names_[l].size()));
      if (fresh) domain_names_[l].push_back(display[l]);
      domain_[l][i] = it->second;
    }
    rails_.push_back(node_rails(node));
    auto gt = node.labels.find(wellknown::kGpuTypeLabel);
    GpuLinks links = links_for(gt == node.labels.end() ? "" : gt->second);
    nvlink_gbps_.push_back(links.nvlink);
    nic_gbps_.push_back(links.nic);
  }
}

int Topology::index(const std::string& node_name) const {
  auto it = by_name_.find(node_name);
  return it == by_name_.end() ? -1 : it->second;
}

std::string Topology::level_noun(int level) const {
  const std::string& k = keys_[level];
  if (k == wellknown::kUnitLabel) return "unit";
  if (k == wellknown::kLeafLabel) return "leaf";
  if (k == wellknown::kSpineLabel) return "spine";
  return k;
}

int Topology::tier(int a, int b) const {
  if (a == b) return 0;
  for (int l = 0; l < levels(); ++l)
    if (domain_[l][a] == domain_[l][b]) return l + 1;
  return levels() + 1;
}

Link Topology::same_rail(int a, int b) const {
  const int t = tier(a, b);
  if (t == 0) return {0, nvlink_gbps_[a], true};
  return {hops_for_tier(t), std::min(nic_gbps_[a], nic_gbps_[b]) / oversubscription(t), false};
}

Link Topology::cross_rail(int a, int b) const {
  // Rail switches only connect GPUs of one index: a different rail is reached through the next tier up (no PXN
  // forwarding over NVLink assumed), so even two nodes of one unit are a leaf's distance apart.
  const int t = tier(a, b);
  if (t == 0) return {0, nvlink_gbps_[a], true};
  const int up = std::max(t, 2);
  return {hops_for_tier(up), std::min(nic_gbps_[a], nic_gbps_[b]) / oversubscription(up), false};
}

}  // namespace railyard::op::sched
