#include "worker/data/data_loader.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "worker/data/permutation.h"

namespace railyard::worker {

namespace {

// Domain tags keep the shard-order and sample-order streams independent even for equal (seed, epoch).
constexpr uint64_t kShardOrderTag = 0x5348415244ULL;   // "SHARD"
constexpr uint64_t kSampleOrderTag = 0x53414d504cULL;  // "SAMPL"

template <typename T>
void get_field(const nlohmann::json& j, const char* name, T& out) {
  auto it = j.find(name);
  if (it == j.end()) {
    throw ConfigError(std::string("loader state: missing field '") + name + "' (the checkpoint is incomplete)");
  }
  try {
    out = it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ConfigError(std::string("loader state: field '") + name + "' has the wrong type: " + it->dump());
  }
}

}  // namespace

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"seed", s.seed},   {"seq_len", s.seq_len},       {"shuffle", s.shuffle},
                     {"epoch", s.epoch}, {"position", s.position},     {"shard_index", s.shard_index},
                     {"steps", s.steps}, {"num_shards", s.num_shards}, {"total_tokens", s.total_tokens}};
}

void from_json(const nlohmann::json& j, LoaderState& s) {
  if (!j.is_object()) throw ConfigError("loader state: expected a JSON object, got " + j.dump());
  get_field(j, "seed", s.seed);
  get_field(j, "seq_len", s.seq_len);
  get_field(j, "shuffle", s.shuffle);
  get_field(j, "epoch", s.epoch);
  get_field(j, "position", s.position);
  get_field(j, "shard_index", s.shard_index);
  get_field(j, "steps", s.steps);
  get_field(j, "num_shards", s.num_shards);
  get_field(j, "total_tokens", s.total_tokens);
}

std::string shard_glob(const std::string& pattern_or_dir, const std::string& dir_glob) {
  std::error_code ec;
  if (!pattern_or_dir.empty() && std::filesystem::is_directory(pattern_or_dir, ec))
    return (std::filesystem::path(pattern_or_dir) / dir_glob).string();
  return pattern_or_dir;
}

std::string default_val_glob(const std::string& train_pattern_or_dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(train_pattern_or_dir, ec))
    return (std::filesystem::path(train_pattern_or_dir) / "val_*.bin").string();
  const std::filesystem::path parent = std::filesystem::path(train_pattern_or_dir).parent_path();
  return parent.empty() ? std::string("val_*.bin") : (parent / "val_*.bin").string();
}

std::vector<std::string> expand_shard_pattern(const std::string& pattern_or_dir) {
  if (pattern_or_dir.empty())
    throw ConfigError("data path is empty: give a directory or a glob such as DIR/train_*.bin");
  const std::string pattern = shard_glob(pattern_or_dir);
  glob_t g{};
  int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    std::error_code ec;
    for (size_t i = 0; i < g.gl_pathc; ++i)
      if (!std::filesystem::is_directory(g.gl_pathv[i], ec)) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) {
    throw ConfigError("data path " + pattern_or_dir + ": no shard matches " + pattern +
                      " (create shards with `railyard data prepare`)");
  }
  if (rc != 0) throw ConfigError("data path " + pattern_or_dir + ": cannot read " + pattern);
  std::sort(out.begin(), out.end());
  return out;
}

DataLoader::DataLoader(const std::string& pattern_or_dir, int B, int T, int rank, int world, uint64_t seed,
                       int vocab_size, bool shuffle)
    : B_(B), T_(T), rank_(rank), world_(world), seed_(seed), shuffle_(shuffle) {
  if (B <= 0) throw ConfigError("data loader: batch size B=" + std::to_string(B) + " must be positive");
  if (T <= 0) throw ConfigError("data loader: sequence length T=" + std::to_string(T) + " must be positive");
  if (world <= 0) throw ConfigError("data loader: world size " + std::to_string(world) + " must be positive");
  if (rank < 0 || rank >= world) {
    throw ConfigError("data loader: rank " + std::to_string(rank) + " is outside 0.." + std::to_string(world - 1));
  }
  files_ = expand_shard_pattern(pattern_or_dir);
  shards_.reserve(files_.size());
  for (const auto& f : files_) {
    shards_.emplace_back(f, vocab_size);
    const size_t n = shards_.back().num_tokens();
    samples_in_shard_.push_back(n > 0 ? (n - 1) / static_cast<size_t>(T) : 0);
    total_tokens_ += n;
    total_samples_ += samples_in_shard_.back();
  }
  const uint64_t global = static_cast<uint64_t>(B) * static_cast<uint64_t>(world);
  if (total_samples_ < global) {
    throw ConfigError("data path " + pattern_or_dir + ": " + std::to_string(total_tokens_) + " tokens in " +
                      std::to_string(files_.size()) + " shard(s) give " + std::to_string(total_samples_) +
                      " samples of T+1=" + std::to_string(T + 1) + " tokens, but one step needs B*world=" +
                      std::to_string(global) + ": add data or lower B, T or the world size");
  }
}

