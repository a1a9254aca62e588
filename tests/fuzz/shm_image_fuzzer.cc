// The shared-memory tier's image parser (checkpoint/shm_store.cc ShmStore::read_image): the bytes of a segment that
// another process wrote (the worker's put, or a peer copy received over the network) - header, metadata JSON, data.
// The header and contents carry CRC32Cs, so random bytes would stop at the checksum: input byte 0 chooses whether
// this target re-seals the image first (bit 0, ShmStore::seal_image) and whether the contents' CRC is checked
// (bit 1), so the fuzzer reaches the size checks, the metadata and the slice copies. A rejected image is a nullopt
// with a reason naming the segment; anything else (a read or write out of bounds, a throw) is a finding.
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/shm_store.h"

namespace {

namespace ckpt = railyard::ckpt;

// What a restoring rank asks for: the seed's tensors, one of them only in part (a box inside the shape).
struct Targets {
  std::vector<float> a = std::vector<float>(32);
  std::vector<float> b = std::vector<float>(4);
  std::vector<ckpt::LoadTarget> list() {
    return {{"a", ckpt::DType::F32, {{0, 0}, {4, 8}}, a.data()}, {"b", ckpt::DType::F32, {{2}, {4}}, b.data()}};
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  // A copy: the parser reads the image as it lies, seal_image writes the checksums into it.
  std::vector<unsigned char> image(data + 1, data + size);
  if ((flags & 1) != 0) ckpt::ShmStore::seal_image(image.data(), image.size());
  Targets t;
  nlohmann::json state;
  std::string why;
  auto step = ckpt::ShmStore::read_image("/fuzz", image.data(), image.size(), t.list(), &state, &why,
                                         /*verify=*/(flags & 2) != 0);
  if (!step && why.rfind("shared memory /fuzz: ", 0) != 0) __builtin_trap();  // every refusal names the segment
  return 0;
}
