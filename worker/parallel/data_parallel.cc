#include "worker/parallel/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/error.h"

namespace railyard::worker::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// a[i] = a[i] + b[i]: one node of the tree. Element-wise, so the bits do not depend on the thread split.
void add_into(float* a, const float* b, size_t n, ThreadPool& pool) {
  pool.parallel_for(n, [=](size_t s, size_t e) {
    for (size_t i = s; i < e; ++i) a[i] = a[i] + b[i];
  });
}

bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

template <typename Add>
void pairwise_levels(std::vector<float*>& items, Add add) {
  size_t k = items.size();
  while (k > 1) {
    const size_t half = k / 2;
    for (size_t i = 0; i < half; ++i) {
      add(items[2 * i], items[2 * i + 1]);
      items[i] = items[2 * i];
    }
    if (k % 2 == 1) items[half] = items[k - 1];
    k = half + k % 2;
  }
}

}  // namespace

void tree_sum(std::vector<float*>& items, size_t n, ThreadPool& pool) {
  pairwise_levels(items, [&](float* a, const float* b) { add_into(a, b, n, pool); });
}

void tree_sum(std::vector<float*>& items, size_t n, Kernels<float>& device) {
  pairwise_levels(items, [&](float* a, const float* b) { device.accumulate(a, b, n); });
}

DataParallel::DataParallel(comm::Communicator* dp, size_t num_params, std::vector<TensorSpan> spans,
                           const AdamWHyper& hyper, ThreadPool& pool, const DataParallelOptions& options)
    : dp_(dp),
      rank_(dp != nullptr ? dp->rank() : 0),
      size_(dp != nullptr ? dp->size() : 1),
      n_(num_params),
      opt_(options),
      pool_(pool),
      layout_(num_params, size_,
              options.deterministic ? num_params * 2 + kNormBlock * 4
                                    : std::max<size_t>(1, options.bucket_bytes / sizeof(float)),
              options.deterministic && options.zero_stage > 0 ? kNormBlock : 1) {
  if (opt_.zero_stage < 0 || opt_.zero_stage > 2) {
    throw ConfigError("--zero " + std::to_string(opt_.zero_stage) + ": the ZeRO stage must be 0, 1 or 2");
  }
  if (options.bucket_bytes < sizeof(float)) throw ConfigError("--bucket-mb must be positive");
  device_spans_ = opt_.stream_reducer != nullptr && !opt_.group_spans.empty();
  if (device_spans_ && opt_.device == nullptr) {
    throw Error(
        "data-parallel: sub-group gradient spans on device buffers need the device (DataParallelOptions::device) "
        "for their mean and norm");
  }
  const bool off_host = opt_.device != nullptr && !opt_.device->host_accessible();
  device_zero_ = off_host && opt_.zero_stage > 0 && opt_.group_spans.empty();
  device_tree_ = off_host && opt_.deterministic && opt_.group_spans.empty();
  if ((opt_.stream_reducer != nullptr || device_zero_) &&
      ((opt_.deterministic && !device_tree_) || (opt_.zero_stage > 0 && !device_zero_))) {
    throw ConfigError(std::string("--device cuda with ") +
                      (opt_.deterministic ? "--deterministic" : "--zero " + std::to_string(opt_.zero_stage)) +
                      ": ZeRO 1/2 and the deterministic tree on device buffers need the device itself "
                      "(DataParallelOptions::device, as railyard-worker sets it), not only a stream reducer: "
                      "use --device cpu or build the reducer with the device");
  }
  if ((device_zero_ || device_tree_) && size_ > 1 && opt_.device_dp == nullptr)
    throw Error(
        "data-parallel: ZeRO or the deterministic tree on device buffers needs a dp communicator that takes "
        "device memory (DataParallelOptions::device_dp)");
  chunk_ = (n_ + static_cast<size_t>(size_) - 1) / static_cast<size_t>(size_);
  if (opt_.deterministic && opt_.zero_stage > 0) chunk_ = layout_.buckets().front().piece;  // own piece = own chunk
  if (opt_.zero_stage > 0) {
    zero_ = std::make_unique<ZeroAdamW>(layout_, rank_, std::move(spans), hyper, pool_);
    if (opt_.zero_stage == 2) shard_grads_ = AlignedBuffer<float>(layout_.shard_size());
    const auto& last = layout_.buckets().back();
    pad_in_ = AlignedBuffer<float>(last.piece * static_cast<size_t>(size_));
    pad_out_ = AlignedBuffer<float>(layout_.buckets().front().piece);
  }
  if (device_zero_) {
    // The moments live on the device; zero_'s host m/v are their copies for checkpoints.
    hyper_ = hyper;
    Kernels<float>& k = *opt_.device;
    dm_ = DeviceBuffer<float>(k, layout_.shard_size());
    dv_ = DeviceBuffer<float>(k, layout_.shard_size());
    k.zero(dm_.data(), dm_.size() * sizeof(float));
    k.zero(dv_.data(), dv_.size() * sizeof(float));
    dpad_in_ = DeviceBuffer<float>(k, pad_in_.size());
    dpad_out_ = DeviceBuffer<float>(k, pad_out_.size());
    // Stage 2: the reduced pieces live in a shard-sized device buffer; the update and the norm read it.
    if (opt_.zero_stage == 2) dshard_grads_ = DeviceBuffer<float>(k, layout_.shard_size());
    if (device_tree_) norm_host_ = AlignedBuffer<float>(layout_.shard_size());
  }
  if (!opt_.group_spans.empty()) {
    if (opt_.zero_stage > 0 || opt_.deterministic) {
      throw ConfigError(
          "data-parallel: sub-group gradient spans (expert-parallel storage) work with plain data parallelism only; "
          "ZeRO and --deterministic keep every expert on every rank");
    }
    size_t prev_end = 0;
    for (const auto& g : opt_.group_spans) {
      if (g.offset < prev_end || g.offset + g.count > n_ || g.reduce == nullptr) {
        throw Error("data-parallel: group spans must be sorted, disjoint, inside the buffer and name a group");
      }
      prev_end = g.offset + g.count;
      // The reducer thread's own stream of the sub-group, as grad_comm_ is for dp. Collective over the sub-group.
      // On device buffers finish() reduces the spans on the calling thread with `reduce` itself.
      if (size_ > 1 && !device_spans_) span_comms_.push_back(g.reduce->dup(g.reduce->name() + "-grad"));
    }
  }
  if (size_ > 1 && !opt_.deterministic && opt_.stream_reducer == nullptr && !device_zero_) {
    grad_comm_ = dp_->dup("dp-grad");
    thread_ = std::thread([this] { reducer_loop(); });
  }
}