size_t DataLoader::steps_per_epoch() const {
  return total_samples_ / (static_cast<size_t>(B_) * static_cast<size_t>(world_));
}

void DataLoader::prepare_epoch(uint64_t epoch) const {
  if (cached_epoch_ == epoch) return;
  if (shuffle_) {
    order_ = shuffled_indices(shards_.size(), mix_key(seed_, epoch, kShardOrderTag));
  } else {
    order_.resize(shards_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  }
  prefix_.assign(order_.size() + 1, 0);
  for (size_t k = 0; k < order_.size(); ++k) prefix_[k + 1] = prefix_[k] + samples_in_shard_[order_[k]];
  cached_epoch_ = epoch;
}

DataLoader::SampleRef DataLoader::locate(uint64_t epoch, uint64_t position) const {
  if (position >= total_samples_) {
    throw Error("data loader: sample position " + std::to_string(position) + " is past the epoch's " +
                std::to_string(total_samples_) + " samples");
  }
  prepare_epoch(epoch);
  // The shard whose range [prefix[k], prefix[k+1]) holds position; empty shards have empty ranges and are skipped.
  const size_t k =
      static_cast<size_t>(std::upper_bound(prefix_.begin(), prefix_.end(), position) - prefix_.begin()) - 1;
  const size_t shard = order_[k];
  uint64_t local = position - prefix_[k];
  if (shuffle_)
    local = IndexPermutation(samples_in_shard_[shard], mix_key(seed_ ^ kSampleOrderTag, epoch, shard))(local);
  return {shard, static_cast<size_t>(local) * static_cast<size_t>(T_)};
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  const uint64_t global = static_cast<uint64_t>(B_) * static_cast<uint64_t>(world_);
  if (position_ + global > total_samples_) {
    ++epoch_;
    position_ = 0;
  }
  const size_t T = static_cast<size_t>(T_);
  for (int b = 0; b < B_; ++b) {
    const SampleRef ref = locate(epoch_, position_ + static_cast<uint64_t>(rank_) * B_ + b);
    const uint16_t* src = shards_[ref.shard].tokens() + ref.offset;
    int32_t* in = inputs + static_cast<size_t>(b) * T;
    int32_t* tg = targets + static_cast<size_t>(b) * T;
    for (size_t t = 0; t < T; ++t) {
      in[t] = src[t];
      tg[t] = src[t + 1];
    }
  }
  position_ += global;
  ++steps_;
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.seed = seed_;
  s.seq_len = T_;
  s.shuffle = shuffle_;
  s.epoch = epoch_;
  s.position = position_;
  s.steps = steps_;
  s.num_shards = shards_.size();
  s.total_tokens = total_tokens_;
  if (position_ < total_samples_) {
    prepare_epoch(epoch_);
    s.shard_index =
        static_cast<uint64_t>(std::upper_bound(prefix_.begin(), prefix_.end(), position_) - prefix_.begin()) - 1;
  } else {
    s.shard_index = shards_.size();
  }
  return s;
}

void DataLoader::restore(const LoaderState& s) {
  auto mismatch = [](const std::string& field, const std::string& saved, const std::string& ours,
                     const std::string& fix) {
    throw ConfigError("loader state: " + field + " is " + saved + " in the checkpoint but " + ours +
                      " in this loader: " + fix);
  };
  if (s.seq_len != T_) mismatch("seq_len", std::to_string(s.seq_len), std::to_string(T_), "keep T across restarts");
  if (s.seed != seed_) mismatch("seed", std::to_string(s.seed), std::to_string(seed_), "keep the training seed");
  if (s.shuffle != shuffle_) {
    mismatch("shuffle", s.shuffle ? "true" : "false", shuffle_ ? "true" : "false", "keep the shuffle setting");
  }
  if (s.num_shards != shards_.size() || s.total_tokens != total_tokens_) {
    mismatch("the data set", std::to_string(s.num_shards) + " shards/" + std::to_string(s.total_tokens) + " tokens",
             std::to_string(shards_.size()) + " shards/" + std::to_string(total_tokens_) + " tokens",
             "point the job at the same shards it was trained on");
  }
  if (s.position > total_samples_) {
    throw ConfigError("loader state: position " + std::to_string(s.position) + " is past the epoch's " +
                      std::to_string(total_samples_) + " samples");
  }
  epoch_ = s.epoch;
  position_ = s.position;
  steps_ = s.steps;
}

void DataLoader::reset() {
  epoch_ = 0;
  position_ = 0;
  steps_ = 0;
}

}  // namespace railyard::worker
