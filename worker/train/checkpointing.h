// Checkpoints of the trainer's state (params, AdamW m/v, counters, loader position, LR-schedule position) through
// ckpt::Writer, restore on start (RAILYARD_RESTORE, --resume, or the newest valid checkpoint, falling back past
// damaged ones), the in-memory tier (ckpt::ShmStore), and the SIGTERM (preemption) save. docs/checkpointing.md.
//
// The stall: params and m/v change only in the optimizer update at the end of a step, so the snapshot copy of step
// N runs on a helper thread while step N+1 does its forward and backward; step N+1 waits for it (if at all) just
// before its update (Trainer hook before_update).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/format.h"
#include "common/metrics/metrics.h"
#include "worker/train/trainer.h"

namespace railyard::ckpt {
class Writer;
class ShmStore;
struct LoadTarget;
}  // namespace railyard::ckpt

namespace railyard::worker {

// What this rank holds of one tensor: its global shape and the box of it in local memory (dense, row-major).
// Data-parallel replicas of a box pass replica_index 0..num_replicas-1; each writes only its part.
struct ShardSpec {
  std::string name;
  ckpt::Shape global_shape;
  ckpt::Box box;
  float* data = nullptr;
  int replica_index = 0;
  int num_replicas = 1;
  bool write = true;  // false: restored but never saved (a copy whose primary another rank writes, e.g. tied wte)
};

// The dp = tp = pp = 1 list: every parameter ("wte", ...) and AdamW state ("adam_m/wte", ...) in full, pointing
// into the trainer's flat buffers. A parallel model passes its own list (e.g. from a shard_map()) instead.
std::vector<ShardSpec> full_state_shards(const GptConfig& model, const TrainerState& state);

// Expert-parallel storage (GptConfig::moe.expert_shards = P > 1, plain data parallelism): `local` is this rank's
// layout. The dense tensors are whole (split among the dp_size replicas like full_state_shards), the four expert
// tensors are the box of experts [shard E/P, (shard + 1) E/P) of the global (L, E, ...) tensor, split among the
// edp_size dp ranks holding the same experts. The checkpoint keeps the global layout, so it restores under any --ep.
std::vector<ShardSpec> expert_shard_state_shards(const GptConfig& local, const TrainerState& state, int dp_rank,
                                                 int dp_size, int edp_rank, int edp_size);

// From a tensor/pipeline-parallel stage's shard_map() (worker/parallel/stage_plan.h ShardSlice: tensor index into
// kParamNames, global_shape, offset, extent, local_offset, tp_replicated, tied_copy), for params and AdamW m/v that
// are laid out like the local params buffer (no ZeRO). Every element is written once in the whole job: slices
// replicated across tp are split among the tp x dp replicas, the others among the dp replicas; the last stage's tied
// wte copy is restored but not written. A template so that this library does not depend on worker/parallel.
template <typename Slice>
std::vector<ShardSpec> shards_from_slices(const std::vector<Slice>& map, float* params, float* adam_m, float* adam_v,
                                          int tp_rank, int tp_size, int dp_rank, int dp_size) {
  std::vector<ShardSpec> out;
  for (auto [prefix, base] : {std::pair<const char*, float*>{"", params}, {"adam_m/", adam_m}, {"adam_v/", adam_v}}) {
    for (const Slice& s : map) {
      ShardSpec sh;
      sh.name = std::string(prefix) + std::string(param_tensor_name(s.tensor));
      for (size_t d = 0; d < s.global_shape.size(); ++d) {
        sh.global_shape.push_back(static_cast<int64_t>(s.global_shape[d]));
        sh.box.offset.push_back(static_cast<int64_t>(s.offset[d]));
        sh.box.size.push_back(static_cast<int64_t>(s.extent[d]));
      }
      sh.data = base + s.local_offset;
      sh.write = !s.tied_copy;
      sh.num_replicas = s.tp_replicated ? tp_size * dp_size : dp_size;
      sh.replica_index = s.tp_replicated ? dp_rank * tp_size + tp_rank : dp_rank;
      out.push_back(std::move(sh));
    }
  }
  return out;
}

// ZeRO (stage 1 or 2) over dp without tensor/pipeline parallelism: the rank holds every parameter (a dp replica) but
// AdamW moments only for the flat ranges it owns, stored back to back in its shard buffers. The moments are saved as
// slices of the global adam_m/<name>, adam_v/<name> tensors (ckpt::flat_range_to_boxes), so a checkpoint reshards
// to any layout with or without ZeRO; every owned element is written once, the parameters split among replicas.
struct OwnedRange {
  size_t begin = 0, end = 0;  // [begin, end) of the flat buffer the ZeRO layout cuts (llm.c's, or a stage's local one)
  size_t shard_offset = 0;    // where `begin` sits in the shard buffers
};
std::vector<ShardSpec> zero_state_shards(const GptConfig& model, float* params, float* shard_m, float* shard_v,
                                         const std::vector<OwnedRange>& owned, int dp_rank, int dp_size);

// One piece of a flat buffer, box `box` of the global tensor `prefix + name` stored densely (row-major) at
// [local_begin, local_begin + box.volume()): appends the parts of it inside the owned ranges, each as a box pointing
// into `shard` (the ZeRO shard buffer of m or v). write = false: restored but never saved.
void append_owned_moments(std::vector<ShardSpec>& out, const std::string& name, const ckpt::Shape& global_shape,
                          const ckpt::Box& box, size_t local_begin, float* shard, const std::vector<OwnedRange>& owned,
                          bool write);

// ZeRO (stage 1 or 2) over dp of a tensor/pipeline-parallel stage: the owned ranges cut the stage's local buffer
// (the DataParallel's BucketLayout over it), and each range is mapped through the stage's shard_map() onto boxes of
// the global adam_m/<name>, adam_v/<name>. So the checkpoint holds the same global tensors as with any other layout
// and reshards to any (dp, tp, pp) with or without ZeRO. Parameters as shards_from_slices. Every element is written
// once: dp owners are disjoint; a tp-replicated slice's moments (identical on every tp rank) are written by tp rank 0
// only, since the owned ranges of other tp ranks need not cut it the same way; the tied wte copy is never written.
template <typename Slice>
std::vector<ShardSpec> zero_slices_shards(const std::vector<Slice>& map, float* params, float* shard_m, float* shard_v,
                                          const std::vector<OwnedRange>& owned, int tp_rank, int tp_size, int dp_rank,
                                          int dp_size) {
  std::vector<ShardSpec> out;
  for (ShardSpec& s : shards_from_slices(map, params, params, params, tp_rank, tp_size, dp_rank, dp_size)) {
    if (s.name.find('/') == std::string::npos) out.push_back(std::move(s));  // the parameters only
  }
  for (auto [prefix, shard] : {std::pair<const char*, float*>{"adam_m/", shard_m}, {"adam_v/", shard_v}}) {
    for (const Slice& s : map) {
      ckpt::Shape shape;
      ckpt::Box box;
      for (size_t d = 0; d < s.global_shape.size(); ++d) {
        shape.push_back(static_cast<int64_t>(s.global_shape[d]));
        box.offset.push_back(static_cast<int64_t>(s.offset[d]));
        box.size.push_back(static_cast<int64_t>(s.extent[d]));
      }
      append_owned_moments(out, std::string(prefix) + std::string(param_tensor_name(s.tensor)), shape, box,
                           s.local_offset, shard, owned, !s.tied_copy && (!s.tp_replicated || tp_rank == 0));
    }
  }
  return out;
}

// Process exit code of a clean preemption: the state was saved on SIGTERM (128 + SIGTERM, a retryable code for
// the operator's failure policy).
inline constexpr int kPreemptedExitCode = 143;

// Puts diverted to the third slot in a row while the peer copy catches up, before a put goes ahead anyway (a peer that
// never acknowledges, e.g. one whose /dev/shm is full, must not freeze the in-memory tier: the own restart after a kill
// -9 needs it).
inline constexpr int kMaxPeerWaits = 8;

struct CheckpointOptions {
  std::string dir;              // checkpoint root; empty = never save
  int every = 0;                // save every N steps (0: only at the end and on SIGTERM)
  int keep = 3;                 // complete checkpoints kept
  bool async = true;            // overlap the snapshot copy with the next step's forward/backward
  bool save_final = true;       // save after the last step
  std::string resume = "auto";  // auto (newest valid under dir) | never | PATH (a root or one step-N directory)
  int shm_every = 0;            // also keep the snapshot in shared memory every N steps (0 = off)
  std::string shm_name;         // ShmStore base name (ckpt::ShmStore::name_for); two slots: shm_name + "-a", "-b"
  // Steps the agent fetched into this rank's slots from a peer pod (RAILYARD_SHM_PEER_STEPS): a restore of one of
  // them is logged from=peer.
  std::vector<int64_t> shm_peer_steps;
  // The agent's record of which of this rank's in-memory steps its peer pod holds (checkpoint/peer_held.h; named
  // when RAILYARD_SHM_PEER_COPY=1). With it a put never overwrites the only own snapshot that the peer also holds:
  // while the peer does not yet hold the snapshot that would survive the put, the step goes into a third slot
  // (shm_name + "-c", never copied: for a restart in place) instead (every rank together, so that all hold the same
  // steps in the same slots), at most kMaxPeerWaits times in a row. "" = no peer copy: two slots, written in turn.
  std::string shm_peer_held;
  double term_budget_seconds = 8;  // SIGTERM: deadline for the final save, from the signal
  std::string run_id;              // unique per run and generation; empty = random (one rank only)
  // The job (<namespace>_<job>) and its generation (RAILYARD_GENERATION): recorded in every manifest, so an older
  // generation that is still running cannot move `latest` nor delete checkpoints (ckpt::WriterOptions). 0 = by hand.
  std::string job;
  int64_t generation = 0;
  int rank = 0;
  int world_size = 1;
  nlohmann::json layout = nlohmann::json::object();
  // More than one rank: true on every rank if any rank passes true (a collective, called by every rank after every
  // step), so that all ranks stop at the same step on SIGTERM. Null: this process decides alone.
  std::function<bool(bool)> any_rank;
  // More than one rank: every rank's `mine` (the same count on every rank), concatenated in rank order (a collective
  // over the whole world, called by every rank at restore). Lets the ranks agree on the in-memory step they restore.
  // Null with world_size > 1: the in-memory tier is not used for restores (disk only).
  std::function<std::vector<int64_t>(const std::vector<int64_t>&)> all_gather;
};

struct RestoreInfo {
  int64_t step = 0;
  std::string source;  // "memory" or the step directory
  std::vector<std::string> skipped;
  double seconds = 0;
  uint64_t bytes = 0;
};

class Checkpointer {
 public:
  // registry may be null (no metrics). Throws ConfigError for bad options.
  Checkpointer(CheckpointOptions options, const GptConfig& model, Trainer& trainer, std::vector<ShardSpec> shards,
               metrics::Registry* registry = nullptr, const metrics::Labels& labels = {});
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Restores per options.resume (memory tier first when it is at least as new). nullopt: fresh start. Throws
  // railyard::Error when an explicit PATH does not load, or the checkpoint belongs to another model.
  std::optional<RestoreInfo> restore();

