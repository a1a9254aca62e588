#include "worker/parallel/stage_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "common/error.h"

namespace railyard::worker::parallel {

StageCosts stage_costs(const GptConfig& c, int seq_len) {
  const double C = c.channels, T = seq_len, Vp = c.padded_vocab_size;
  StageCosts k;
  k.layer = 3.0 * (24.0 * C * C + 4.0 * T * C);
  k.embedding = 3.0 * C;
  k.head = 3.0 * (2.0 * C * Vp + 5.0 * Vp + 10.0 * C);
  return k;
}

namespace {

void check_pipeline_degree(const GptConfig& c, int pp) {
  if (pp < 1 || pp > c.num_layers) {
    throw ConfigError("pipeline degree pp=" + std::to_string(pp) + " must be in 1.." + std::to_string(c.num_layers) +
                      " (the model's layers): every stage holds at least one layer");
  }
}

double cost_of(const StageCosts& k, int layers, bool first, bool last) {
  return layers * k.layer + (first ? k.embedding : 0.0) + (last ? k.head : 0.0);
}

}  // namespace

double stage_cost(const StageCosts& k, const std::vector<int>& b, int s) {
  const int pp = static_cast<int>(b.size()) - 1;
  return cost_of(k, b[s + 1] - b[s], s == 0, s == pp - 1);
}

std::vector<int> balance_stages(const GptConfig& c, int seq_len, int pp) {
  const int L = c.num_layers;
  check_pipeline_degree(c, pp);
  const StageCosts k = stage_costs(c, seq_len);
  const double inf = std::numeric_limits<double>::infinity();
  // Both passes below are dynamic programs over (stages s, layers j): stage s-1 takes layers [i, j) after stages
  // 0..s-2 took [0, i); the head is added when s == pp.
  auto sweep = [&](auto&& relax) {
    for (int s = 1; s <= pp; ++s) {
      for (int j = s; j <= L - (pp - s); ++j) {
        for (int i = s - 1; i < j; ++i) relax(s, j, i, cost_of(k, j - i, s == 1, s == pp));
      }
    }
  };
  // best[s][j]: the smallest possible maximum stage cost when stages 0..s-1 hold layers [0, j).
  std::vector<std::vector<double>> best(pp + 1, std::vector<double>(L + 1, inf));
  best[0][0] = 0;
  sweep([&](int s, int j, int i, double here) {
    if (best[s - 1][i] != inf) best[s][j] = std::min(best[s][j], std::max(best[s - 1][i], here));
  });
  const double target = best[pp][L] * (1 + 1e-12);
  // Second pass: among the splits whose every stage stays within that bottleneck, the most even one (smallest sum
  // of squared stage costs); ties go to the split found first (fewer layers on earlier stages).
  std::vector<std::vector<double>> sq(pp + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> from(pp + 1, std::vector<int>(L + 1, -1));
  sq[0][0] = 0;
  sweep([&](int s, int j, int i, double here) {
    if (sq[s - 1][i] == inf || here > target) return;
    const double v = sq[s - 1][i] + here * here;
    if (v < sq[s][j]) {
      sq[s][j] = v;
      from[s][j] = i;
    }
  });
  if (from[pp][L] < 0) throw Error("balance_stages: internal error (no feasible split)");
  std::vector<int> b(pp + 1, 0);
  b[pp] = L;
  for (int s = pp; s >= 1; --s) b[s - 1] = from[s][b[s]];
  return b;
}

int StageShape::valid_local_vocab() const { return std::clamp(config.vocab_size - vocab_begin(), 0, local_vocab()); }

void validate_layout(const GptConfig& c, int tp, int pp) {
  if (tp < 1) throw ConfigError("tensor-parallel degree tp=" + std::to_string(tp) + " must be >= 1");
  if (c.num_heads % tp != 0) {
    throw ConfigError("tensor-parallel degree tp=" + std::to_string(tp) + " must divide the model's heads NH=" +
                      std::to_string(c.num_heads) + " (each rank holds whole heads): pick tp among its divisors");
  }
  if (c.padded_vocab_size % tp != 0) {
    throw ConfigError("tensor-parallel degree tp=" + std::to_string(tp) + " must divide the padded vocabulary Vp=" +
                      std::to_string(c.padded_vocab_size) + " (the embedding is split by vocabulary rows)");
  }
  check_pipeline_degree(c, pp);
}

StageShape make_stage_shape(const GptConfig& c, int seq_len, int tp_size, int tp_rank, int pp_size, int pp_rank,
                            const std::vector<int>& boundaries) {
  validate_layout(c, tp_size, pp_size);
  if (tp_rank < 0 || tp_rank >= tp_size || pp_rank < 0 || pp_rank >= pp_size) {
    throw ConfigError("rank coordinate tp=" + std::to_string(tp_rank) + " pp=" + std::to_string(pp_rank) +
                      " is outside the layout tp=" + std::to_string(tp_size) + " pp=" + std::to_string(pp_size));
  }
  std::vector<int> b = boundaries.empty() ? balance_stages(c, seq_len, pp_size) : boundaries;
  bool ok = static_cast<int>(b.size()) == pp_size + 1 && b.front() == 0 && b.back() == c.num_layers;
  for (size_t i = 1; ok && i < b.size(); ++i) ok = b[i] > b[i - 1];
  if (!ok) {
    throw ConfigError("stage boundaries must be " + std::to_string(pp_size + 1) +
                      " increasing layer indices from 0 to L=" + std::to_string(c.num_layers));
  }
  StageShape s;
  s.config = c;
  s.tp_size = tp_size;
  s.tp_rank = tp_rank;
  s.pp_size = pp_size;
  s.pp_rank = pp_rank;
  s.layer_begin = b[pp_rank];
  s.layer_end = b[pp_rank + 1];
  return s;
}

std::array<size_t, kNumParamTensors> local_param_sizes(const StageShape& s) {
  const size_t C = s.config.channels, Cl = s.local_channels(), Ls = s.layers(), Vl = s.local_vocab();
  const size_t maxT = s.config.max_seq_len;
  const bool has_wte = s.first() || s.last();
  std::array<size_t, kNumParamTensors> sizes = {
      has_wte ? Vl * C : 0,      // wte (Vl, C)
      s.first() ? maxT * C : 0,  // wpe (maxT, C)
      Ls * C,
      Ls * C,           // ln1w, ln1b (Ls, C)
      Ls * 3 * Cl * C,  // qkvw (Ls, 3Cl, C): q|k|v rows of this rank's heads
      Ls * 3 * Cl,      // qkvb (Ls, 3Cl)
      Ls * C * Cl,      // attprojw (Ls, C, Cl): the input columns of this rank's heads
      Ls * C,           // attprojb (Ls, C), replicated
      Ls * C,
      Ls * C,             // ln2w, ln2b
      Ls * 4 * Cl * C,    // fcw (Ls, 4Cl, C)
      Ls * 4 * Cl,        // fcb (Ls, 4Cl)
      Ls * C * 4 * Cl,    // fcprojw (Ls, C, 4Cl)
      Ls * C,             // fcprojb (Ls, C), replicated
      s.last() ? C : 0,   // lnfw
      s.last() ? C : 0};  // lnfb
  // Mixture of experts: every rank holds all E experts of its stage's layers whole (not tensor-sharded)
  if (const size_t E = s.config.moe.experts; E > 0) {
    sizes[10] = Ls * E * 4 * C * C;  // fcw (Ls, E, 4C, C)
    sizes[11] = Ls * E * 4 * C;      // fcb (Ls, E, 4C)
    sizes[12] = Ls * E * C * 4 * C;  // fcprojw (Ls, E, C, 4C)
    sizes[13] = Ls * E * C;          // fcprojb (Ls, E, C)
  }
  return sizes;
}

size_t local_router_size(const StageShape& s) {
  return s.config.moe.experts > 0 ? static_cast<size_t>(s.layers()) * s.config.moe.experts * s.config.channels : 0;
}

size_t local_num_params(const StageShape& s) {
  size_t n = local_router_size(s);
  for (size_t v : local_param_sizes(s)) n += v;
  return n;
}

size_t ShardSlice::numel() const {
  size_t n = 1;
  for (size_t e : extent) n *= e;
  return n;
}

std::vector<ShardSlice> make_shard_map(const StageShape& s) {
  const GptConfig& c = s.config;
  const size_t C = c.channels, Cl = s.local_channels(), L = c.num_layers, Ls = s.layers(), l0 = s.layer_begin;
  const size_t r = s.tp_rank, Vl = s.local_vocab(), Vp = c.padded_vocab_size, maxT = c.max_seq_len;
  const auto sizes = local_param_sizes(s);
  std::array<size_t, kNumParamTensors> base{};
  for (int i = 1; i < kNumParamTensors; ++i) base[i] = base[i - 1] + sizes[i - 1];

  std::vector<ShardSlice> map;
  auto add = [&](int t, std::vector<size_t> shape, std::vector<size_t> off, std::vector<size_t> ext, size_t local,
                 bool replicated) {
    ShardSlice sl;
    sl.tensor = t;
    sl.global_shape = std::move(shape);
    sl.offset = std::move(off);
    sl.extent = std::move(ext);
    sl.local_offset = local;
    sl.tp_replicated = replicated;
    map.push_back(std::move(sl));
  };
  if (sizes[0] > 0) {
    add(0, {Vp, C}, {r * Vl, 0}, {Vl, C}, base[0], false);
    map.back().tied_copy = s.last() && !s.first();
  }
  if (sizes[1] > 0) add(1, {maxT, C}, {0, 0}, {maxT, C}, base[1], true);
  const size_t E = c.moe.experts;
  for (int t : {2, 3, 7, 8, 9, 13}) {
    if (t == 13 && E > 0) continue;                   // the experts' fcprojb: below
    add(t, {L, C}, {l0, 0}, {Ls, C}, base[t], true);  // layernorms, replicated biases
  }
  for (size_t l = 0; l < Ls; ++l) {
    for (size_t j = 0; j < 3; ++j) {  // q, k, v rows of this rank's heads
      add(4, {L, 3 * C, C}, {l0 + l, j * C + r * Cl, 0}, {1, Cl, C}, base[4] + (l * 3 * Cl + j * Cl) * C, false);
      add(5, {L, 3 * C}, {l0 + l, j * C + r * Cl}, {1, Cl}, base[5] + l * 3 * Cl + j * Cl, false);
    }
  }
  add(6, {L, C, C}, {l0, 0, r * Cl}, {Ls, C, Cl}, base[6], false);
  if (E > 0) {
    // Experts and router whole on every tp rank (replicated; with sequence parallelism their gradients are summed
    // over tp before they are final): global slices of the layers held, every expert.
    add(10, {L, E, 4 * C, C}, {l0, 0, 0, 0}, {Ls, E, 4 * C, C}, base[10], true);
    add(11, {L, E, 4 * C}, {l0, 0, 0}, {Ls, E, 4 * C}, base[11], true);
    add(12, {L, E, C, 4 * C}, {l0, 0, 0, 0}, {Ls, E, C, 4 * C}, base[12], true);
    add(13, {L, E, C}, {l0, 0, 0}, {Ls, E, C}, base[13], true);
    add(kRouterTensor, {L, E, C}, {l0, 0, 0}, {Ls, E, C}, base[15] + sizes[15], true);
  } else {
    add(10, {L, 4 * C, C}, {l0, r * 4 * Cl, 0}, {Ls, 4 * Cl, C}, base[10], false);
    add(11, {L, 4 * C}, {l0, r * 4 * Cl}, {Ls, 4 * Cl}, base[11], false);
    add(12, {L, C, 4 * C}, {l0, 0, r * 4 * Cl}, {Ls, C, 4 * Cl}, base[12], false);
  }
  if (sizes[14] > 0) {
    add(14, {C}, {0}, {C}, base[14], true);
    add(15, {C}, {0}, {C}, base[15], true);
  }
  std::sort(map.begin(), map.end(),
            [](const ShardSlice& a, const ShardSlice& b) { return a.local_offset < b.local_offset; });
  return map;
}

namespace {

// Calls fn(global_element_offset, local_element_offset, run_length) for each contiguous run of a slice.
template <typename F>
void for_each_run(const ShardSlice& sl, const std::array<size_t, kNumParamTensors + 1>& tensor_base, F&& fn) {
  const size_t nd = sl.global_shape.size();
  std::vector<size_t> stride(nd, 1);
  for (size_t d = nd - 1; d-- > 0;) stride[d] = stride[d + 1] * sl.global_shape[d + 1];
  const size_t run = sl.extent[nd - 1];
  const size_t rows = sl.numel() / run;
  std::vector<size_t> idx(nd, 0);  // index within the slice over the leading nd-1 dims
  for (size_t row = 0; row < rows; ++row) {
    size_t g = tensor_base[sl.tensor] + sl.offset[nd - 1];
    for (size_t d = 0; d + 1 < nd; ++d) g += (sl.offset[d] + idx[d]) * stride[d];
    fn(g, sl.local_offset + row * run, run);
    for (size_t d = nd - 1; d-- > 0;) {  // odometer over the leading dims
      if (++idx[d] < sl.extent[d]) break;
      idx[d] = 0;
    }
  }
}

// The 16 tensors' offsets in the full buffer, then the router's (kRouterTensor).
std::array<size_t, kNumParamTensors + 1> full_bases(const GptConfig& c) {
  const auto sizes = param_sizes(c);
  std::array<size_t, kNumParamTensors + 1> base{};
  for (int i = 1; i < kNumParamTensors; ++i) base[i] = base[i - 1] + sizes[i - 1];
  base[kRouterTensor] = router_offset(c);
  return base;
}

}  // namespace

void copy_full_to_local(const std::vector<ShardSlice>& map, const GptConfig& c, const float* full, float* local) {
  const auto base = full_bases(c);
  for (const ShardSlice& sl : map) {
    for_each_run(sl, base, [&](size_t g, size_t l, size_t n) { std::memcpy(local + l, full + g, n * sizeof(float)); });
  }
}

void copy_local_to_full(const std::vector<ShardSlice>& map, const GptConfig& c, const float* local, float* full) {
  const auto base = full_bases(c);
  for (const ShardSlice& sl : map) {
    for_each_run(sl, base, [&](size_t g, size_t l, size_t n) { std::memcpy(full + g, local + l, n * sizeof(float)); });
  }
}

std::vector<ElementRange> count_once_ranges(const std::vector<ShardSlice>& map, int tp_rank) {
  std::vector<ElementRange> out;
  for (const ShardSlice& sl : map) {
    if (sl.tied_copy || (sl.tp_replicated && tp_rank != 0)) continue;
    const size_t b = sl.local_offset, e = b + sl.numel();
    if (!out.empty() && out.back().end == b) {
      out.back().end = e;
    } else {
      out.push_back({b, e});
    }
  }
  return out;
}

}  // namespace railyard::worker::parallel