DataParallel::~DataParallel() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DataParallel::arm(float* grads) {
  std::lock_guard<std::mutex> lk(mu_);
  grads_ = grads;
  armed_ = true;
  remaining_.clear();
  for (const auto& b : layout_.buckets()) remaining_.push_back(b.size());
  enqueued_ = done_ = 0;
  queue_.clear();
}

void DataParallel::grads_ready(size_t offset, size_t count) {
  if (!armed_) return;
  const size_t end = offset + count;
  if (end > n_) throw Error("data-parallel: gradient range beyond the buffer reported by the model");
  for (size_t i = offset; i < end;) {
    const size_t b = layout_.bucket_of(i);
    const size_t take = std::min(layout_.buckets()[b].end, end) - i;
    if (take > remaining_[b]) throw Error("data-parallel: the model reported gradient elements final twice");
    remaining_[b] -= take;
    i += take;
    if (remaining_[b] != 0) continue;
    if (device_zero_) {  // reduce-scattered in finish(), after backward
      ++enqueued_;
      ++done_;
      continue;
    }
    if (opt_.stream_reducer != nullptr) {
      // Device buffers: enqueued behind the backward kernels that produced the bucket, overlapping the rest. Group
      // spans are left to finish().
      const auto& k = layout_.buckets()[b];
      if (size_ > 1) enqueue_outside_spans(k.begin, k.end);
      ++enqueued_;
      ++done_;
      continue;
    }
    if (!thread_.joinable()) {
      reduce_bucket(b);  // one replica: nothing to overlap with
      ++enqueued_;
      ++done_;
      continue;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(b);
      ++enqueued_;
    }
    cv_.notify_all();
  }
}

