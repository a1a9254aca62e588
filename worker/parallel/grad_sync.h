// The data-parallel side of a training step as the trainer sees it. worker/parallel/data_parallel.h implements it
// over a dp communicator (bucketed all-reduce overlapped with backward, ZeRO-1/2, the deterministic tree); the
// trainer only calls these methods, so it carries no communication code and no link dependency on worker/comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace railyard::worker {

class GradSync {
 public:
  virtual ~GradSync() = default;

  virtual int rank() const = 0;  // this replica's data-parallel rank
  virtual int size() const = 0;  // data-parallel degree D
  virtual int zero_stage() const = 0;
  virtual bool deterministic() const = 0;
  // True when the buffers given to arm()/finish() may be device memory (a StreamReducer reduces them on the device,
  // e.g. over NCCL); false: host memory only (the trainer refuses a device that is not the host).
  virtual bool device_buffers() const { return false; }

  // Overlapped reduction: the next backward is the last micro-batch of the step; buckets of `grads` are reduced in
  // the background as grads_ready() reports them final. finish() waits for all of them.
  virtual void arm(float* grads) = 0;
  virtual void grads_ready(size_t offset, size_t count) = 0;

  // Deterministic mode: this rank's virtual micro-batch gradients, one whole buffer each, in virtual order. They are
  // summed in a fixed binary tree; finish() completes the tree across ranks.
  virtual void add_leaf(const float* grads) = 0;

  // Completes the step's reduction into `grads`: the dp mean (or, deterministic, the tree sum of the leaves). ZeRO
  // stage 1 leaves the reduced values only at this rank's pieces of grads, stage 2 only in its own shard buffer.
  virtual void finish(float* grads) = 0;

  // Every rank's `local` values, concatenated in rank order: identical bits on every rank (losses, flags).
  virtual std::vector<double> all_gather(const std::vector<double>& local) = 0;

  // ZeRO only (zero_stage() > 0): the global norm of the reduced gradient (shard sums of squares gathered), and the
  // AdamW step on this rank's shard followed by the all-gather of the parameters.
  virtual double grad_norm(const float* grads) = 0;
  // True when grad_norm() must be used without ZeRO too (the replicas' buffers hold different parts of the model,
  // e.g. expert-parallel storage), so a rank's own buffer does not give the global norm.
  virtual bool owns_grad_norm() const { return zero_stage() > 0; }
  virtual void update(float* params, const float* grads, float lr, float grad_scale) = 0;
  // ZeRO's sharded AdamW moments and counter (checkpoints); empty/null without ZeRO.
  virtual float* shard_m() = 0;
  virtual float* shard_v() = 0;
  virtual size_t shard_size() const = 0;
  virtual int64_t adam_t() const = 0;
  virtual void set_adam_t(int64_t t) = 0;
  // Device buffers: shard_m()/shard_v() are host copies. refresh_host() makes them current (device -> host) if an
  // update happened since the last refresh: Trainer::state() calls it, so only checkpoint, snapshot and export steps
  // pay the copy. After a restore wrote them, upload_host() uploads them.
  virtual void refresh_host() {}
  virtual void upload_host() {}

  // Seconds the calling thread spent blocked on data-parallel communication since the last call (the part of the
  // reduction that backward did not hide), and on the ZeRO parameter all-gather (counted as optimizer time).
  virtual double take_comm_seconds() = 0;
  virtual double take_gather_seconds() = 0;

  // For the layout line: "dp=2 zero=1 buckets=3 x 25.0 MiB, optimizer state saved 1.2 MiB/rank".
  virtual std::string describe() const = 0;
};

}  // namespace railyard::worker
