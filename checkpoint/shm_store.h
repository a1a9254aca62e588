// The in-memory tier: the newest snapshot of one rank in POSIX shared memory (/dev/shm), which outlives the worker
// process, so a restarted worker restores in milliseconds instead of reading storage. A header with a state word,
// the step and a CRC32C over the contents makes a torn (half-written) or damaged snapshot detectable; the caller
// then falls back to storage. The same layout comes in two checksums: version 1 (CRC32C, what put() writes) and
// version 2 (zlib's CRC-32, what the Python flash checkpoints write: worker/agent/python/railyard_flash.py, whose
// docstring spells out the layout); everything here reads, copies and verifies both.
#pragma once

#include <cstdint>
#include <memory>
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
  // or nullopt with the reason (missing, torn, other format). get() still verifies the contents. *writes (when not
  // null): the segment's count of puts, which tells a rewrite of the same step from the snapshot seen before.
  std::optional<int64_t> peek(std::string* why = nullptr, uint64_t* writes = nullptr) const;

  // Stores every shard's full box (replica fields are ignored: each rank keeps what it holds) and `state`.
  // The segment grows as needed; space is reserved up front so a full /dev/shm is an Error, not a SIGBUS.
  void put(int64_t step, const std::vector<TensorShard>& shards, const nlohmann::json& state = {});

  // Fills targets from the stored snapshot (any boxes inside what was stored). Returns the step, or nullopt with
  // the reason in *why (missing, torn, checksum mismatch, tensor or box not stored).
  std::optional<int64_t> get(const std::vector<LoadTarget>& targets, nlohmann::json* state, std::string* why,
                             bool verify = true) const;

  const std::string& name() const { return name_; }

  // What get() does with a segment's bytes (header, metadata, data; `size` = the mapping's size), for any bytes:
  // every size and offset read from the image is checked against `size` before it is used, and a problem is a
  // nullopt with the reason in *why naming `name`. For get(), the fuzz target and tests.
  static std::optional<int64_t> read_image(const std::string& name, const unsigned char* base, uint64_t size,
                                           const std::vector<LoadTarget>& targets, nlohmann::json* state,
                                           std::string* why, bool verify = true);
  // Tests and fuzzers: recomputes the header checksum (and the contents' CRC32C when the header's sizes fit `size`)
  // of an image built or changed by hand, so the parser's later checks are reached.
  static void seal_image(unsigned char* base, uint64_t size);

  // Byte-for-byte access for the peer copy (worker/agent/peer_copy.h): a complete segment travels whole, header
  // included, so the copy carries the same step, state word and CRC32C, and a half-received copy is torn, never wrong.
  class Image {  // a read-only mapping of a segment that was complete when mapped
   public:
    ~Image();
    Image(const Image&) = delete;
    Image& operator=(const Image&) = delete;
    int64_t step() const { return step_; }
    uint64_t size() const { return size_; }  // header + metadata + data: what a copy transfers
    const unsigned char* data() const { return base_; }
    // False once a put has started on the segment since it was mapped (the bytes read may then be mixed).
    bool unchanged() const;

   private:
    friend class ShmStore;
    Image() = default;
    const unsigned char* base_ = nullptr;
    uint64_t map_size_ = 0;
    uint64_t size_ = 0;
    uint64_t generation_ = 0;
    int64_t step_ = -1;
    uint64_t meta_bytes_ = 0, data_offset_ = 0, data_bytes_ = 0;  // the header's fields as validated when mapped
    uint32_t crc_ = 0;
  };
  // The complete snapshot's bytes, or nullptr with the reason (missing, torn). Contents are not checksummed here:
  // the receiver of a copy does that while the bytes arrive.
  std::unique_ptr<Image> map_image(std::string* why = nullptr) const;

  // Receives a copy into this segment: begin_image marks it "writing" (torn until commit), write_image appends the
  // bytes in order, commit_image checks the header, the sizes and the CRC32C of everything received and only then
  // marks the segment complete. Returns the step, or nullopt with the reason (the segment then stays torn).
  void begin_image(uint64_t size);
  void write_image(const void* data, size_t n);
  std::optional<int64_t> commit_image(std::string* why);

 private:
  std::string name_;
  int fd_ = -1;
  void* map_ = nullptr;
  uint64_t map_size_ = 0;
  void reserve(uint64_t total);  // segment at least `total` bytes, reserved and mapped read-write

  // State of a copy being received (begin_image .. commit_image).
  uint64_t image_size_ = 0;
  uint64_t image_at_ = 0;
  std::vector<unsigned char> image_header_;
};

}  // namespace railyard::ckpt
