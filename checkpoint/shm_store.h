// The in-memory tier: the newest snapshot of one rank in POSIX shared memory (/dev/shm), which outlives the worker
// process, so a restarted worker restores in milliseconds instead of reading storage. A header with a state word,
// the step and a CRC32C over the contents makes a torn (half-written) or damaged snapshot detectable; the caller
// then falls back to storage.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/reader.h"
#include "checkpoint/writer.h"

namespace railyard::ckpt {

class ShmStore {
 public:
  // name: a POSIX shm name ("/railyard-<job>-r<rank>", see name_for). Opens nothing until put/get.
  explicit ShmStore(std::string name);
  ~ShmStore();
  ShmStore(const ShmStore&) = delete;
  ShmStore& operator=(const ShmStore&) = delete;

  // "/railyard-<job>-r<rank>" with characters outside [A-Za-z0-9._-] in job replaced by '_'.
  static std::string name_for(std::string_view job, int rank);
  static void remove(const std::string& name);  // shm_unlink; missing is fine
  // Unlinks every segment whose name starts with `prefix` ("/railyard-..."; listed in /dev/shm, where Linux keeps
  // POSIX shared memory). Returns how many were removed. For the owner of a job's segments (the pod's agent).
  static int remove_prefix(const std::string& prefix);

  // The step of the complete snapshot in the segment from its header alone (no copy, no checksum of the contents),
  // or nullopt with the reason (missing, torn, other format). get() still verifies the contents.
  std::optional<int64_t> peek(std::string* why = nullptr) const;

  // Stores every shard's full box (replica fields are ignored: each rank keeps what it holds) and `state`.
  // The segment grows as needed; space is reserved up front so a full /dev/shm is an Error, not a SIGBUS.
  void put(int64_t step, const std::vector<TensorShard>& shards, const nlohmann::json& state = {});

  // Fills targets from the stored snapshot (any boxes inside what was stored). Returns the step, or nullopt with
  // the reason in *why (missing, torn, checksum mismatch, tensor or box not stored).
  std::optional<int64_t> get(const std::vector<LoadTarget>& targets, nlohmann::json* state, std::string* why,
                             bool verify = true) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  int fd_ = -1;
  void* map_ = nullptr;
  uint64_t map_size_ = 0;
};

}  // namespace railyard::ckpt
