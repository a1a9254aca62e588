// The network as the scheduler sees it: nodes grouped into nested switch domains read from node labels, and a
// hop/bandwidth distance between any two nodes. See docs/scheduler.md for the labels and the model.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "common/wellknown.h"
#include "operator/scheduler/nccl_env.h"
#include "operator/scheduler/placement.h"

namespace railyard::op::sched {

// One path between a GPU of one node and a GPU of another.
struct Link {
  int hops = 0;     // switch traversals (0: NVLink inside the node)
  double gbps = 0;  // GB/s one GPU can push on this path (model, see docs/scheduler.md)
  bool nvlink = false;
};

// Switch hops between two nodes whose narrowest shared domain is at `tier` (0: same node, 1: same unit, 2: same
// leaf, ...): a message climbs tier-1 switch levels above the rail switch and back down, 2*tier-1 switches.
inline int hops_for_tier(int tier) { return tier <= 0 ? 0 : 2 * tier - 1; }

class Topology {
 public:
  // `keys` are node labels from the narrowest to the widest domain (empty: unit, leaf, spine).
  explicit Topology(const std::vector<NodeInfo>& nodes, std::vector<std::string> keys = {});

  int size() const { return static_cast<int>(names_.size()); }
  int levels() const { return static_cast<int>(keys_.size()); }
  const std::vector<std::string>& keys() const { return keys_; }
  const std::string& name(int node) const { return names_[node]; }
  int index(const std::string& node_name) const;  // -1 when unknown
  // Dense id of the node's domain at `level` (0 = narrowest key); ids of different levels are unrelated.
  int domain(int node, int level) const { return domain_[level][node]; }
  int domain_count(int level) const { return static_cast<int>(domain_names_[level].size()); }
  const std::string& domain_name(int level, int id) const { return domain_names_[level][id]; }
  // What the domains of a level are called in messages ("unit", "leaf", "spine", or the label key).
  std::string level_noun(int level) const;
  // 0: same node; k in 1..levels(): the narrowest level whose domain both share; levels()+1: none.
  int tier(int a, int b) const;
  // Traffic between GPUs of the same index (the same rail), and between GPUs on different rails.
  Link same_rail(int a, int b) const;
  Link cross_rail(int a, int b) const;
  int rails(int node) const { return rails_[node]; }

 private:
  std::vector<std::string> keys_, names_;
  std::unordered_map<std::string, int> by_name_;
  std::vector<std::vector<int>> domain_;  // [level][node]
  std::vector<std::vector<std::string>> domain_names_;
  std::vector<int> rails_;
  std::vector<double> nvlink_gbps_, nic_gbps_;
};

}  // namespace railyard::op::sched
