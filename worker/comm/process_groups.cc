#include "worker/comm/process_groups.h"

#include "common/error.h"

namespace railyard::worker::comm {
void validate_layout(const Layout& l, int world_size) {
  for (auto [field, v] : {std::pair{"dp", l.dp}, std::pair{"tp", l.tp}, std::pair{"pp", l.pp}}) {
    if (v < 1) throw ConfigError(std::string("layout.") + field + " = " + std::to_string(v) + ": must be >= 1");
  }
  if (l.world() != world_size) {
    throw ConfigError("layout dp*tp*pp = " + std::to_string(l.world()) + " but WORLD_SIZE = " +
                      std::to_string(world_size) + ": make the parallel degrees multiply to the number of ranks");
  }
}

int rank_of(const Layout& l, const Coord& c) { return c.tp + l.tp * (c.dp + l.dp * c.pp); }

Coord coord_of(const Layout& l, int rank) {
  Coord c;
  c.tp = rank % l.tp;
  c.dp = (rank / l.tp) % l.dp;
  c.pp = rank / (l.tp * l.dp);
  return c;
}

std::vector<int> tp_group(const Layout& l, int rank) {
  Coord c = coord_of(l, rank);
  std::vector<int> out;
  for (c.tp = 0; c.tp < l.tp; ++c.tp) out.push_back(rank_of(l, c));
  return out;
}

std::vector<int> dp_group(const Layout& l, int rank) {
  Coord c = coord_of(l, rank);
  std::vector<int> out;
  for (c.dp = 0; c.dp < l.dp; ++c.dp) out.push_back(rank_of(l, c));
  return out;
}

std::vector<int> pp_group(const Layout& l, int rank) {
  Coord c = coord_of(l, rank);
  std::vector<int> out;
  for (c.pp = 0; c.pp < l.pp; ++c.pp) out.push_back(rank_of(l, c));
  return out;
}

std::vector<int> embedding_group(const Layout& l, int rank) {
  Coord c = coord_of(l, rank);
  if (c.pp != 0 && c.pp != l.pp - 1) return {};
  if (l.pp == 1) return {rank};
  c.pp = 0;
  int first = rank_of(l, c);
  c.pp = l.pp - 1;
  return {first, rank_of(l, c)};
}

ProcessGroups::ProcessGroups(std::unique_ptr<Communicator> world, const Layout& layout)
    : layout_(layout), owned_world_(std::move(world)), world_(owned_world_.get()) {
  build();
}

ProcessGroups::ProcessGroups(Communicator& world, const Layout& layout) : layout_(layout), world_(&world) { build(); }

void ProcessGroups::build() {
  validate_layout(layout_, world_->size());
  const int r = world_->rank();
  coord_ = coord_of(layout_, r);
  tp_ = world_->split(tp_group(layout_, r), "tp");
  dp_ = world_->split(dp_group(layout_, r), "dp");
  pp_ = world_->split(pp_group(layout_, r), "pp");
  // Middle stages take part in the split call with a group of their own (every world rank must make the same
  // sequence of split calls) and drop it.
  auto emb = embedding_group(layout_, r);
  auto group = world_->split(emb.empty() ? std::vector<int>{r} : emb, "embedding");
  if (!emb.empty()) embedding_ = std::move(group);
}

std::string ProcessGroups::describe() const {
  const int r = world_->rank();
  std::string s = "rank " + std::to_string(r) + "/" + std::to_string(world_->size());
  s += " dp=" + std::to_string(coord_.dp) + "/" + std::to_string(layout_.dp);
  s += " tp=" + std::to_string(coord_.tp) + "/" + std::to_string(layout_.tp);
  s += " pp=" + std::to_string(coord_.pp) + "/" + std::to_string(layout_.pp);
  s += " tp-group " + rank_list(tp_group(layout_, r));
  s += " dp-group " + rank_list(dp_group(layout_, r));
  s += " pp-group " + rank_list(pp_group(layout_, r));
  return s;
}

void ProcessGroups::abort() {
  for (auto* c : {tp_.get(), dp_.get(), pp_.get(), embedding_.get(), world_}) {
    if (c) c->abort();
  }
}

}  // namespace railyard::worker::comm