void DataParallel::reducer_loop() {
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      b = queue_.front();
      queue_.pop_front();
      if (error_) {  // the communicator is dead after an error: skip the rest, finish() rethrows
        ++done_;
        cv_.notify_all();
        continue;
      }
    }
    try {
      reduce_bucket(b);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++done_;
    }
    cv_.notify_all();
  }
}

void DataParallel::reduce_bucket(size_t b) {
  const auto& k = layout_.buckets()[b];
  float* g = grads_ + k.begin;
  if (opt_.zero_stage == 0) {
    if (size_ > 1 && opt_.group_spans.empty())
      grad_comm_->all_reduce(g, k.size(), comm::DType::kFloat32, comm::ReduceOp::kAvg);
    if (size_ > 1 && !opt_.group_spans.empty()) reduce_range(k.begin, k.end);
    return;
  }
  const auto [own_b, own_e] = layout_.own(b, rank_);
  float* out = opt_.zero_stage == 2 ? shard_grads_.data() + k.shard_offset : pad_out_.data();
  if (size_ == 1) {
    std::memcpy(out, g, k.size() * sizeof(float));
  } else {
    const float* in = g;
    if (k.padded(size_)) {
      std::memcpy(pad_in_.data(), g, k.size() * sizeof(float));
      std::memset(pad_in_.data() + k.size(), 0, (pad_in_.size() - k.size()) * sizeof(float));
      in = pad_in_.data();
    }
    grad_comm_->reduce_scatter(in, out, k.piece, comm::DType::kFloat32, comm::ReduceOp::kAvg);
  }
  // Stage 1 keeps the full-size gradient buffer: the reduced piece goes back to its place in it.
  if (opt_.zero_stage == 1 && own_e > own_b) std::memcpy(grads_ + own_b, out, (own_e - own_b) * sizeof(float));
}

void DataParallel::reduce_range(size_t begin, size_t end) {
  // Cut [begin, end) at the group spans: every rank cuts the same way, so the collectives pair up.
  size_t at = begin;
  for (size_t i = 0; i < opt_.group_spans.size() && at < end; ++i) {
    const auto& gs = opt_.group_spans[i];
    const size_t sb = std::max(at, gs.offset), se = std::min(end, gs.offset + gs.count);
    if (sb >= se) continue;
    if (sb > at) grad_comm_->all_reduce(grads_ + at, sb - at, comm::DType::kFloat32, comm::ReduceOp::kAvg);
    float* g = grads_ + sb;
    const size_t n = se - sb;
    comm::Communicator& c = *span_comms_[i];
    if (c.size() > 1) c.all_reduce(g, n, comm::DType::kFloat32, comm::ReduceOp::kSum);
    // Divided by D, as kAvg over dp divides the sum of D replicas: the sub-group's sum already holds every dp
    // rank's tokens for these elements once.
    const float d = static_cast<float>(size_);
    pool_.parallel_for(n, [=](size_t s0, size_t s1) {
      for (size_t j = s0; j < s1; ++j) g[j] = g[j] / d;
    });
    at = se;
  }
  if (at < end) grad_comm_->all_reduce(grads_ + at, end - at, comm::DType::kFloat32, comm::ReduceOp::kAvg);
}

void DataParallel::enqueue_outside_spans(size_t begin, size_t end) {
  size_t at = begin;
  for (const auto& gs : opt_.group_spans) {
    const size_t sb = std::max(at, gs.offset), se = std::min(end, gs.offset + gs.count);
    if (sb >= se) continue;
    if (sb > at) opt_.stream_reducer->all_reduce(grads_ + at, sb - at, comm::DType::kFloat32, comm::ReduceOp::kAvg);
    at = se;
  }
  if (at < end) opt_.stream_reducer->all_reduce(grads_ + at, end - at, comm::DType::kFloat32, comm::ReduceOp::kAvg);
}

