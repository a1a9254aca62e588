// Token shard files (worker/data/shard.h): header checks and the validating memory map. Bad files are a
// railyard::ConfigError naming the file and offset; a shard that opens must only hold tokens < vocab.
#include <cstdint>

#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = railyard::fuzz::write_scratch("shard.bin", {reinterpret_cast<const char*>(data), size});
  try {
    railyard::worker::ShardHeader h = railyard::worker::read_shard_header(path);
    if (h.file_bytes != size) __builtin_trap();
  } catch (const railyard::Error&) {
  }
  try {
    railyard::worker::MappedShard shard(path, 50257);
    for (size_t i = 0; i < shard.num_tokens(); ++i) {
      if (shard.tokens()[i] >= 50257) __builtin_trap();
    }
  } catch (const railyard::Error&) {
  }
  return 0;
}
