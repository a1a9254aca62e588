// Deterministic, resumable, data-parallel token loader over llm.c `.bin` shards.
//
// A sample is T+1 consecutive tokens of one shard starting at a multiple of T (inputs = first T, targets = last T).
// Each epoch walks one global sample sequence: shards in a seeded shuffled order, and inside each shard its samples
// in a seeded pseudo-random permutation (no shuffle: file order and sample order). A global step takes the next
// B*world samples of that sequence; rank r gets the r-th run of B. So ranks see disjoint samples, every sample is
// seen once per epoch (the tail that cannot fill a whole global step is skipped), and all ranks hold the same state.
// The permutations are pure functions of (seed, epoch, shard), so the state is a few integers: restoring it gives
// exactly the same subsequent batches, also with a different world size or B (elastic resize).
// See docs/data.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "worker/data/shard.h"

namespace railyard::worker {

// The loader's position, stored in checkpoints. Identical on every rank.
struct LoaderState {
  uint64_t seed = 0;  // the permutations of epoch e are derived from (seed, e): this is the RNG state
  int seq_len = 0;    // T; a state only restores into a loader with the same T
  bool shuffle = true;
  uint64_t epoch = 0;        // completed passes over the data
  uint64_t position = 0;     // samples of this epoch's sequence consumed by all ranks together
  uint64_t shard_index = 0;  // position in this epoch's shard order of the next sample (informational)
  uint64_t steps = 0;        // global steps served since construction or reset
  // Fingerprint of the data set, checked on restore.
  uint64_t num_shards = 0;
  uint64_t total_tokens = 0;

  bool operator==(const LoaderState&) const = default;
};

void to_json(nlohmann::json& j, const LoaderState& s);
void from_json(const nlohmann::json& j, LoaderState& s);  // throws railyard::ConfigError naming a missing field

// Expands a loader source: a directory means DIR/train_*.bin; anything else is a glob(3) pattern (a plain file
// path matches itself). Only files are kept (a matching directory is skipped). Sorted by name. Throws
// railyard::ConfigError when nothing matches.
std::vector<std::string> expand_shard_pattern(const std::string& pattern_or_dir);

// A loader source as a glob: a directory DIR becomes DIR/<dir_glob>; anything else comes back as it is.
std::string shard_glob(const std::string& pattern_or_dir, const std::string& dir_glob = "train_*.bin");

// The validation shards that go with a training source when none is given (spec.data.val absent, no --val-data):
// val_*.bin in the directory itself, or in the directory part of the training glob ("/data/train_*.bin" ->
// "/data/val_*.bin", "/data/*/tr_*.bin" -> "/data/*/val_*.bin", "train_*.bin" -> "val_*.bin").
std::string default_val_glob(const std::string& train_pattern_or_dir);

class DataLoader {
 public:
  // Opens and validates every shard (tokens < vocab_size). B: sequences per rank per step; T: tokens per sequence.
  DataLoader(const std::string& pattern_or_dir, int B, int T, int rank, int world, uint64_t seed, int vocab_size,
             bool shuffle = true);

  // Fills inputs and targets with B*T tokens each (row-major (B, T)); targets are inputs shifted by one.
  void next_batch(int32_t* inputs, int32_t* targets);

  LoaderState state() const;
  // Continues from a saved state. Throws railyard::ConfigError when the state belongs to other data, another T,
  // seed or shuffle mode (the message names the field).
  void restore(const LoaderState& s);
  // Back to the start of epoch 0 (e.g. before each validation pass).
  void reset();

  size_t num_tokens() const { return total_tokens_; }
  size_t num_shards() const { return shards_.size(); }
  // Samples (T+1 token windows) per epoch over all ranks, and whole global steps per epoch.
  size_t samples_per_epoch() const { return total_samples_; }
  size_t steps_per_epoch() const;
  uint64_t epoch() const { return epoch_; }
  const std::vector<std::string>& files() const { return files_; }

  // Which shard and token offset the i-th sample of an epoch's sequence reads (exposed for tests and inspection).
  struct SampleRef {
    size_t shard;   // index into files()
    size_t offset;  // token offset of the first input token
  };
  SampleRef locate(uint64_t epoch, uint64_t position) const;

 private:
  void prepare_epoch(uint64_t epoch) const;

  int B_, T_, rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<std::string> files_;
  std::vector<MappedShard> shards_;
  std::vector<uint64_t> samples_in_shard_;
  size_t total_tokens_ = 0;
  size_t total_samples_ = 0;
  uint64_t epoch_ = 0;
  uint64_t position_ = 0;
  uint64_t steps_ = 0;
  // Shard order and its prefix sums for one epoch, cached because consecutive batches share the epoch.
  mutable uint64_t cached_epoch_ = UINT64_MAX;
  mutable std::vector<size_t> order_;
  mutable std::vector<uint64_t> prefix_;
};

}  // namespace railyard::worker