void DataParallel::device_reduce_spans() {
  // Blocking collectives over each span's sub-group after backward (not overlapped: the stream reducer runs over dp
  // only). Its communicator's stream does not order against the kernels': backward's last writes must be done.
  Kernels<float>& k = *opt_.device;
  k.synchronize();
  for (const auto& gs : opt_.group_spans) {
    float* g = grads_ + gs.offset;
    if (gs.reduce->size() > 1) gs.reduce->all_reduce(g, gs.count, comm::DType::kFloat32, comm::ReduceOp::kSum);
    // Divided by D on the device, as reduce_range does on the host (the same division, so the same bits).
    k.divide(g, static_cast<float>(size_), gs.count);
  }
}

double DataParallel::group_spans_norm(const float* grads) {
  // Outside the spans every replica holds the whole reduced gradient: counted as it is. Inside, the span's part is
  // added over `norm` in rank order (the bits: the same total on every rank holding the same values).
  // Sums of squares of [b, e): on the host in double over fixed blocks, added in block order; on the device its
  // global_norm's fixed chunks (equal up to rounding).
  auto sum_squares = [&](size_t b, size_t e) {
    if (e <= b) return 0.0;
    if (device_spans_) {
      const double n = opt_.device->global_norm(grads + b, e - b);
      return n * n;
    }
    const size_t blocks = (e - b + kNormBlock - 1) / kNormBlock;
    std::vector<double> part(blocks, 0.0);
    pool_.parallel_for(blocks, [&](size_t k0, size_t k1) {
      for (size_t k = k0; k < k1; ++k) {
        double acc = 0;
        for (size_t i = b + k * kNormBlock; i < std::min(e, b + (k + 1) * kNormBlock); ++i)
          acc += static_cast<double>(grads[i]) * grads[i];
        part[k] = acc;
      }
    });
    double s = 0;
    for (double v : part) s += v;
    return s;
  };
  double total = 0;
  size_t at = 0;
  for (const auto& gs : opt_.group_spans) {
    total += sum_squares(at, gs.offset);
    double mine = sum_squares(gs.offset, gs.offset + gs.count);
    if (gs.norm != nullptr && gs.norm->size() > 1) {
      std::vector<double> all(static_cast<size_t>(gs.norm->size()));
      gs.norm->all_gather(&mine, all.data(), 1, comm::DType::kInt64);  // host doubles: `norm` is a host group
      mine = 0;
      for (double v : all) mine += v;
    }
    total += mine;
    at = gs.offset + gs.count;
  }
  total += sum_squares(at, n_);
  return std::sqrt(total);
}

std::unique_ptr<DataParallel::TreeBuf> DataParallel::take_tree_buf() {
  if (!spare_.empty()) {
    std::unique_ptr<TreeBuf> b = std::move(spare_.back());
    spare_.pop_back();
    return b;
  }
  auto b = std::make_unique<TreeBuf>();
  const size_t n = chunk_ * static_cast<size_t>(size_);  // zero padding stays zero (both allocate zero-filled)
  if (device_tree_) {
    b->dev = DeviceBuffer<float>(*opt_.device, n);
  } else {
    b->host = AlignedBuffer<float>(n);
  }
  return b;
}

void DataParallel::tree_add(float* a, const float* b, size_t n) {
  if (device_tree_) {
    opt_.device->accumulate(a, b, n);  // a[i] += b[i]: the bits of add_into's a[i] + b[i]
  } else {
    add_into(a, b, n, pool_);
  }
}

void DataParallel::add_leaf(const float* grads) {
  std::unique_ptr<TreeBuf> buf = take_tree_buf();
  if (device_tree_) {
    opt_.device->copy(buf->data(), grads, n_);
  } else {
    std::memcpy(buf->data(), grads, n_ * sizeof(float));
  }
  stack_.push_back({0, std::move(buf)});
  ++leaves_;
  // Binary counter: two subtrees of the same height are siblings in the pairwise tree.
  while (stack_.size() >= 2 && stack_[stack_.size() - 1].level == stack_[stack_.size() - 2].level) {
    Node right = std::move(stack_.back());
    stack_.pop_back();
    tree_add(stack_.back().buf->data(), right.buf->data(), n_);
    ++stack_.back().level;
    spare_.push_back(std::move(right.buf));
  }
}

