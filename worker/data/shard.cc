#include "worker/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"
#include "common/atomic_file.h"

namespace railyard::worker {

static_assert(std::endian::native == std::endian::little, "llm.c shards are little-endian; so must the host be");

namespace {

std::string where(const std::string& path) { return "shard " + path + ": "; }

// Opens path read-only and returns its fd and size; the caller closes the fd.
int open_readonly(const std::string& path, uint64_t& size_out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError(where(path) + "cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw ConfigError(where(path) + "cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(where(path) + "not a regular file");
  }
  size_out = static_cast<uint64_t>(st.st_size);
  return fd;
}

// Checks a header already in memory against the file size.
ShardHeader check_header(const std::string& path, const int32_t* h, uint64_t file_bytes) {
  ShardHeader out;
  out.magic = h[0];
  out.version = h[1];
  out.file_bytes = file_bytes;
  if (h[0] != kShardMagic) {
    throw ConfigError(where(path) + "bad magic " + std::to_string(h[0]) + " at byte offset 0 (expected " +
                      std::to_string(kShardMagic) + "): not an llm.c token shard");
  }
  if (h[1] != kShardVersion) {
    throw ConfigError(where(path) + "unsupported version " + std::to_string(h[1]) + " at byte offset 4 (expected " +
                      std::to_string(kShardVersion) + ": uint16 tokens)");
  }
  if (h[2] < 0) {
    throw ConfigError(where(path) + "negative token count " + std::to_string(h[2]) + " at byte offset 8");
  }
  out.num_tokens = static_cast<uint64_t>(h[2]);
  const uint64_t expected = kShardHeaderBytes + out.num_tokens * sizeof(uint16_t);
  if (file_bytes < expected) {
    throw ConfigError(where(path) + "token count " + std::to_string(out.num_tokens) + " at byte offset 8 needs " +
                      std::to_string(expected) + " bytes but the file has " + std::to_string(file_bytes) +
                      ": the file is truncated");
  }
  if (file_bytes > expected) {
    throw ConfigError(where(path) + "token count " + std::to_string(out.num_tokens) +
                      " at byte offset 8 accounts for " + std::to_string(expected) + " bytes but the file has " +
                      std::to_string(file_bytes) + ": trailing data from byte offset " + std::to_string(expected));
  }
  return out;
}

std::string short_file(const std::string& path, uint64_t file_bytes) {
  return where(path) + "file has " + std::to_string(file_bytes) + " bytes, shorter than the " +
         std::to_string(kShardHeaderBytes) + "-byte header: the file is truncated";
}

}  // namespace

ShardHeader read_shard_header(const std::string& path) {
  uint64_t size = 0;
  int fd = open_readonly(path, size);
  std::array<int32_t, kShardHeaderInts> h{};
  if (size < kShardHeaderBytes) {
    ::close(fd);
    throw ConfigError(short_file(path, size));
  }
  ssize_t n = ::pread(fd, h.data(), kShardHeaderBytes, 0);
  int e = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(kShardHeaderBytes)) {
    throw ConfigError(where(path) + "cannot read header: " + (n < 0 ? std::strerror(e) : "short read"));
  }
  return check_header(path, h.data(), size);
}

void write_shard(const std::string& path, const uint16_t* tokens, size_t num_tokens) {
  if (num_tokens > static_cast<size_t>(INT32_MAX)) {
    throw Error(where(path) + std::to_string(num_tokens) + " tokens do not fit the int32 count of the header");
  }
  std::array<int32_t, kShardHeaderInts> h{};
  h[0] = kShardMagic;
  h[1] = kShardVersion;
  h[2] = static_cast<int32_t>(num_tokens);
  AtomicFileWriter w(path);
  w.write(h.data(), kShardHeaderBytes);
  if (num_tokens > 0) w.write(tokens, num_tokens * sizeof(uint16_t));
  w.commit();
}

MappedShard::MappedShard(const std::string& path, int vocab_size) : path_(path) {
  if (vocab_size <= 0 || vocab_size > kMaxShardVocab) {
    throw ConfigError(where(path) + "vocab size " + std::to_string(vocab_size) + " is outside 1.." +
                      std::to_string(kMaxShardVocab) + " (tokens are uint16)");
  }
  uint64_t size = 0;
  int fd = open_readonly(path, size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    throw ConfigError(short_file(path, size));
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) throw ConfigError(where(path) + "cannot mmap: " + std::strerror(e));
  map_ = m;
  map_bytes_ = size;
  try {
    ShardHeader h = check_header(path, static_cast<const int32_t*>(m), size);
    tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m) + kShardHeaderBytes);
    num_tokens_ = h.num_tokens;
    // One branch-free pass (vectorises); the slow search for the first offender only runs on failure.
    uint16_t max_token = 0;
    for (size_t i = 0; i < num_tokens_; ++i) max_token = tokens_[i] > max_token ? tokens_[i] : max_token;
    if (static_cast<int>(max_token) >= vocab_size) {
      for (size_t i = 0; i < num_tokens_; ++i) {
        if (static_cast<int>(tokens_[i]) >= vocab_size) {
          throw ConfigError(where(path) + "token " + std::to_string(tokens_[i]) + " at byte offset " +
                            std::to_string(kShardHeaderBytes + i * sizeof(uint16_t)) + " is >= vocab size " +
                            std::to_string(vocab_size));
        }
      }
    }
    // Training reads samples in a shuffled order: tell the kernel not to read ahead sequentially.
    ::madvise(m, size, MADV_RANDOM);
  } catch (...) {
    unmap();
    throw;
  }
}

MappedShard::MappedShard(MappedShard&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      tokens_(std::exchange(o.tokens_, nullptr)),
      num_tokens_(std::exchange(o.num_tokens_, 0)) {}

MappedShard& MappedShard::operator=(MappedShard&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    num_tokens_ = std::exchange(o.num_tokens_, 0);
  }
  return *this;
}

MappedShard::~MappedShard() { unmap(); }

void MappedShard::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  num_tokens_ = 0;
}

}  // namespace railyard::worker
