// Finding, verifying and loading checkpoints, into any layout: the caller names the boxes it needs and the reader
// copies the overlap of every stored slice (resharding across dp, tp, pp and ZeRO changes is just this).
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/format.h"

namespace railyard::ckpt {

struct CheckpointInfo {
  int64_t step = 0;
  std::string name;       // directory name
  bool complete = false;  // a committed step directory with a readable, checksummed manifest
  bool temporary = false;
  std::string problem;  // why not complete
  uint64_t bytes = 0;
  std::time_t modified = 0;
};

// Every step directory (complete or not) and temporary directory under root, oldest first.
std::vector<CheckpointInfo> list_checkpoints(const std::string& root);

struct VerifyReport {
  int64_t step = 0;
  bool ok = true;
  std::vector<std::string> problems;  // "step-00001000: shard rank-00003.bin: CRC32C mismatch at slice qkvw[...]"
  uint64_t bytes_checked = 0;
};

// Checks the manifest, the files' presence and sizes, and (checksums=true) every slice's CRC32C.
// The directory name that holds committed step `step` under root: "step-N", or the "step-N.old-RUN" copy a crash
// left moved aside while step-N is missing (the replace path without RENAME_EXCHANGE; docs/checkpointing.md).
std::string committed_dir_name(const std::string& root, int64_t step);
VerifyReport verify_checkpoint(const std::string& root, int64_t step, bool checksums = true);

// A box of a tensor the caller wants, into dense row-major memory of box.volume() elements.
struct LoadTarget {
  std::string name;
  DType dtype = DType::F32;
  Box box;
  void* data = nullptr;
};

struct LoadResult {
  int64_t step = -1;
  Manifest manifest;
  std::vector<std::string> skipped;  // newer checkpoints passed over, each with the reason
  uint64_t bytes_read = 0;
};

struct LoadOptions {
  // Verify every slice's checksum of a candidate before loading (all ranks then agree on the chosen step even
  // when they read different slices). Otherwise only the slices read are verified, plus sizes of all files.
  bool full_verify = false;
  std::optional<int64_t> max_step;  // ignore newer steps
};

class Reader {
 public:
  explicit Reader(std::string root) : root_(std::move(root)) {}

  // The complete steps, newest first, and the step named by `latest` (if any).
  std::vector<int64_t> complete_steps() const;
  std::optional<int64_t> latest_pointer() const;

  Manifest read_manifest(int64_t step) const;  // throws railyard::Error

  // For multi-rank restores: the newest step that fully verifies (every checksum), and in *skipped why newer ones
  // did not. One rank calls this and broadcasts the step; every rank then calls load_step(step, its boxes).
  std::optional<int64_t> newest_valid_step(std::vector<std::string>* skipped = nullptr) const;

  // Newest checkpoint that verifies and loads; older ones are tried when a newer one is incomplete or corrupt
  // (reasons in LoadResult::skipped). Throws railyard::Error listing every reason when none loads.
  LoadResult load_latest(const std::vector<LoadTarget>& targets, const LoadOptions& options = {}) const;
  // Exactly this step; throws railyard::Error naming the file and slice on any problem.
  LoadResult load_step(int64_t step, const std::vector<LoadTarget>& targets) const;

  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

// Loads targets from a parsed manifest whose files live in step_dir. Throws railyard::Error.
uint64_t load_from_manifest(const std::string& step_dir, const Manifest& m, const std::vector<LoadTarget>& targets);

}  // namespace railyard::ckpt
