// Process groups from a rank grid. rank = tp + T*(dp + D*pp): tensor-parallel peers are adjacent ranks (they share a
// node and the fastest links), data-parallel peers next, pipeline stages outermost.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace railyard::worker::comm {

struct Layout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int world() const { return dp * tp * pp; }
  bool operator==(const Layout&) const = default;
};

struct Coord {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  bool operator==(const Coord&) const = default;
};

// Throws railyard::ConfigError naming the field: "layout.tp = 0: must be >= 1", "layout dp*tp*pp = 6 but
// WORLD_SIZE = 8".
void validate_layout(const Layout& layout, int world_size);
int rank_of(const Layout& layout, const Coord& coord);
Coord coord_of(const Layout& layout, int rank);
// Global ranks of the groups `rank` belongs to, ascending.
std::vector<int> tp_group(const Layout& layout, int rank);
std::vector<int> dp_group(const Layout& layout, int rank);
std::vector<int> pp_group(const Layout& layout, int rank);
// First and last pipeline stage of rank's (dp, tp) column (one rank when pp == 1); empty for middle stages.
std::vector<int> embedding_group(const Layout& layout, int rank);

class ProcessGroups {
 public:
  // Collective over `world`: every rank builds its tp, dp, pp and embedding communicators (in that order).
  ProcessGroups(std::unique_ptr<Communicator> world, const Layout& layout);
  // The same over a world owned elsewhere (e.g. run_local_world's), which must outlive this object.
  ProcessGroups(Communicator& world, const Layout& layout);

  Communicator& world() { return *world_; }
  Communicator& tp() { return *tp_; }
  Communicator& dp() { return *dp_; }
  Communicator& pp() { return *pp_; }
  // The group of the first and last pipeline stage (tied embeddings); nullptr on middle stages.
  Communicator* embedding() { return embedding_.get(); }

  const Layout& layout() const { return layout_; }
  const Coord& coord() const { return coord_; }
  int rank() const { return world_->rank(); }
  bool first_stage() const { return coord_.pp == 0; }
  bool last_stage() const { return coord_.pp == layout_.pp - 1; }

  // One line for logs: "rank 5/8 dp=1/2 tp=1/2 pp=1/2 tp-group [4,5] dp-group [5,7] pp-group [1,5]".
  std::string describe() const;

  // Aborts every group (after a CommError on any of them the generation is over).
  void abort();

 private:
  void build();

  Layout layout_;
  Coord coord_;
  std::unique_ptr<Communicator> owned_world_;
  Communicator* world_;
  std::unique_ptr<Communicator> tp_, dp_, pp_, embedding_;
};

}  // namespace railyard::worker::comm