void DataParallel::fold_leaves_to_root() {
  // What is left are subtrees of decreasing size; folding from the right gives the pairwise tree's upper nodes.
  while (stack_.size() >= 2) {
    Node right = std::move(stack_.back());
    stack_.pop_back();
    tree_add(stack_.back().buf->data(), right.buf->data(), n_);
    spare_.push_back(std::move(right.buf));
  }
}

void DataParallel::finish_tree(float* grads) {
  if (stack_.empty()) throw Error("data-parallel: finish() without any add_leaf() in deterministic mode");
  if (size_ > 1 && !power_of_two(leaves_)) {
    throw ConfigError("--deterministic with dp=" + std::to_string(size_) + " needs a power-of-two number of " +
                      "micro-batches per rank, got " + std::to_string(leaves_) +
                      ": change --global-batch so that global/(batch*seq*dp) is 1, 2, 4, ...");
  }
  fold_leaves_to_root();
  std::unique_ptr<TreeBuf> root = std::move(stack_.back().buf);
  stack_.clear();
  leaves_ = 0;
  Kernels<float>* dev = device_tree_ ? opt_.device : nullptr;
  auto copy = [&](float* dst, const float* src, size_t n) {
    if (dev != nullptr) {
      dev->copy(dst, src, n);
    } else {
      std::memcpy(dst, src, n * sizeof(float));
    }
  };
  // ZeRO: the folded chunk is exactly this rank's piece of the single bucket (stage 2: the shard buffer).
  float* shard = opt_.zero_stage != 2 ? nullptr : dev != nullptr ? dshard_grads_.data() : shard_grads_.data();
  if (size_ == 1) {
    copy(shard != nullptr ? shard : grads, root->data(), n_);
  } else {
    const auto t0 = Clock::now();
    std::unique_ptr<TreeBuf> recv = take_tree_buf();
    // Device memory travels over device_dp, whose stream does not order against the device's kernels: the tree's
    // additions are done before it reads, and the fold before it gathers.
    comm::Communicator& c = dev != nullptr ? *opt_.device_dp : *dp_;
    if (dev != nullptr) dev->synchronize();
    // Chunk j of every rank's root goes to rank j; rank j folds the D roots of its chunk in rank order.
    c.all_to_all(root->data(), recv->data(), chunk_, comm::DType::kFloat32);
    std::vector<float*> items;
    for (int j = 0; j < size_; ++j) items.push_back(recv->data() + static_cast<size_t>(j) * chunk_);
    if (dev != nullptr) {
      tree_sum(items, chunk_, *dev);
    } else {
      tree_sum(items, chunk_, pool_);
    }
    if (opt_.zero_stage == 0) {
      if (dev != nullptr) dev->synchronize();
      c.all_gather(recv->data(), root->data(), chunk_, comm::DType::kFloat32);
      copy(grads, root->data(), n_);
    } else {
      const auto [own_b, own_e] = layout_.own(0, rank_);
      if (own_e > own_b) copy(shard != nullptr ? shard : grads + own_b, recv->data(), own_e - own_b);
    }
    comm_seconds_ += since(t0);
    spare_.push_back(std::move(recv));
  }
  spare_.push_back(std::move(root));
}

void DataParallel::finish(float* grads) {
  if (opt_.deterministic) {
    finish_tree(grads);
    return;
  }
  if (!armed_) throw Error("data-parallel: finish() without arm()");
  armed_ = false;
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  if (enqueued_ != layout_.buckets().size()) {
    size_t missing = 0;
    for (size_t r : remaining_) missing += r;
    throw Error("data-parallel: backward reported only " + std::to_string(n_ - missing) + " of " + std::to_string(n_) +
                " gradient elements as final (the model's grad-ready hook is incomplete)");
  }
  cv_.wait(lk, [&] { return done_ == enqueued_; });
  if (opt_.stream_reducer != nullptr) opt_.stream_reducer->wait();
  if (device_spans_ && size_ > 1) device_reduce_spans();
  if (device_zero_) device_reduce_scatter();
  comm_seconds_ += since(t0);
  if (error_) std::rethrow_exception(error_);
}

