// All-to-all algorithms over a Communicator, one class per algorithm (as Gloo does): the flat exchange every backend
// implements, and the hierarchical one for rail-optimised clusters (docs/parallel.md "Hierarchical all-to-all").
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace railyard::worker::comm {

// Same contract as Communicator::all_to_all: in and out hold size()*count elements; chunk j of in goes to rank j,
// chunk j of out came from rank j. Collective over the group; in and out must not overlap.
class AllToAll {
 public:
  virtual ~AllToAll() = default;
  virtual void run(const void* in, void* out, size_t count, DType dtype) = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;
};

// One exchange among all ranks of the group: every pair talks directly, inter-node pairs over the network.
class FlatAllToAll : public AllToAll {
 public:
  explicit FlatAllToAll(Communicator& group) : group_(group) {}
  void run(const void* in, void* out, size_t count, DType dtype) override;
  int size() const override { return group_.size(); }
  std::string describe() const override;

 private:
  Communicator& group_;
};

// Ranks [n G, (n+1) G) of the group share node n (G = local_size ranks per node, e.g. GPUs behind one NVLink
// switch); rank n G + h sits on rail h. Two exchanges instead of one:
//   1. within the node (fast links): rank (n, g) sends local rank h the chunks for every node's rank h, so each
//      chunk ends on the rank of its destination's rail (the node-local gather by rail);
//   2. across nodes between the ranks of one rail (rank (n, h) with (m, h) for every m): rank (n, h) sends node m's
//      rail-h rank the G chunks it gathered for it, G times larger messages than the flat scheme's inter-node ones
//      and only same-rail traffic on the network;
//   then the received blocks, ordered (source node, source local rank), are already out's order (the scatter into
//   place is the receive itself).
// Construction is collective over `group` (two split() calls: "<name>-node", "<name>-rail"). local_size must divide
// the group size; local_size 1 or size() degenerate to one flat exchange (still two calls, one of them of size 1).
class HierarchicalAllToAll : public AllToAll {
 public:
  HierarchicalAllToAll(Communicator& group, int local_size);
  void run(const void* in, void* out, size_t count, DType dtype) override;
  int size() const override { return size_; }
  std::string describe() const override;
  int local_size() const { return local_; }
  int nodes() const { return nodes_; }

 private:
  int size_, local_, nodes_, node_, local_rank_;
  std::unique_ptr<Communicator> node_group_, rail_group_;
  std::vector<char> send_, recv_;
};

// "flat" or "hierarchical" (local_size ranks per node; validated against the group size, errors name `flag`).
std::unique_ptr<AllToAll> make_all_to_all(Communicator& group, const std::string& algorithm, int local_size,
                                          const std::string& flag = "--ep-a2a");

}  // namespace railyard::worker::comm
