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
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "common/atomic_file.h"
#include "common/error.h"
#include "worker/data/gpt2_bpe.h"
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

  // Takes bytes (the byte tokenizer: token = byte) or tokens.
  template <typename T>
  void push(const T* items, size_t n) {
    while (n > 0) {
      if (!current_) open_next();
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, left_in_shard_));
      tokens_.assign(items, items + k);
      current_->write(tokens_.data(), k * sizeof(uint16_t));
      items += k;
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

// Splits N tokens: the val split is the last floor(N * fraction), refused when that rounds a positive fraction to
// nothing or leaves no training tokens. `unit` names what N counts in the messages.
std::pair<uint64_t, uint64_t> split_sizes(uint64_t total, double fraction, const std::string& unit) {
  const uint64_t val = static_cast<uint64_t>(std::floor(static_cast<double>(total) * fraction));
  const uint64_t train = total - val;
  if (fraction > 0 && val == 0) {
    throw ConfigError("data prepare: --val-fraction " + std::to_string(fraction) + " of " + std::to_string(total) +
                      " " + unit + " leaves no validation tokens: raise it or pass 0");
  }
  if (train == 0) throw ConfigError("data prepare: --val-fraction leaves no training tokens");
  return {train, val};
}

// A stream of uint16 tokens in a staging file: GPT-2 token counts are only known after encoding, and the shard
// headers need them first, so the tokens go here and are copied into shards afterwards (constant memory).
class TokenSpill {
 public:
  explicit TokenSpill(std::string path) : path_(std::move(path)), f_(std::fopen(path_.c_str(), "w+b")) {
    if (f_ == nullptr) throw Error("data prepare: cannot create " + path_ + ": " + std::strerror(errno));
  }
  ~TokenSpill() { std::fclose(f_); }
  TokenSpill(const TokenSpill&) = delete;
  TokenSpill& operator=(const TokenSpill&) = delete;

  void append(const std::vector<uint16_t>& tokens) {
    if (std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f_) != tokens.size()) {
      throw Error("data prepare: cannot write " + path_ + ": " + std::strerror(errno));
    }
    count_ += tokens.size();
  }
  uint64_t count() const { return count_; }

  // Calls sink(const uint16_t*, size_t) over all tokens in order.
  template <typename Sink>
  void replay(Sink&& sink) {
    if (std::fflush(f_) != 0 || std::fseek(f_, 0, SEEK_SET) != 0) {
      throw Error("data prepare: cannot rewind " + path_ + ": " + std::strerror(errno));
    }
    std::vector<uint16_t> buf(1 << 20);
    uint64_t left = count_;
    while (left > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      if (std::fread(buf.data(), sizeof(uint16_t), want, f_) != want) {
        throw Error("data prepare: cannot read back " + path_);
      }
      sink(buf.data(), want);
      left -= want;
    }
  }

 private:
  std::string path_;
  std::FILE* f_;
  uint64_t count_ = 0;
};

// Streams one input file into `chunk` calls of at most 1 MiB; checks that its size is what stat said.
template <typename Chunk>
void read_input(const std::string& in, uint64_t expected_size, Chunk&& chunk) {
  int fd = ::open(in.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError("input " + in + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::vector<unsigned char> buf(1 << 20);
  uint64_t read_here = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError("input " + in + ": read failed: " + std::strerror(errno));
    if (n == 0) break;
    read_here += static_cast<uint64_t>(n);
    if (read_here > expected_size) break;  // reported below
    chunk(buf.data(), static_cast<size_t>(n));
  }
  if (read_here != expected_size) {
    throw ConfigError("input " + in + ": changed while being read (" + std::to_string(expected_size) +
                      " bytes at start, " + std::to_string(read_here) + " read)");
  }
}

// Refuses options no run could use; returns whether the tokenizer is GPT-2's (else the byte tokenizer).
bool check_options(const PrepareOptions& o) {
  if (o.inputs.empty()) throw ConfigError("data prepare: --input is missing: give one or more text files");
  if (o.output_dir.empty()) throw ConfigError("data prepare: --output is missing: give a directory for the shards");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    throw ConfigError("data prepare: --val-fraction " + std::to_string(o.val_fraction) + " must be in [0, 1)");
  }
  if (o.shard_tokens == 0 || o.shard_tokens > static_cast<uint64_t>(INT32_MAX)) {
    throw ConfigError("data prepare: --shard-tokens " + std::to_string(o.shard_tokens) + " must be in 1.." +
                      std::to_string(INT32_MAX) + " (the shard header holds an int32 count)");
  }

  const bool gpt2 = o.tokenizer == "gpt2";
  if (!gpt2 && o.tokenizer != "bytes") {
    throw ConfigError("data prepare: unknown tokenizer '" + o.tokenizer + "' (bytes, gpt2)");
  }
  return gpt2;
}

// The inputs' sizes in bytes as stat reports them (read_input checks them again), in the order given.
struct InputSizes {
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
};

