#include "worker/comm/communicator.h"

#include <stdexcept>

namespace railyard::worker::comm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "f32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kInt32:
      return "i32";
    case DType::kInt64:
      return "i64";
  }
  return "?";
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ranks[i]);
  }
  s += ']';
  return s;
}

int split_index(const std::vector<int>& ranks, int rank, int size, const std::string& where) {
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      throw std::invalid_argument(where + ": ranks must be ascending, distinct and in [0, " + std::to_string(size) +
                                  "), got " + rank_list(ranks));
    }
    if (ranks[i] == rank) index = static_cast<int>(i);
  }
  if (index < 0) {
    throw std::invalid_argument(where + ": ranks " + rank_list(ranks) + " do not contain this rank " +
                                std::to_string(rank));
  }
  return index;
}

std::unique_ptr<Communicator> Communicator::dup(const std::string& name) {
  std::vector<int> all(static_cast<size_t>(size()));
  for (int i = 0; i < size(); ++i) all[static_cast<size_t>(i)] = i;
  return split(all, name);
}

}  // namespace railyard::worker::comm
