// Data-parallel gradient reduction (docs/parallel.md "Data parallelism and ZeRO"), the GradSync the trainer calls.
//
// Overlapped mode: the flat gradient buffer is cut into buckets (~25 MiB); during the last micro-batch's backward the
// model reports finished ranges (Gpt::set_grad_ready_hook), and a bucket whose every element is final is reduced at
// once by a background thread on its own communicator (dp.dup("dp-grad")) while backward goes on. ZeRO-1/2 replace
// the all-reduce by a reduce-scatter into this rank's pieces, update only those, and all-gather the parameters.
//
// Deterministic mode: the global batch is V virtual micro-batches; rank r computes leaves [r*A, (r+1)*A) (A = V/D,
// a power of two unless D = 1), each into its own buffer, summed pairwise level by level (an odd node passes up) --
// the same binary tree whatever D is. Across ranks the subtree roots are exchanged with all_to_all in chunks and each
// rank folds its chunk over the D roots in rank order (the upper levels of the same tree), then all_gather: no
// reduction whose order depends on the transport.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/stream_reducer.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/parallel/zero.h"
#include "worker/parallel/grad_sync.h"
#include "worker/optim/train_config.h"

namespace railyard::worker::parallel {

struct DataParallelOptions {
  size_t bucket_bytes = size_t{25} << 20;
  int zero_stage = 0;  // 0, 1 or 2
  bool deterministic = false;
  // Tensor/pipeline-parallel models: the local ranges that count in the global grad norm (count_once_ranges) and
  // the groups whose partial sums add up to the whole replica's (tp, then pp). Empty: every element, dp only.
  std::vector<std::pair<size_t, size_t>> count_once;
  std::vector<comm::Communicator*> norm_groups;
  // Device gradients (CUDA): each finished bucket is enqueued on this reducer (NCCL, ordered after the backward
  // kernels that produced it) instead of the background thread's host all-reduce; finish() waits for all. `dp` still
  // carries the host values (losses, flags). Plain averaging only; ZeRO and the deterministic tree leave it unused and
  // run on `device` / `device_dp` below.
  comm::StreamReducer* stream_reducer = nullptr;
  // ZeRO-1 on device buffers (CUDA): the device holding gradients, parameters and this rank's AdamW moments, and a
  // blocking communicator over the dp group that takes its memory (NCCL: the dp group's dup). finish() reduce-scatters
  // the buckets into this rank's pieces (after backward: no overlap), update() runs the device AdamW over the pieces
  // and all-gathers the parameters; shard_m()/shard_v() are host copies refreshed by refresh_host() when an update
  // happened since the last refresh (Trainer::state(): checkpoints), upload_host() writes them back after a restore.
  // Stage 2 keeps the reduced pieces in a shard-sized device buffer. The deterministic tree on device buffers: leaves
  // and their pairwise sums are device buffers added with the device's accumulate (the CPU's a + b, so the same bits),
  // the roots' chunks travel over device_dp (all_to_all, then all_gather or, with ZeRO, kept as the own piece); with
  // ZeRO its fixed-block grad norm reads a host copy of the own piece (the same double sums as the CPU's).
  Kernels<float>* device = nullptr;
  comm::Communicator* device_dp = nullptr;
  // Spans of the flat buffer that only some dp ranks hold the same values of (expert-parallel storage: rank r keeps
  // its ep group's share of the experts). A span is all-reduced over `reduce` (the dp ranks holding the same
  // elements, a sub-group of dp) and divided by the dp degree D like every other gradient, so the result is the
  // mean over all D ranks' tokens as long as each member's local gradient already sums the contributions of the
  // ranks whose tokens it served. The global grad norm adds the span's sums of squares over `norm` (the ranks
  // holding the other parts of the same tensors), in group rank order. Plain data parallelism only (ZeRO and the
  // deterministic tree refuse them); spans are sorted, disjoint and every rank passes the same offsets and counts.
  // With a stream_reducer (device buffers) the rest of each bucket is enqueued on it as usual, and finish(), after
  // its wait, all-reduces each span over `reduce` with a blocking call (which must then take device memory: NCCL)
  // and divides by D on the device (not overlapped with backward); `norm` carries host doubles (a host group) and the
  // norm sums the device's global_norm per range.
  struct GroupSpan {
    size_t offset = 0, count = 0;
    comm::Communicator* reduce = nullptr;
    comm::Communicator* norm = nullptr;
  };
  std::vector<GroupSpan> group_spans;
};

class DataParallel final : public GradSync {
 public:
  static constexpr size_t kNormBlock = 4096;
  // dp: the data-parallel group (its members hold replicas of the same parameters), or nullptr for one replica (the
  // deterministic tree still applies). spans: the flat buffer's tensors, for ZeRO's per-tensor weight decay.
  // Throws ConfigError for a stage outside 0..2. Deterministic mode with ZeRO uses one bucket whose pieces are the
  // all_to_all chunks, in whole blocks of kNormBlock elements so the grad norm is summed over the same blocks in the
  // same order whatever D is.
  DataParallel(comm::Communicator* dp, size_t num_params, std::vector<TensorSpan> spans, const AdamWHyper& hyper,
               ThreadPool& pool, const DataParallelOptions& options);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int zero_stage() const override { return opt_.zero_stage; }
  bool deterministic() const override { return opt_.deterministic; }
  bool device_buffers() const override { return opt_.stream_reducer != nullptr || device_zero_ || device_tree_; }
  bool owns_grad_norm() const override { return zero_ != nullptr || !opt_.group_spans.empty(); }

  void arm(float* grads) override;
  void grads_ready(size_t offset, size_t count) override;
  void add_leaf(const float* grads) override;
  void finish(float* grads) override;
  std::vector<double> all_gather(const std::vector<double>& local) override;