  // Installs before_update / after_step into the trainer.
  void attach();
  // Waits for the snapshot in flight and every queued save (call after Trainer::run()).
  void finish();

  // SIGTERM/SIGINT set a flag the training loop reads after each step (the handler itself does nothing else).
  static void install_signal_handlers();
  static bool stop_requested();
  static void reset_stop_for_tests();

  // For the bench and tests: stall the step waited for the snapshot, summed over saves.
  double stall_seconds() const { return stall_seconds_; }
  int64_t last_committed_step() const;

 private:
  nlohmann::json state_json(const TrainerState& s) const;
  void apply_state(const nlohmann::json& state, int64_t step);
  void join_copy();
  void start_save(int64_t step, bool async);
  void put_memory(int64_t step);
  bool put_slot(ckpt::ShmStore& slot, int64_t step);
  bool wait_for_peer(int64_t step);
  std::optional<RestoreInfo> restore_any();
  std::optional<int64_t> restore_from_memory(const std::vector<ckpt::LoadTarget>& targets, int64_t disk_newest);
  bool all_ranks(bool mine);
  std::optional<int> after_step(const StepResult& r);
  std::optional<int> save_on_stop(int64_t step);
  void on_finished(int64_t step, bool ok, double persist_seconds, uint64_t bytes);

