#include "worker/data/prepare.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/atomic_file.h"
#include "worker/data/shard.h"
#include "worker/data/tokenizer.h"

namespace fs = std::filesystem;

namespace railyard::worker {

namespace {

std::string shard_name(const std::string& split, size_t index) {
  std::array<char, 32> buf{};
  std::snprintf(buf.data(), buf.size(), "%s_%06zu.bin", split.c_str(), index);
  return buf.data();
}

bool is_shard_name(const std::string& name) {
  const bool prefix = name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0;
  return prefix && name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0;
}

// Writes one split as consecutive shards. Every shard's token count is known before its first byte is written
// (the split's size is known up front), so the header goes out first and tokens stream after it.
class SplitWriter {
 public:
  SplitWriter(std::string split, fs::path staging, uint64_t total, uint64_t shard_tokens)
      : split_(std::move(split)), staging_(std::move(staging)), remaining_(total), shard_tokens_(shard_tokens) {}

  void push(const unsigned char* bytes, size_t n) {
    while (n > 0) {
      if (!current_) open_next();
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, left_in_shard_));
      tokens_.resize(k);
      for (size_t i = 0; i < k; ++i) tokens_[i] = bytes[i];  // the byte tokenizer: token = byte
      current_->write(tokens_.data(), k * sizeof(uint16_t));
      bytes += k;
      n -= k;
      left_in_shard_ -= k;
      remaining_ -= k;
      if (left_in_shard_ == 0) {
        current_->commit();
        current_.reset();
      }
    }
  }

  // Names of the shards written, in order.
  const std::vector<std::string>& names() const { return names_; }
  uint64_t remaining() const { return remaining_; }

 private:
  void open_next() {
    const std::string name = shard_name(split_, names_.size());
    const uint64_t count = std::min(shard_tokens_, remaining_);
    current_ = std::make_unique<AtomicFileWriter>((staging_ / name).string());
    std::array<int32_t, kShardHeaderInts> h{};
    h[0] = kShardMagic;
    h[1] = kShardVersion;
    h[2] = static_cast<int32_t>(count);
    current_->write(h.data(), kShardHeaderBytes);
    left_in_shard_ = count;
    names_.push_back(name);
  }

  std::string split_;
  fs::path staging_;
  uint64_t remaining_;
  uint64_t shard_tokens_;
  uint64_t left_in_shard_ = 0;
  std::unique_ptr<AtomicFileWriter> current_;
  std::vector<std::string> names_;
  std::vector<uint16_t> tokens_;
};