void DataParallel::device_reduce_scatter() {
  Kernels<float>& k = *opt_.device;
  if (size_ == 1) {  // one replica's gradient is its own mean: stage 1 keeps the whole buffer, stage 2 copies it
    if (opt_.zero_stage == 2)
      for (const auto& bk : layout_.buckets())
        k.copy(dshard_grads_.data() + bk.shard_offset, grads_ + bk.begin, bk.size());
    return;
  }
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    const auto& bk = layout_.buckets()[b];
    // The communicator's stream does not order against the kernels': the gradients (and the previous bucket's copy
    // out of the scratch piece) must be done before it reads or writes.
    k.synchronize();
    const float* in = grads_ + bk.begin;
    if (bk.padded(size_)) {
      k.copy(dpad_in_.data(), grads_ + bk.begin, bk.size());
      k.zero(dpad_in_.data() + bk.size(), (dpad_in_.size() - bk.size()) * sizeof(float));
      k.synchronize();
      in = dpad_in_.data();
    }
    if (opt_.zero_stage == 2) {
      opt_.device_dp->reduce_scatter(in, dshard_grads_.data() + bk.shard_offset, bk.piece, comm::DType::kFloat32,
                                     comm::ReduceOp::kAvg);
      continue;
    }
    opt_.device_dp->reduce_scatter(in, dpad_out_.data(), bk.piece, comm::DType::kFloat32, comm::ReduceOp::kAvg);
    const auto [own_b, own_e] = layout_.own(b, rank_);
    if (own_e > own_b) k.copy(grads_ + own_b, dpad_out_.data(), own_e - own_b);
  }
}

double DataParallel::device_sum_squares(const float* grads) {
  // Per run of this rank's pieces (inside the count-once ranges, if any) on the device: equal to the host loop up to
  // rounding, not its bits.
  Kernels<float>& k = *opt_.device;
  double total = 0;
  const bool shard = opt_.zero_stage == 2;
  for (const ZeroAdamW::Run& r : zero_->runs()) {
    // g[i - r.begin] is element i: in the full-size buffer (stage 1) or the shard buffer (stage 2).
    const float* g = shard ? dshard_grads_.data() + r.shard_offset : grads + r.begin;
    auto add = [&](size_t b, size_t e) {
      if (e <= b) return;
      const double n = k.global_norm(g + (b - r.begin), e - b);
      total += n * n;
    };
    if (opt_.count_once.empty()) {
      add(r.begin, r.end);
      continue;
    }
    for (const auto& [ob, oe] : opt_.count_once) add(std::max(r.begin, ob), std::min(r.end, oe));
  }
  return total;
}

void DataParallel::device_update(float* params, const float* grads, float lr, float grad_scale) {
  Kernels<float>& k = *opt_.device;
  zero_->set_t(zero_->t() + 1);
  for (const ZeroAdamW::Run& r : zero_->runs()) {
    const float* g = opt_.zero_stage == 2 ? dshard_grads_.data() + r.shard_offset : grads + r.begin;
    k.adamw_update(params + r.begin, g, dm_.data() + r.shard_offset, dv_.data() + r.shard_offset, r.end - r.begin, lr,
                   hyper_.beta1, hyper_.beta2, hyper_.eps, r.decay ? hyper_.weight_decay : 0.0f, zero_->t(),
                   grad_scale);
  }
  // The host copies of m and v (checkpoints) are refreshed when state() asks for them, not here: 8 bytes per owned
  // parameter of device->host traffic saved on every step that saves nothing.
  host_stale_ = true;
  if (size_ == 1) return;
  const auto t0 = Clock::now();
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    const auto& bk = layout_.buckets()[b];
    const auto [s, e] = layout_.own(b, rank_);
    k.synchronize();  // the updated piece (and the previous bucket's copy out of the scratch) before NCCL's stream
    if (!bk.padded(size_)) {
      opt_.device_dp->all_gather(params + s, params + bk.begin, bk.piece, comm::DType::kFloat32);
      continue;
    }
    k.zero(dpad_out_.data(), bk.piece * sizeof(float));
    if (e > s) k.copy(dpad_out_.data(), params + s, e - s);
    k.synchronize();
    opt_.device_dp->all_gather(dpad_out_.data(), dpad_in_.data(), bk.piece, comm::DType::kFloat32);
    k.copy(params + bk.begin, dpad_in_.data(), bk.size());
  }
  // The other ranks' pieces arrived by collective and copy: a device's weight copy for its GEMMs (CUDA's bf16
  // set_weights copy) must be refreshed, or the next forward would run on the stale weights of those pieces.
  k.weights_changed();
  gather_seconds_ += since(t0);
}