InputSizes input_sizes(const PrepareOptions& o) {
  InputSizes in;
  for (const auto& path : o.inputs) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw ConfigError("input " + path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw ConfigError("input " + path + ": not a regular file");
    in.sizes.push_back(static_cast<uint64_t>(st.st_size));
    in.total += in.sizes.back();
  }
  if (in.total == 0) throw ConfigError("data prepare: the inputs are empty: nothing to tokenize");
  return in;
}

// Creates the output directory; returns the shards already in it, refused unless --force.
std::vector<fs::path> open_output(const PrepareOptions& o, const fs::path& out) {
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
  return existing;
}

// A fresh, empty staging directory (what a previous run with this pid left there goes first).
void create_staging(const PrepareOptions& o, const StagingGuard& staging) {
  std::error_code ec;
  fs::remove_all(staging.dir, ec);
  if (!fs::create_directory(staging.dir, ec) || ec) {
    throw ConfigError("output " + o.output_dir + ": cannot create staging directory: " + ec.message());
  }
}

// An input that is already tokens: an llm.c token shard (its first two ints are the magic and the version), e.g. one
// of llm.c's FineWeb shards fetched by URL. Its tokens are taken as they are, not tokenized again.
bool is_token_shard_input(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::array<int32_t, 2> h{};
  f.read(reinterpret_cast<char*>(h.data()), sizeof h);
  return f.gcount() == static_cast<std::streamsize>(sizeof h) && h[0] == kShardMagic && h[1] == kShardVersion;
}

// The tokens of every input in a spill file, and how many each input came to.
struct SpilledTokens {
  std::unique_ptr<TokenSpill> spill;
  std::vector<uint64_t> doc_tokens;  // GPT-2 text: with its leading <|endoftext|>
};

// Every input into the spill first, then split by tokens: GPT-2 text encoded (each file a document led by
// <|endoftext|>), byte text byte by byte, a token shard's tokens as they are (each below the tokenizer's vocabulary,
// which MappedShard checks, naming the shard and the offending token's offset).
SpilledTokens encode_to_spill(const PrepareOptions& o, const InputSizes& in, const std::vector<bool>& shard,
                              const Gpt2Vocab* vocab, int vocab_size, const StagingGuard& staging) {
  SpilledTokens out;
  out.spill = std::make_unique<TokenSpill>((staging.dir / "tokens.tmp").string());
  TokenSpill& spill = *out.spill;
  std::optional<Gpt2Tokenizer> tokenizer;
  if (vocab != nullptr) tokenizer.emplace(*vocab);
  std::vector<uint16_t> tokens;
  std::string carry;  // bytes of a piece that the next read may extend
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    const uint64_t before = spill.count();
    if (shard[f]) {
      const MappedShard s(o.inputs[f], vocab_size);
      for (size_t i = 0; i < s.num_tokens(); i += size_t{1} << 20) {
        tokens.assign(s.tokens() + i, s.tokens() + std::min(s.num_tokens(), i + (size_t{1} << 20)));
        spill.append(tokens);
      }
    } else if (tokenizer) {
      tokens.assign(1, kGpt2EndOfText);
      carry.clear();
      read_input(o.inputs[f], in.sizes[f], [&](const unsigned char* p, size_t n) {
        carry.append(reinterpret_cast<const char*>(p), n);
        carry.erase(0, tokenizer->encode_prefix(carry, false, tokens));
        spill.append(tokens);
        tokens.clear();
      });
      tokenizer->encode_prefix(carry, true, tokens);
      spill.append(tokens);
    } else {
      read_input(o.inputs[f], in.sizes[f], [&](const unsigned char* p, size_t n) {
        tokens.assign(p, p + n);
        spill.append(tokens);
      });
    }
    out.doc_tokens.push_back(spill.count() - before);
  }
  return out;
}

// The shards written into staging, by split, in order.
struct ShardNames {
  std::vector<std::string> train, val;
};

// Writes the first `train` tokens as train shards and the `val` after them as val shards: from the GPT-2 spill
// (consumed) or, with the byte tokenizer, the inputs read again.
ShardNames write_shards(const PrepareOptions& o, const InputSizes& in, std::unique_ptr<TokenSpill> spill,
                        const StagingGuard& staging, uint64_t train, uint64_t val) {
  SplitWriter train_w("train", staging.dir, train, o.shard_tokens);
  SplitWriter val_w("val", staging.dir, val, o.shard_tokens);
  uint64_t offset = 0;  // tokens consumed so far
  const auto push = [&](const auto* p, size_t len) {
    if (offset < train) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(len, train - offset));
      train_w.push(p, k);
      p += k;
      len -= k;
      offset += k;
    }
    val_w.push(p, len);
    offset += len;
  };
  if (spill) {
    spill->replay(push);
    spill.reset();
  } else {
    for (size_t f = 0; f < o.inputs.size(); ++f) read_input(o.inputs[f], in.sizes[f], push);
  }
  if (train_w.remaining() != 0 || val_w.remaining() != 0) throw Error("data prepare: internal split accounting error");
  return {train_w.names(), val_w.names()};
}

