#include "worker/kernels/cuda/launch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace railyard::worker::cuda {
namespace {

constexpr size_t kMaxGridX = static_cast<size_t>(std::numeric_limits<int32_t>::max());

unsigned grid_for(size_t blocks, const char* what) {
  if (blocks > kMaxGridX) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(blocks) +
                                " blocks exceed the CUDA grid limit 2^31-1: split the batch");
  }
  return static_cast<unsigned>(blocks);
}

}  // namespace

Launch elementwise_launch(size_t n) {
  Launch l;
  l.block = kElementwiseBlock;
  l.grid = static_cast<unsigned>(std::min<size_t>(ceil_div(n, kElementwiseBlock), kMaxElementwiseGrid));
  return l;
}

Launch rows_launch(size_t rows) {
  Launch l;
  l.block = kRowsPerBlock * kWarpSize;
  l.grid = grid_for(ceil_div(rows, kRowsPerBlock), "rows_launch");
  return l;
}

Launch crossentropy_launch(size_t rows) {
  Launch l;
  l.block = kCrossEntropyBlock;
  l.grid = grid_for(rows, "crossentropy_launch (N rows)");
  return l;
}

Launch columns_launch(size_t columns) {
  Launch l;
  l.block = kElementwiseBlock;
  l.grid = grid_for(ceil_div(columns, kElementwiseBlock), "columns_launch");
  return l;
}

