#include "worker/comm/all_to_all.h"

#include <cstring>

#include "common/error.h"

namespace railyard::worker::comm {

void FlatAllToAll::run(const void* in, void* out, size_t count, DType dtype) {
  group_.all_to_all(in, out, count, dtype);
}

std::string FlatAllToAll::describe() const { return "flat all_to_all over " + std::to_string(group_.size()); }

HierarchicalAllToAll::HierarchicalAllToAll(Communicator& group, int local_size)
    : size_(group.size()), local_(local_size) {
  if (local_size < 1 || size_ % local_size != 0) {
    throw ConfigError("hierarchical all_to_all: " + std::to_string(local_size) +
                      " ranks per node do not divide the group of " + std::to_string(size_) +
                      ": give the number of ranks each node holds");
  }
  nodes_ = size_ / local_;
  node_ = group.rank() / local_;
  local_rank_ = group.rank() % local_;
  std::vector<int> node_ranks, rail_ranks;
  for (int h = 0; h < local_; ++h) node_ranks.push_back(node_ * local_ + h);
  for (int m = 0; m < nodes_; ++m) rail_ranks.push_back(m * local_ + local_rank_);
  node_group_ = group.split(node_ranks, group.name() + "-node");
  rail_group_ = group.split(rail_ranks, group.name() + "-rail");
}

void HierarchicalAllToAll::run(const void* in, void* out, size_t count, DType dtype) {
  const size_t chunk = count * dtype_size(dtype), total = chunk * static_cast<size_t>(size_);
  if (count == 0) return;
  if (send_.size() < total) {
    send_.resize(total);
    recv_.resize(total);
  }
  const char* src = static_cast<const char*>(in);
  // Phase 1 send order [h][m]: to local rank h, the chunks for rank (m, h), m = 0..nodes-1.
  for (int h = 0; h < local_; ++h) {
    for (int m = 0; m < nodes_; ++m) {
      std::memcpy(send_.data() + (static_cast<size_t>(h) * nodes_ + m) * chunk,
                  src + static_cast<size_t>(m * local_ + h) * chunk, chunk);
    }
  }
  node_group_->all_to_all(send_.data(), recv_.data(), count * nodes_, dtype);
  // Received [g][m]: from local rank g, its chunk for rank (m, my rail). Phase 2 sends node m the blocks [m][g].
  for (int m = 0; m < nodes_; ++m) {
    for (int g = 0; g < local_; ++g) {
      std::memcpy(send_.data() + (static_cast<size_t>(m) * local_ + g) * chunk,
                  recv_.data() + (static_cast<size_t>(g) * nodes_ + m) * chunk, chunk);
    }
  }
  // Received [n'][g] = from rank n' G + g: exactly out's order.
  rail_group_->all_to_all(send_.data(), out, count * local_, dtype);
}

std::string HierarchicalAllToAll::describe() const {
  return "hierarchical all_to_all over " + std::to_string(size_) + " = " + std::to_string(nodes_) + " nodes x " +
         std::to_string(local_) + " local ranks";
}

std::unique_ptr<AllToAll> make_all_to_all(Communicator& group, const std::string& algorithm, int local_size,
                                          const std::string& flag) {
  if (algorithm == "flat") return std::make_unique<FlatAllToAll>(group);
  if (algorithm == "hierarchical") {
    if (local_size < 1 || group.size() % local_size != 0) {
      throw ConfigError(flag + " hierarchical: " + std::to_string(local_size) + " ranks per node (--ep-node-size or " +
                        "LOCAL_WORLD_SIZE) must be >= 1 and divide the expert-parallel group of " +
                        std::to_string(group.size()));
    }
    return std::make_unique<HierarchicalAllToAll>(group, local_size);
  }
  throw ConfigError(flag + " " + algorithm + ": must be flat or hierarchical");
}

}  // namespace railyard::worker::comm
