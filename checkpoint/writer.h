// Two-phase checkpoint save: snapshot() copies the rank's tensors into host memory (the only part the training
// step waits for), a background thread persists them and the coordinator rank commits the step.
//
// Directory protocol (docs/checkpoint-format.md): every rank writes rank-NNNNN.bin and rank-NNNNN.done into
// ROOT/step-N.tmp-RUNID/; rank 0 waits for every done record, writes manifest.json (temp + fsync + rename),
// renames the directory to ROOT/step-N, fsyncs ROOT and moves ROOT/latest. A directory named step-N with a
// manifest is complete; anything else is an orphan the next writer removes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/format.h"
#include "common/error.h"

namespace railyard::ckpt {

using Clock = std::chrono::steady_clock;

// One hyper-rectangle of one tensor that this rank holds, with its dense row-major data. Ranks that hold the same
// box (data-parallel replicas) give the same box with replica_index 0..num_replicas-1; each writes only its part.
struct TensorShard {
  std::string name;
  DType dtype = DType::F32;
  Shape global_shape;
  Box box;
  const void* data = nullptr;
  int replica_index = 0;
  int num_replicas = 1;
};

// The commit barrier between ranks. The default (FsCoordinator) uses files in the shared step directory, so it
// works across processes; a worker can plug in a collective (gather over its Gloo group) instead.
class Coordinator {
 public:
  virtual ~Coordinator() = default;
  // Called by every rank once its shard file is durable. Returns every rank's record (index = rank) on rank 0 and
  // an empty vector elsewhere. Throws railyard::Error when a rank reported failure or the deadline passed.
  virtual std::vector<RankRecord> gather(const std::string& tmp_dir, const RankRecord& mine, int world_size,
                                         Clock::time_point deadline) = 0;
  // Called by a rank whose part failed, so the coordinator aborts at once instead of waiting for the deadline.
  virtual void report_failure(const std::string& tmp_dir, int rank, const std::string& error) = 0;
  // Non-coordinator ranks: true once step_dir holds a committed manifest of run_id; false when the save was
  // abandoned (tmp_dir gone without a commit) or the deadline passed.
  virtual bool wait_commit(const std::string& step_dir, const std::string& tmp_dir, const std::string& run_id,
                           Clock::time_point deadline) = 0;
  // From now on gather throws and wait_commit returns false at once: the process gives up its saves in flight
  // (a peer it waits for is gone). Thread-safe; called from another thread than the waits.
  virtual void cancel() {}
};

class FsCoordinator : public Coordinator {
 public:
  explicit FsCoordinator(std::chrono::milliseconds poll = std::chrono::milliseconds(5)) : poll_(poll) {}
  std::vector<RankRecord> gather(const std::string& tmp_dir, const RankRecord& mine, int world_size,
                                 Clock::time_point deadline) override;
  void report_failure(const std::string& tmp_dir, int rank, const std::string& error) override;
  bool wait_commit(const std::string& step_dir, const std::string& tmp_dir, const std::string& run_id,
                   Clock::time_point deadline) override;
  void cancel() override { cancelled_ = true; }

 private:
  std::chrono::milliseconds poll_;
  std::atomic<bool> cancelled_{false};
};

enum class SaveState { Queued, Persisting, Committed, Failed };
std::string_view save_state_name(SaveState s);

struct SaveStatus {
  int64_t step = -1;
  SaveState state = SaveState::Queued;
  std::string error;            // set when Failed: what failed, with the file and errno text
  double snapshot_seconds = 0;  // training stall: waiting for a buffer + copying
  double persist_seconds = 0;   // background: checksums, writes, fsyncs, commit
  uint64_t bytes = 0;           // bytes this rank wrote
  bool done() const { return state == SaveState::Committed || state == SaveState::Failed; }
};

struct WriterOptions {
  std::string root;  // checkpoint directory, shared by all ranks
  int rank = 0;
  int world_size = 1;
  // Same on every rank of one run, different for every run (e.g. "<job-uid>-g<generation>"): it names the
  // temporary directory, so leftovers of a crashed run are never mistaken for this run's files. Empty: a random
  // id (allowed only with world_size 1).
  std::string run_id;
  nlohmann::json layout = nlohmann::json::object();  // recorded in the manifest (Layout::to_json())
  // The job and its generation (WorkerConfig::generation, RAILYARD_GENERATION), recorded in every manifest. A writer
  // whose generation is older than the one that wrote the step `latest` names (same job) is superseded: its saves
  // fail without moving `latest`, and it deletes nothing (no retention, no orphan cleanup). 0 = not part of a job's
  // generations (a run by hand, the reshard tool): never fenced.
  std::string job;
  int64_t generation = 0;
  int keep = 3;  // complete checkpoints kept by rank 0 (0 keeps all)
  // Snapshot buffers. 1: a snapshot taken while the previous save is still persisting waits for it (memory =
  // one copy of the rank's state). 2: double buffering, the next snapshot proceeds at once (two copies).
  int buffers = 1;
  std::chrono::milliseconds commit_timeout{std::chrono::minutes(10)};
  bool fsync = true;
  std::shared_ptr<Coordinator> coordinator;  // default: FsCoordinator
  // Called on the persist thread when a save is committed or has failed (e.g. to export metrics such as
  // railyard_checkpoint_persist_seconds without this library depending on the metrics module). Must not block.
  std::function<void(const SaveStatus&)> on_finished;
};

class Writer {
 public:
  // Creates root; on rank 0 removes orphans (temporary directories of other runs, step directories without a
  // manifest, stray temp files). Throws railyard::ConfigError for bad options.
  explicit Writer(WriterOptions options);
  ~Writer();  // waits for saves in flight
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Copies every shard into a snapshot buffer and queues the persist; returns when the caller may modify its
  // tensors again. `state` is this rank's opaque JSON (RNG, data loader, LR scheduler), stored in the manifest.
  // Throws railyard::Error for invalid shards (naming the tensor); persist errors are reported by status().
  SaveStatus snapshot(int64_t step, const std::vector<TensorShard>& shards, const nlohmann::json& state = {});

