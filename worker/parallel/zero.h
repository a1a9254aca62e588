// ZeRO over the data-parallel group (docs/parallel.md "Data parallelism and ZeRO"): how the flat gradient buffer is
// cut into reduction buckets and per-rank pieces, and AdamW on this rank's pieces only (stage 1: moments sharded;
// stage 2: the reduced gradient is kept only as this rank's shard too).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_config.h"
#include "worker/optim/adamw.h"

namespace railyard::worker::parallel {

// One parameter tensor's span of a flat buffer and whether AdamW decays it.
struct TensorSpan {
  size_t offset = 0, count = 0;
  bool decay = false;
};
// Consecutive spans of the 16 llm.c tensors with these element counts (tensors of size 0 are left out), with
// AdamW's decay rule (adamw.h decays()).
std::vector<TensorSpan> tensor_spans(const std::array<size_t, kNumParamTensors>& sizes);
// The full llm.c buffer (gpt_config.h order), and with experts the MoE router after lnfb (a matrix: decayed, as
// AdamW does in one process).
inline std::vector<TensorSpan> gpt_tensor_spans(const GptConfig& c) {
  std::vector<TensorSpan> spans = tensor_spans(param_sizes(c));
  if (router_size(c) > 0) spans.push_back({router_offset(c), router_size(c), true});
  return spans;
}

// The flat buffer [0, n) cut into buckets of about `bucket_elems` elements, each a multiple of the dp degree D except
// the last. Rank r owns piece r of every bucket: [begin + r*piece, min(end, begin + (r+1)*piece)). The shard of a
// rank is its pieces back to back, each `piece` long (the last bucket's pieces may be padded), so reduce-scatter and
// all-gather work on whole buckets.
class BucketLayout {
 public:
  struct Bucket {
    size_t begin = 0, end = 0;
    size_t piece = 0;         // ceil((end - begin) / D)
    size_t shard_offset = 0;  // where its piece sits in a rank's shard
    size_t size() const { return end - begin; }
    bool padded(int dp) const { return piece * static_cast<size_t>(dp) != size(); }
  };
  // align: every piece a multiple of this many elements (the deterministic mode's fixed norm blocks).
  BucketLayout(size_t n, int dp, size_t bucket_elems, size_t align = 1);

  size_t num_elements() const { return n_; }
  int dp() const { return dp_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  size_t shard_size() const { return shard_size_; }
  // Rank r's piece of bucket b as a [begin, end) range of the flat buffer (may be empty for the last bucket).
  std::pair<size_t, size_t> own(size_t b, int r) const;
  // The bucket holding element i.
  size_t bucket_of(size_t i) const;

 private:
  size_t n_;
  int dp_;
  size_t per_bucket_;
  std::vector<Bucket> buckets_;
  size_t shard_size_ = 0;
};

// AdamW (the same arithmetic as worker/optim/adamw.h) over one rank's pieces of a BucketLayout.
class ZeroAdamW {
 public:
  ZeroAdamW(const BucketLayout& layout, int rank, std::vector<TensorSpan> spans, const AdamWHyper& hyper,
            ThreadPool& pool);
  // grads: the full flat buffer (stage 1: reduced values at this rank's pieces) or, shard_layout, this rank's shard
  // (stage 2). Updates this rank's pieces of params only.
  void update(float* params, const float* grads, bool shard_layout, float lr, float grad_scale);
  // Sum of squares of this rank's pieces of the reduced gradient, in double over a fixed order; with `only` (sorted,
  // disjoint [begin, end) ranges of the flat buffer, e.g. a tensor-parallel stage's count-once ranges) just the
  // elements inside them.
  double sum_squares(const float* grads, bool shard_layout,
                     const std::vector<std::pair<size_t, size_t>>* only = nullptr) const;

  // This rank's pieces split at tensor boundaries: [begin, end) of the flat buffer, where `begin` sits in the shard,
  // and whether AdamW decays the tensor (the device update of ZeRO-1 on device buffers walks the same runs).
  struct Run {
    size_t begin = 0, end = 0, shard_offset = 0;
    bool decay = false;
  };
  std::vector<Run> runs() const;

  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  size_t size() const { return m_.size(); }
  int64_t t() const { return t_; }
  void set_t(int64_t t) { t_ = t; }

 private:
  // Calls f(global_begin, global_end, shard_offset_of_begin, decay) for every piece of this rank split at tensor
  // boundaries.
  template <typename F>
  void for_each_run(F&& f) const;

  const BucketLayout& layout_;
  int rank_;
  std::vector<TensorSpan> spans_;
  AdamWHyper hyper_;
  ThreadPool& pool_;
  AlignedBuffer<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace railyard::worker::parallel
