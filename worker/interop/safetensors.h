// The safetensors file format (Hugging Face's; https://github.com/huggingface/safetensors, "Format"), written:
//   8 bytes   little-endian uint64 N: the header's length
//   N bytes   JSON: {"__metadata__": {string: string}, NAME: {"dtype": "F32", "shape": [...],
//             "data_offsets": [begin, end]}, ...}, padded with spaces so that the data starts 8-byte aligned
//   rest      the tensors' bytes, row-major little-endian, each at [begin, end) of this part, in header order
// Only F32 here: what our trainer holds.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace railyard::worker {

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;  // product(shape) values, row-major
};

// Writes atomically (temp file, fsync, rename). Throws railyard::Error naming the file; a tensor whose data does not
// match its shape, or a repeated name, is refused before anything is written.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace railyard::worker