  CheckpointOptions opt_;
  GptConfig model_;
  Trainer& trainer_;
  std::vector<ShardSpec> shards_;
  std::unique_ptr<ckpt::Writer> writer_;
  std::unique_ptr<ckpt::ShmStore> shm_[2];  // two slots, written in turn: a put torn by a kill leaves the other
  int shm_next_ = 0;
  int64_t shm_steps_[2] = {-1, -1};  // the complete step in each slot as this process knows it (-1: none or torn)
  // The third slot (opt_.shm_peer_held named): the newest step while the two slots wait for the peer copy. The agent
  // neither copies it nor fetches into it, so it serves a restart in place (kill -9 of a trainer) only.
  std::unique_ptr<ckpt::ShmStore> scratch_;
  int64_t scratch_step_ = -1;
  bool peer_gate_ = false;           // opt_.shm_peer_held is named and the ranks can decide together
  int peer_waits_ = 0;               // puts skipped in a row (the same on every rank: decided together)
  int64_t peer_waits_total_ = 0, peer_forced_total_ = 0;
  std::thread copy_;
  std::chrono::steady_clock::time_point copy_started_{};
  double stall_seconds_ = 0;
  double restore_seconds_ = 0;  // the restore() of this process (0: none)
  std::atomic<int64_t> committed_step_{-1};
  int64_t last_snapshot_step_ = -1;

  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace railyard::worker
