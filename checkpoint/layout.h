// Which hyper-rectangles of each tensor a rank of a (dp, tp, pp, zero) world holds, and which of them it writes.
// This is the only place that knows about parallelism; the writer and reader only see boxes. Rules are a small
// table keyed by tensor name ("split dimension d into tp parts"), with the GPT (llm.c order) table built in.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/format.h"

namespace railyard::ckpt {

// Rank grid with tensor-parallel fastest-varying: rank = tp_rank + tp * (dp_rank + dp * pp_rank).
struct Layout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero = 0;  // 0: optimizer state replicated across dp; >= 1: split across dp (ZeRO-1)

  int world_size() const { return dp * tp * pp; }
  nlohmann::json to_json() const;
  static Layout from_json(const nlohmann::json& j);  // throws railyard::Error naming the bad field
  void validate() const;                             // throws railyard::ConfigError
};

struct RankCoord {
  int dp = 0, tp = 0, pp = 0;
};
RankCoord coord_of(const Layout& l, int rank);
int rank_of(const Layout& l, const RankCoord& c);

// Where a tensor lives in the pipeline.
enum class Stage { Layers, First, Last };

struct SplitRule {
  std::string pattern;  // tensor base name (after the last '/'); '*' matches any run of characters
  Stage stage = Stage::Layers;
  int layer_dim = -1;  // with Stage::Layers: the layer dimension, split into pp contiguous parts
  int tp_dim = -1;     // split into tp parts (-1: replicated across tp)
  int tp_groups = 1;   // tp_dim holds this many stacked blocks (qkv: 3), each split into tp parts
};

// llm.c GPT-2: wte vocab-parallel (stage first), wpe (first), qkv/fc column-parallel, attproj/fcproj
// row-parallel, layer norms and row-parallel biases replicated, lnf (last).
std::vector<SplitRule> gpt_rules();

// A tensor of the model state. Optimizer state uses the parameter's name with a prefix ("adam_m/qkvw") and
// matches the same rule; names starting with one of the optimizer prefixes are split by ZeRO when zero >= 1.
struct TensorDef {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};

// GPT-2 parameters in llm.c order (and AdamW m, v as "adam_m/<name>", "adam_v/<name>" when with_optimizer).
std::vector<TensorDef> gpt_tensor_defs(int layers, int channels, int max_seq_len, int padded_vocab,
                                       bool with_optimizer);

// For a buffer holding every tensor in full, concatenated in definition order (llm.c's flat parameter buffer,
// or params followed by m and v): the per-tensor pointers into it, as (name, dtype, global shape, pointer).
struct FlatView {
  TensorDef def;
  void* data;
};
std::vector<FlatView> flat_views(const std::vector<TensorDef>& defs, void* base);

inline const std::vector<std::string>& optimizer_prefixes() {
  static const std::vector<std::string> p = {"adam_m/", "adam_v/", "opt/"};
  return p;
}

// One box of one tensor held by a rank. Ranks holding the same box are replicas; the writer splits a replicated
// box among them so each element is written once.
struct PlacedBox {
  std::string tensor;
  Box box;
  int replica_index = 0;
  int num_replicas = 1;
};

// Every box `rank` holds under `layout`. Throws railyard::ConfigError when a tensor matches no rule.
std::vector<PlacedBox> rank_boxes(const Layout& layout, int rank, const std::vector<TensorDef>& defs,
                                  const std::vector<SplitRule>& rules = gpt_rules());

const SplitRule& match_rule(const std::string& tensor, const std::vector<SplitRule>& rules);

}  // namespace railyard::ckpt
