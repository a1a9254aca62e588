#include "worker/comm/communicator.h"

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

std::unique_ptr<Communicator> Communicator::dup(const std::string& name) {
  std::vector<int> all(static_cast<size_t>(size()));
  for (int i = 0; i < size(); ++i) all[static_cast<size_t>(i)] = i;
  return split(all, name);
}

}  // namespace railyard::worker::comm