// Removes the staging directory on every exit path.
struct StagingGuard {
  fs::path dir;
  ~StagingGuard() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& o) {
  if (o.inputs.empty()) throw ConfigError("data prepare: --input is missing: give one or more text files");
  if (o.output_dir.empty()) throw ConfigError("data prepare: --output is missing: give a directory for the shards");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    throw ConfigError("data prepare: --val-fraction " + std::to_string(o.val_fraction) + " must be in [0, 1)");
  }
  if (o.shard_tokens == 0 || o.shard_tokens > static_cast<uint64_t>(INT32_MAX)) {
    throw ConfigError("data prepare: --shard-tokens " + std::to_string(o.shard_tokens) + " must be in 1.." +
                      std::to_string(INT32_MAX) + " (the shard header holds an int32 count)");
  }

  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const auto& in : o.inputs) {
    struct stat st {};
    if (::stat(in.c_str(), &st) != 0) throw ConfigError("input " + in + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw ConfigError("input " + in + ": not a regular file");
    sizes.push_back(static_cast<uint64_t>(st.st_size));
    total += sizes.back();
  }
  if (total == 0) throw ConfigError("data prepare: the inputs are empty: nothing to tokenize");
  const uint64_t val = static_cast<uint64_t>(std::floor(static_cast<double>(total) * o.val_fraction));
  const uint64_t train = total - val;
  if (o.val_fraction > 0 && val == 0) {
    throw ConfigError("data prepare: --val-fraction " + std::to_string(o.val_fraction) + " of " +
                      std::to_string(total) + " bytes leaves no validation tokens: raise it or pass 0");
  }
  if (train == 0) throw ConfigError("data prepare: --val-fraction leaves no training tokens");

  const fs::path out(o.output_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) {
    throw ConfigError("output " + o.output_dir +
                      ": cannot create directory: " + (ec ? ec.message() : "not a directory"));
  }
  std::vector<fs::path> existing;
  for (const auto& e : fs::directory_iterator(out)) {
    if (is_shard_name(e.path().filename().string())) existing.push_back(e.path());
  }
  if (!existing.empty() && !o.force) {
    throw ConfigError("output " + o.output_dir + " already holds shards (e.g. " + existing.front().filename().string() +
                      "): pass --force to replace them or choose another directory");
  }

  StagingGuard staging{out / (".railyard-prepare." + std::to_string(::getpid()))};
  fs::remove_all(staging.dir, ec);
  if (!fs::create_directory(staging.dir, ec) || ec) {
    throw ConfigError("output " + o.output_dir + ": cannot create staging directory: " + ec.message());
  }
  SplitWriter train_w("train", staging.dir, train, o.shard_tokens);
  SplitWriter val_w("val", staging.dir, val, o.shard_tokens);

  uint64_t offset = 0;  // bytes of the concatenated input consumed so far
  std::vector<unsigned char> buf(1 << 20);
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    const std::string& in = o.inputs[f];
    int fd = ::open(in.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw ConfigError("input " + in + ": " + std::strerror(errno));
    uint64_t read_here = 0;
    for (;;) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int e = errno;
        ::close(fd);
        throw ConfigError("input " + in + ": read failed: " + std::strerror(e));
      }
      if (n == 0) break;
      size_t len = static_cast<size_t>(n);
      read_here += len;
      if (read_here > sizes[f]) break;  // reported below
      const unsigned char* p = buf.data();
      if (offset < train) {
        const size_t k = static_cast<size_t>(std::min<uint64_t>(len, train - offset));
        train_w.push(p, k);
        p += k;
        len -= k;
        offset += k;
      }
      val_w.push(p, len);
      offset += len;
    }
    ::close(fd);
    if (read_here != sizes[f]) {
      throw ConfigError("input " + in + ": changed while being read (" + std::to_string(sizes[f]) +
                        " bytes at start, " + std::to_string(read_here) + " read)");
    }
  }
  if (train_w.remaining() != 0 || val_w.remaining() != 0) throw Error("data prepare: internal split accounting error");

  // All shards are complete: swap them in. Old shards that the new set does not overwrite go first, so the
  // directory never mixes the two runs' files under loader patterns for longer than this loop.
  PrepareResult r;
  r.total_tokens = total;
  r.train_tokens = train;
  r.val_tokens = val;
  std::vector<std::string> names = train_w.names();
  names.insert(names.end(), val_w.names().begin(), val_w.names().end());
  for (const auto& old : existing) {
    if (std::find(names.begin(), names.end(), old.filename().string()) == names.end()) fs::remove(old, ec);
  }
  for (const auto& n : names) {
    fs::rename(staging.dir / n, out / n, ec);
    if (ec) throw Error("output " + o.output_dir + ": cannot move shard " + n + " into place: " + ec.message());
  }
  fsync_directory(out.string());
  for (const auto& n : train_w.names()) r.train_shards.push_back((out / n).string());
  for (const auto& n : val_w.names()) r.val_shards.push_back((out / n).string());

  nlohmann::json inputs = nlohmann::json::array();
  for (size_t f = 0; f < o.inputs.size(); ++f) inputs.push_back({{"path", o.inputs[f]}, {"bytes", sizes[f]}});
  nlohmann::json manifest = {
      {"tokenizer", "bytes"},           {"vocab_size", kByteVocabSize},    {"inputs", inputs},
      {"total_tokens", total},          {"val_fraction", o.val_fraction},  {"split_offset", train},
      {"shard_tokens", o.shard_tokens}, {"train_shards", train_w.names()}, {"val_shards", val_w.names()}};
  r.manifest = (out / "prepare.json").string();
  write_file_atomic(r.manifest, manifest.dump(2) + "\n");
  return r;
}

}  // namespace railyard::worker