  // ZeRO, or group spans: the global norm of the reduced gradient, identical on every rank.
  double grad_norm(const float* grads) override;
  void update(float* params, const float* grads, float lr, float grad_scale) override;
  float* shard_m() override { return zero_ ? zero_->m() : nullptr; }
  float* shard_v() override { return zero_ ? zero_->v() : nullptr; }
  size_t shard_size() const override { return zero_ ? zero_->size() : 0; }
  int64_t adam_t() const override { return zero_ ? zero_->t() : 0; }
  void set_adam_t(int64_t t) override {
    if (zero_) zero_->set_t(t);
  }
  void refresh_host() override;
  void upload_host() override;
  double take_comm_seconds() override;
  double take_gather_seconds() override;
  std::string describe() const override;

  const BucketLayout& layout() const { return layout_; }
  // Bytes of AdamW moments (and, stage 2, reduced gradients) this rank does not hold compared with plain dp.
  size_t bytes_saved() const;

 private:
  void reducer_loop();
  void reduce_bucket(size_t b);
  // All-reduce [begin, end) of grads_: over dp (mean), or, inside group spans, over their reduce group / D.
  void reduce_range(size_t begin, size_t end);
  // The grad norm with group spans (host blocks, or the device's global_norm with device_spans_).
  double group_spans_norm(const float* grads);
  // Group spans on device buffers: the parts outside the spans onto the stream reducer; the spans after it.
  void enqueue_outside_spans(size_t begin, size_t end);
  void device_reduce_spans();
  void fold_leaves_to_root();
  // The deterministic tree's buffers (D * chunk, zero padding) on the host or, device_tree_, on the device.
  struct TreeBuf {
    AlignedBuffer<float> host;
    DeviceBuffer<float> dev;
    float* data() { return dev.size() > 0 ? dev.data() : host.data(); }
  };
  std::unique_ptr<TreeBuf> take_tree_buf();
  void tree_add(float* a, const float* b, size_t n);  // a = a + b, on the tree's side
  void finish_tree(float* grads);
  // ZeRO-1 and -2 on device buffers.
  void device_reduce_scatter();
  double device_sum_squares(const float* grads);
  void device_update(float* params, const float* grads, float lr, float grad_scale);

  comm::Communicator* dp_;
  std::unique_ptr<comm::Communicator> grad_comm_;                // the background thread's own stream
  std::vector<std::unique_ptr<comm::Communicator>> span_comms_;  // per group span: its reduce group's own stream
  int rank_ = 0, size_ = 1;
  size_t n_;
  DataParallelOptions opt_;
  ThreadPool& pool_;
  BucketLayout layout_;
  std::unique_ptr<ZeroAdamW> zero_;
  AlignedBuffer<float> shard_grads_;  // stage 2: this rank's reduced pieces
  AlignedBuffer<float> pad_in_;       // the last bucket padded to D * piece (reduce-scatter / all-gather)
  AlignedBuffer<float> pad_out_;
  bool device_zero_ = false;
  bool device_tree_ = false;        // the deterministic tree on device buffers
  bool device_spans_ = false;       // group spans with a stream reducer: reduced by device_reduce_spans()
  AlignedBuffer<float> norm_host_;  // device tree with ZeRO: the own piece's host copy for the fixed-block norm
  AdamWHyper hyper_;
  DeviceBuffer<float> dm_, dv_, dpad_in_, dpad_out_;  // ZeRO on the device: moments and padding scratch there
  DeviceBuffer<float> dshard_grads_;                  // stage 2 on the device: this rank's reduced pieces
  bool host_stale_ = false;  // ZeRO on the device: dm_/dv_ changed since zero_'s host copies were refreshed

  // Overlapped reduction state. Written by the main thread (grads_ready) and the reducer thread under mu_.
  float* grads_ = nullptr;
  bool armed_ = false;
  std::vector<size_t> remaining_;  // per bucket: elements not yet final
  size_t enqueued_ = 0, done_ = 0;
  std::deque<size_t> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;

  // Deterministic tree: a stack of (level, buffer) and spare buffers, each D * chunk long.
  struct Node {
    int level;
    std::unique_ptr<TreeBuf> buf;
  };
  std::vector<Node> stack_;
  std::vector<std::unique_ptr<TreeBuf>> spare_;
  size_t chunk_ = 0;  // ceil(n / D)
  int leaves_ = 0;

  double comm_seconds_ = 0, gather_seconds_ = 0;
};

// The reducer of the plain Gpt<float> trainer (dp only): the full llm.c buffer, AdamW settings from `train`.
std::unique_ptr<DataParallel> gpt_data_parallel(comm::Communicator* dp, const GptConfig& model,
                                                const TrainConfig& train, ThreadPool& pool,
                                                const DataParallelOptions& options);

// Expert-parallel storage: the expert tensors of a local layout (GptConfig::moe.expert_shards > 1; fcw..fcprojb are
// consecutive) as one span reduced over `expert_dp` (the dp ranks holding the same experts) with its grad-norm part
// summed over `ep` (the ranks holding the other experts). Empty for a layout with all experts.
std::vector<DataParallelOptions::GroupSpan> expert_group_spans(const GptConfig& local, comm::Communicator* expert_dp,
                                                               comm::Communicator* ep);

// The pairwise-level sum of k buffers of n floats in place into items[0] (items[2i] + items[2i+1], an odd last one
// passes up, until one is left). Exposed for the unit test of the tree's shape.
void tree_sum(std::vector<float*>& items, size_t n, ThreadPool& pool);
// The same tree with the device's accumulate (device memory; the same additions in the same order).
void tree_sum(std::vector<float*>& items, size_t n, Kernels<float>& device);

}  // namespace railyard::worker::parallel
