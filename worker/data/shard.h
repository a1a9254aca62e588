// llm.c-compatible token shards: a header of 256 int32 (magic 20240520, version 1, token count, rest zero)
// followed by `count` uint16 tokens, little-endian. Files written by llm.c's dev/data scripts load here unchanged
// and ours load in llm.c.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace railyard::worker {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);
// uint16 tokens cap the vocabulary.
inline constexpr int kMaxShardVocab = 65536;

struct ShardHeader {
  int32_t magic = 0;
  int32_t version = 0;
  uint64_t num_tokens = 0;
  uint64_t file_bytes = 0;
};

// Reads and checks the header only (magic, version, size consistency); throws railyard::ConfigError naming the
// file and byte offset of the first problem.
ShardHeader read_shard_header(const std::string& path);

// Writes a shard atomically (temp file in the same directory, fsync, rename). Throws railyard::Error.
void write_shard(const std::string& path, const uint16_t* tokens, size_t num_tokens);

// A read-only memory-mapped shard, validated once on open: header, size, and every token < vocab_size.
// Move-only; unmaps on destruction.
class MappedShard {
 public:
  MappedShard(const std::string& path, int vocab_size);
  MappedShard(MappedShard&& other) noexcept;
  MappedShard& operator=(MappedShard&& other) noexcept;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;
  ~MappedShard();

  const std::string& path() const { return path_; }
  const uint16_t* tokens() const { return tokens_; }
  size_t num_tokens() const { return num_tokens_; }

 private:
  void unmap();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  size_t num_tokens_ = 0;
};

}  // namespace railyard::worker