  // For the SIGTERM path (call it from the trainer loop after the handler set a flag, not from the handler):
  // snapshot + wait until committed, failed, or the deadline passed (then the returned state is not done()).
  SaveStatus save_now_and_wait(int64_t step, const std::vector<TensorShard>& shards, const nlohmann::json& state,
                               Clock::time_point deadline);

  // Status of the save of `step` (state Failed with "unknown step" when never snapshotted), and of the newest one.
  SaveStatus status(int64_t step) const;
  SaveStatus last_status() const;
  // Blocks until the save of `step` is done or the deadline passes.
  SaveStatus wait(int64_t step, Clock::time_point deadline) const;
  void flush();       // waits for every queued save
  bool idle() const;  // no save queued or persisting
  // Gives up every save in flight and queued (they end Failed, nothing is committed) instead of waiting for them:
  // for a process that is going away because a peer is gone, whose commit barrier would wait commit_timeout for it.
  void abandon();

  // Allocates and touches the snapshot buffers for `bytes` per snapshot, so the first snapshot does not pay the page
  // faults of a fresh multi-GB buffer inside the training step. Optional; call it at startup with
  // snapshot_bytes(shards).
  void reserve(uint64_t bytes);

  const WriterOptions& options() const { return options_; }

 private:
  struct Buffer;
  struct Job;
  void run();
  SaveStatus persist(Job& job);  // the final status; run() publishes it
  void set_status(const SaveStatus& s);

  WriterOptions options_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::map<int64_t, SaveStatus> statuses_;
  int64_t last_step_ = -1;
  bool stop_ = false;
  std::atomic<bool> abandoned_{false};
  std::thread thread_;
};

// Lower-level pieces of the protocol, also used by the reshard tool.
struct PendingSlice {
  SliceRecord record;  // tensor and box set; offset, bytes, crc filled by write_rank_shard
  const void* data = nullptr;
};
// Writes rank-NNNNN.bin into dir (fsynced) and returns the rank's record. Throws railyard::Error.
RankRecord write_rank_shard(const std::string& dir, int rank, int64_t step, const std::string& run_id,
                            const std::vector<TensorRecord>& tensors, std::vector<PendingSlice>& slices,
                            bool fsync_files);
// Rank 0's commit: manifest into tmp_dir, then under the commit lock (kCommitLockName): the generation fence, tmp_dir
// renamed to root/step-N (a committed step-N is swapped with it in one renameat2(RENAME_EXCHANGE)), `latest`
// (its own temporary name + one rename), retention. A crash at any point leaves the previous committed step or
// the new one readable (docs/checkpointing.md "The commit protocol"). Throws railyard::Error (SupersededError for a
// superseded generation), after which nothing of this step is visible (tmp_dir is left for the caller to remove).
void commit_checkpoint(const std::string& root, const std::string& tmp_dir, Manifest manifest, int keep,
                       bool fsync_files);
// The commit of a writer whose generation is older than the one that wrote the step `latest` names.
struct SupersededError : Error {
  using Error::Error;
};
// The generation that wrote the step `latest` names, if that step is `job`'s (else, when `latest` is missing or
// unreadable, the newest generation of `job` among the complete steps); nullopt when none is recorded.
std::optional<int64_t> current_generation(const std::string& root, const std::string& job);
// Removes orphans under root (see Writer): temporary directories of other runs that no live writer holds (flock on
// the directory), step directories without a manifest, temporaries of `latest`; puts back a step that a crash left
// moved aside (".old-") by the replace path of file systems without RENAME_EXCHANGE. Takes the commit lock.
// Returns what was removed or restored.
std::vector<std::string> clean_orphans(const std::string& root, const std::string& current_run_id);
// Keeps the newest `keep` complete checkpoints, and always the newest one that verifies (sizes, manifest) and the
// one `latest` names; returns what was removed. The caller holds the commit lock.
std::vector<std::string> apply_retention(const std::string& root, int keep);

std::string temp_dir_name(int64_t step, const std::string& run_id);

// The part of a replicated box that replica `index` of `replicas` writes: the box split along its longest
// dimension (a scalar goes to replica 0). The parts of all replicas tile the box.
Box replica_part(const Box& box, int index, int replicas);

// Snapshot buffer bytes one snapshot of these shards needs (this rank's replica parts, 64-byte aligned).
uint64_t snapshot_bytes(const std::vector<TensorShard>& shards);  // "step-00001000.tmp-RUNID"

}  // namespace railyard::ckpt