void token_rows(const int32_t* ids, size_t N, TokenRows& out, int32_t lo, int32_t hi) {
  if (hi <= lo)
    throw std::invalid_argument("token_rows: empty id range [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
  auto held = [&](int32_t id) { return id >= lo && id < hi; };
  int32_t max_id = -1;  // relative to lo
  size_t kept = 0;
  for (size_t r = 0; r < N; ++r) {
    if (ids[r] < 0) throw std::invalid_argument("token_rows: negative token id " + std::to_string(ids[r]));
    if (!held(ids[r])) continue;
    max_id = std::max(max_id, ids[r] - lo);
    ++kept;
  }
  const size_t V = static_cast<size_t>(max_id) + 1;
  std::vector<int32_t>& first = out.counts;  // first[t]: kept rows with a token below t, i.e. where t's rows start
  first.assign(V + 1, 0);
  for (size_t r = 0; r < N; ++r) {
    if (held(ids[r])) ++first[static_cast<size_t>(ids[r] - lo) + 1];
  }
  for (size_t t = 0; t < V; ++t) first[t + 1] += first[t];
  out.tokens.clear();
  out.starts.clear();
  for (size_t t = 0; t < V; ++t) {
    if (first[t + 1] == first[t]) continue;
    out.tokens.push_back(static_cast<int32_t>(t));
    out.starts.push_back(first[t]);
  }
  out.starts.push_back(static_cast<int32_t>(kept));
  // Stable: rows visited in ascending order, each taking its token's next slot.
  out.rows.assign(kept, 0);
  for (size_t r = 0; r < N; ++r) {
    if (held(ids[r]))
      out.rows[static_cast<size_t>(first[static_cast<size_t>(ids[r] - lo)]++)] = static_cast<int32_t>(r);
  }
}

EncoderBackwardLaunch encoder_backward_launch(size_t distinct_tokens, int C) {
  EncoderBackwardLaunch l;
  if (distinct_tokens == 0 || C <= 0) return l;
  l.block = kElementwiseBlock;
  l.grid_x = grid_for(distinct_tokens, "encoder_backward_launch (distinct tokens)");
  l.grid_y = static_cast<unsigned>(ceil_div(static_cast<size_t>(C), kElementwiseBlock));
  return l;
}

Launch column_sums_launch(size_t columns) {
  Launch l;
  l.block = kWarpSize * kColumnSumRowLanes;
  l.grid = grid_for(ceil_div(columns, kWarpSize), "column_sums_launch");
  l.smem_bytes = 0;  // static: kColumnSumRowLanes x 32 floats
  return l;
}

LayernormBackwardPlan layernorm_backward_plan(size_t N, int C) {
  if (C <= 0) throw std::invalid_argument("layernorm_backward: C must be positive, got " + std::to_string(C));
  LayernormBackwardPlan p;
  const size_t chunks = ceil_div(N, kLayernormRowsPerChunk);
  if (chunks > 65535) {
    throw std::invalid_argument("layernorm_backward: N=" + std::to_string(N) + " rows need " + std::to_string(chunks) +
                                " chunks, above the grid.y limit 65535: split the batch");
  }
  p.chunks = static_cast<unsigned>(chunks);
  p.partials = columns_launch(static_cast<size_t>(C));
  p.partials_grid_y = p.chunks;
  p.scratch_floats = 2 * chunks * static_cast<size_t>(C);
  return p;
}

AttentionPlan attention_plan(int B, int Tn, int C, int NH) {
  auto positive = [](int v, const char* name) {
    if (v <= 0)
      throw std::invalid_argument(std::string("attention: ") + name + " must be positive, got " + std::to_string(v));
  };
  positive(B, "B");
  positive(Tn, "T");
  positive(C, "C");
  positive(NH, "NH");
  if (C % NH != 0) {
    throw std::invalid_argument("attention: C=" + std::to_string(C) + " is not a multiple of NH=" + std::to_string(NH) +
                                ": choose heads that divide the hidden size");
  }
  AttentionPlan p;
  p.head_size = C / NH;
  p.per_lane = static_cast<int>(ceil_div(static_cast<size_t>(p.head_size), kWarpSize));
  if (p.per_lane > kMaxPerLane) {
    throw std::invalid_argument(
        "attention: head size C/NH=" + std::to_string(p.head_size) +
        " exceeds 128, the largest the CUDA attention kernels hold in registers: use more heads");
  }
  const size_t hs = static_cast<size_t>(p.head_size);
  const size_t bh = static_cast<size_t>(B) * static_cast<size_t>(NH);
  p.row_blocks = static_cast<unsigned>(ceil_div(static_cast<size_t>(Tn), kRowsPerBlock));
  const unsigned grid = grid_for(bh * p.row_blocks, "attention (B*NH*ceil(T/8) blocks)");
  const unsigned block = kRowsPerBlock * kWarpSize;
  p.forward = {grid, block, 2 * kAttentionTile * hs * sizeof(float)};
  p.backward_dq = p.forward;
  p.backward_dkv = {grid, block, (2 * kAttentionTile * hs + 2 * kAttentionTile) * sizeof(float)};
  p.lse_floats = bh * static_cast<size_t>(Tn);
  p.scratch_floats = p.lse_floats;
  p.backward_d = rows_launch(p.lse_floats);
  return p;
}

size_t gemm_workspace_bytes(int sm_major) { return (sm_major >= 9 ? 32u : 4u) * 1024u * 1024u; }

int64_t weight_copy_offset(uintptr_t base, size_t base_elems, uintptr_t w, size_t w_elems) {
  constexpr uintptr_t kElem = sizeof(float);
  if (base == 0 || w_elems == 0 || w < base || (w - base) % kElem != 0) return -1;
  const size_t offset = (w - base) / kElem;
  if (offset > base_elems || w_elems > base_elems - offset) return -1;
  if (offset % 8 != 0) return -1;  // 8 bf16 = 16 bytes
  return static_cast<int64_t>(offset);
}

bool gelu_aux_epilogue_ok(int OC, bool has_bias) { return has_bias && OC > 0 && OC % 8 == 0; }

AdamWConstants adamw_constants(float lr, float beta1, float beta2, float weight_decay, int64_t t) {
  if (t < 1)
    throw std::invalid_argument("adamw: step t must be >= 1 (1 on the first update), got " + std::to_string(t));
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), static_cast<double>(t)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), static_cast<double>(t)));
  AdamWConstants c;
  c.step_size = lr / bc1;
  c.bc2_sqrt = std::sqrt(bc2);
  c.decay = 1.0f - lr * weight_decay;
  return c;
}

}  // namespace railyard::worker::cuda