void DataParallel::refresh_host() {
  if (!device_zero_ || !host_stale_) return;
  const size_t bytes = layout_.shard_size() * sizeof(float);
  opt_.device->to_host(zero_->m(), dm_.data(), bytes);
  opt_.device->to_host(zero_->v(), dv_.data(), bytes);
  host_stale_ = false;
}

void DataParallel::upload_host() {
  if (!device_zero_) return;
  const size_t bytes = layout_.shard_size() * sizeof(float);
  opt_.device->to_device(dm_.data(), zero_->m(), bytes);
  opt_.device->to_device(dv_.data(), zero_->v(), bytes);
  host_stale_ = false;  // device and host copies hold the same values again
}

std::vector<double> DataParallel::all_gather(const std::vector<double>& local) {
  if (size_ == 1) return local;
  const auto t0 = Clock::now();
  std::vector<double> out(local.size() * static_cast<size_t>(size_));
  // Doubles travel as their 64-bit patterns: no arithmetic on the way, so every rank gets the same bits.
  static_assert(sizeof(double) == sizeof(int64_t));
  dp_->all_gather(local.data(), out.data(), local.size(), comm::DType::kInt64);
  comm_seconds_ += since(t0);
  return out;
}

double DataParallel::grad_norm(const float* grads) {
  if (!zero_ && !opt_.group_spans.empty()) return group_spans_norm(grads);
  if (!zero_) throw Error("data-parallel: grad_norm() is the ZeRO path; without ZeRO the trainer's AdamW computes it");
  double total = 0;
  if (opt_.deterministic) {
    // Per fixed block of the flat buffer, summed in block order: the same additions whatever D is (the padding
    // blocks of the last ranks add +0.0 at the end, which changes no bits).
    const auto [own_b, own_e] = layout_.own(0, rank_);
    const float* g = opt_.zero_stage == 2 ? shard_grads_.data() : grads + own_b;
    if (device_zero_) {  // the own piece's host copy: the same double sums as the CPU's, not the device's norm
      const float* dg = opt_.zero_stage == 2 ? dshard_grads_.data() : grads + own_b;
      if (own_e > own_b) opt_.device->to_host(norm_host_.data(), dg, (own_e - own_b) * sizeof(float));
      g = norm_host_.data();
    }
    std::vector<double> blocks(layout_.buckets().front().piece / kNormBlock, 0.0);
    auto add = [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i)
        blocks[(i - own_b) / kNormBlock] += static_cast<double>(g[i - own_b]) * g[i - own_b];
    };
    if (opt_.count_once.empty()) add(own_b, own_e);
    for (const auto& [ob, oe] : opt_.count_once) {
      if (oe > own_b && ob < own_e) add(std::max(ob, own_b), std::min(oe, own_e));
    }
    for (double s : all_gather(blocks)) total += s;
  } else {
    const double local = device_zero_ ? device_sum_squares(grads)
                                      : zero_->sum_squares(opt_.zero_stage == 2 ? shard_grads_.data() : grads,
                                                           opt_.zero_stage == 2, &opt_.count_once);
    for (double s : all_gather({local})) total += s;  // rank order: the same sum on every rank
  }
  // Model-parallel peers hold other parts of the replica: their sums are added in group rank order.
  for (comm::Communicator* g : opt_.norm_groups) {
    if (g == nullptr || g->size() == 1) continue;
    std::vector<double> all(static_cast<size_t>(g->size()));
    g->all_gather(&total, all.data(), 1, comm::DType::kInt64);
    total = 0;
    for (double s : all) total += s;
  }
  return std::sqrt(total);
}