// All shards are complete: swap them in. Old shards that the new set does not overwrite go first, so the
// directory never mixes the two runs' files under loader patterns for longer than this loop.
void swap_in(const PrepareOptions& o, const fs::path& out, const StagingGuard& staging,
             const std::vector<fs::path>& existing, const ShardNames& shards) {
  std::error_code ec;
  std::vector<std::string> names = shards.train;
  names.insert(names.end(), shards.val.begin(), shards.val.end());
  for (const auto& old : existing) {
    if (std::find(names.begin(), names.end(), old.filename().string()) == names.end()) fs::remove(old, ec);
  }
  for (const auto& n : names) {
    fs::rename(staging.dir / n, out / n, ec);
    if (ec) throw Error("output " + o.output_dir + ": cannot move shard " + n + " into place: " + ec.message());
  }
  fsync_directory(out.string());
}

// DIR/prepare.json: the run's options, inputs and shards.
void write_manifest(const PrepareOptions& o, const InputSizes& in, const std::vector<uint64_t>& doc_tokens,
                    const std::vector<bool>& shard, const ShardNames& shards, const PrepareResult& r) {
  const bool gpt2 = r.tokenizer == "gpt2";
  nlohmann::json inputs = nlohmann::json::array();
  for (size_t f = 0; f < o.inputs.size(); ++f) {
    inputs.push_back({{"path", o.inputs[f]}, {"bytes", in.sizes[f]}});
    if (shard[f]) inputs.back()["format"] = "token shard";             // its tokens taken as they are
    if (!doc_tokens.empty()) inputs.back()["tokens"] = doc_tokens[f];  // GPT-2 text: with its leading <|endoftext|>
    if (f < o.sources.size()) inputs.back()["source"] = o.sources[f];
    if (f < o.sha256.size()) inputs.back()["sha256"] = o.sha256[f];
  }
  nlohmann::json manifest = {
      {"tokenizer", o.tokenizer},       {"vocab_size", r.vocab_size},     {"inputs", inputs},
      {"total_tokens", r.total_tokens}, {"val_fraction", o.val_fraction}, {"split_offset", r.train_tokens},
      {"shard_tokens", o.shard_tokens}, {"train_shards", shards.train},   {"val_shards", shards.val}};
  if (gpt2) {
    manifest["eot_token"] = kGpt2EndOfText;
    manifest["documents"] = "one per input text file, each starting with eot_token";
  }
  write_file_atomic(r.manifest, manifest.dump(2) + "\n");
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& o) {
  const bool gpt2 = check_options(o);
  const InputSizes in = input_sizes(o);
  std::vector<bool> shard;
  for (const auto& path : o.inputs) shard.push_back(is_token_shard_input(path));
  const bool any_shard = std::find(shard.begin(), shard.end(), true) != shard.end();
  const bool any_text = std::find(shard.begin(), shard.end(), false) != shard.end();
  // Byte text alone knows its token count now; GPT-2 text and token shards after the spill (the split is checked
  // then). The vocabulary is read before the output is touched, so a missing file leaves nothing behind; token
  // shards alone need none.
  const bool spilled = gpt2 || any_shard;
  uint64_t train = 0, val = 0;
  if (!spilled) std::tie(train, val) = split_sizes(in.total, o.val_fraction, "bytes");
  std::optional<Gpt2Vocab> vocab;
  if (gpt2 && any_text) vocab = Gpt2Vocab::load(o.vocab_dir.empty() ? default_gpt2_vocab_dir() : o.vocab_dir);
  const int vocab_size = gpt2 ? kGpt2VocabSize : kByteVocabSize;

  const fs::path out(o.output_dir);
  const std::vector<fs::path> existing = open_output(o, out);
  StagingGuard staging{out / (".railyard-prepare." + std::to_string(::getpid()))};
  create_staging(o, staging);
  uint64_t total = in.total;
  SpilledTokens encoded;
  if (spilled) {
    encoded = encode_to_spill(o, in, shard, vocab ? &*vocab : nullptr, vocab_size, staging);
    total = encoded.spill->count();
    if (total == 0) throw ConfigError("data prepare: the inputs hold no tokens: nothing to split");
    std::tie(train, val) = split_sizes(total, o.val_fraction, "tokens");
  }
  const ShardNames shards = write_shards(o, in, std::move(encoded.spill), staging, train, val);

  PrepareResult r;
  r.tokenizer = o.tokenizer;
  r.vocab_size = vocab_size;
  r.total_tokens = total;
  r.train_tokens = train;
  r.val_tokens = val;
  swap_in(o, out, staging, existing, shards);
  for (const auto& n : shards.train) r.train_shards.push_back((out / n).string());
  for (const auto& n : shards.val) r.val_shards.push_back((out / n).string());
  r.manifest = (out / "prepare.json").string();
  write_manifest(o, in, encoded.doc_tokens, shard, shards, r);
  return r;
}

}  // namespace railyard::worker