void DataParallel::update(float* params, const float* grads, float lr, float grad_scale) {
  if (!zero_) throw Error("data-parallel: update() is the ZeRO path; without ZeRO the trainer's AdamW updates");
  if (device_zero_) {
    device_update(params, grads, lr, grad_scale);
    return;
  }
  zero_->update(params, opt_.zero_stage == 2 ? shard_grads_.data() : grads, opt_.zero_stage == 2, lr, grad_scale);
  if (size_ == 1) return;
  const auto t0 = Clock::now();
  for (size_t b = 0; b < layout_.buckets().size(); ++b) {
    const auto& k = layout_.buckets()[b];
    const auto [s, e] = layout_.own(b, rank_);
    if (!k.padded(size_)) {
      // Our piece is chunk rank() of the output already: all_gather allows that alias.
      dp_->all_gather(params + s, params + k.begin, k.piece, comm::DType::kFloat32);
      continue;
    }
    std::memset(pad_out_.data(), 0, k.piece * sizeof(float));
    if (e > s) std::memcpy(pad_out_.data(), params + s, (e - s) * sizeof(float));
    dp_->all_gather(pad_out_.data(), pad_in_.data(), k.piece, comm::DType::kFloat32);
    std::memcpy(params + k.begin, pad_in_.data(), k.size() * sizeof(float));
  }
  gather_seconds_ += since(t0);
}

std::unique_ptr<DataParallel> gpt_data_parallel(comm::Communicator* dp, const GptConfig& model,
                                                const TrainConfig& train, ThreadPool& pool,
                                                const DataParallelOptions& options) {
  const AdamWHyper hyper{train.beta1, train.beta2, train.eps, static_cast<float>(train.weight_decay)};
  return std::make_unique<DataParallel>(dp, num_parameters(model), gpt_tensor_spans(model), hyper, pool, options);
}

std::vector<DataParallelOptions::GroupSpan> expert_group_spans(const GptConfig& local, comm::Communicator* expert_dp,
                                                               comm::Communicator* ep) {
  if (local.moe.experts <= 0 || local.moe.expert_shards <= 1) return {};
  const auto sizes = param_sizes(local);
  size_t offset = 0, count = 0;
  for (int i = 0; i < 10; ++i) offset += sizes[i];
  for (int i = 10; i < 14; ++i) count += sizes[i];  // fcw, fcb, fcprojw, fcprojb
  return {{offset, count, expert_dp, ep}};
}

double DataParallel::take_comm_seconds() {
  const double s = comm_seconds_;
  comm_seconds_ = 0;
  return s;
}

double DataParallel::take_gather_seconds() {
  const double s = gather_seconds_;
  gather_seconds_ = 0;
  return s;
}

size_t DataParallel::bytes_saved() const {
  if (!zero_ || size_ == 1) return 0;
  const size_t not_held = n_ > layout_.shard_size() ? n_ - layout_.shard_size() : 0;
  return not_held * sizeof(float) * (opt_.zero_stage == 2 ? 3 : 2);
}

std::string DataParallel::describe() const {
  char buf[256];
  const auto& b = layout_.buckets();
  std::snprintf(buf, sizeof(buf), "dp=%d zero=%d%s buckets=%zu x %.2f MiB, optimizer state saved %.2f MiB/rank", size_,
                opt_.zero_stage,
                device_tree_          ? " deterministic, device buffers"
                : opt_.deterministic  ? " deterministic"
                : device_zero_        ? " device buffers (reduce-scatter after backward)"
                : device_spans_       ? " device buffers (stream-ordered, overlapped; expert spans after backward)"
                : opt_.stream_reducer ? " device buffers (stream-ordered, overlapped)"
                                      : "",
                b.size(), static_cast<double>(b.front().size() * sizeof(float)) / 1048576.0,
                static_cast<double>(bytes_saved()) / 1048576.0);
  return buf;
}

}  // namespace railyard::worker::parallel
