#include "checkpoint/layout.h"

#include <string_view>

#include "common/error.h"

namespace railyard::ckpt {
namespace {

bool glob_match(std::string_view pat, std::string_view s) {
  if (pat.empty()) return s.empty();
  if (pat[0] == '*') {
    for (size_t i = 0; i <= s.size(); ++i) {
      if (glob_match(pat.substr(1), s.substr(i))) return true;
    }
    return false;
  }
  return !s.empty() && pat[0] == s[0] && glob_match(pat.substr(1), s.substr(1));
}

bool is_optimizer(const std::string& name) {
  for (const auto& p : optimizer_prefixes()) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

std::string prefix_of(const std::string& name) {
  size_t slash = name.rfind('/');
  return slash == std::string::npos ? std::string() : name.substr(0, slash + 1);
}

// The boxes of one tensor held by the model-parallel (tp, pp) shard, before any dp/ZeRO consideration, and
// whether they are replicated across tp.
struct ModelShard {
  std::vector<Box> boxes;
  bool tp_replicated = false;
};

ModelShard model_shard(const Layout& l, const RankCoord& c, const TensorDef& def, const SplitRule& rule) {
  ModelShard out;
  const int nd = static_cast<int>(def.shape.size());
  Box box = full_box(def.shape);
  switch (rule.stage) {
    case Stage::First:
      if (c.pp != 0) return out;
      break;
    case Stage::Last:
      if (c.pp != l.pp - 1) return out;
      break;
    case Stage::Layers:
      if (rule.layer_dim >= 0) {
        if (rule.layer_dim >= nd) {
          throw ConfigError("tensor " + def.name + shape_to_string(def.shape) + ": layout rule '" + rule.pattern +
                            "' splits layers on dimension " + std::to_string(rule.layer_dim) + " it does not have");
        }
        box = split_box(box, rule.layer_dim, l.pp, c.pp);
      } else if (c.pp != 0) {
        return out;
      }
      break;
  }
  if (rule.tp_dim < 0) {
    out.tp_replicated = true;
    out.boxes.push_back(box);
    return out;
  }
  if (rule.tp_dim >= nd) {
    throw ConfigError("tensor " + def.name + shape_to_string(def.shape) + ": layout rule '" + rule.pattern +
                      "' splits tensor-parallel dimension " + std::to_string(rule.tp_dim) + " it does not have");
  }
  const auto d = static_cast<size_t>(rule.tp_dim);
  const int64_t n = def.shape[d];
  if (n % (static_cast<int64_t>(rule.tp_groups) * l.tp) != 0) {
    throw ConfigError("tensor " + def.name + shape_to_string(def.shape) + ": dimension " + std::to_string(rule.tp_dim) +
                      " (" + std::to_string(n) + " in " + std::to_string(rule.tp_groups) +
                      " blocks) is not divisible by tp=" + std::to_string(l.tp) + ": choose a tp that divides it");
  }
  const int64_t g = n / rule.tp_groups;
  for (int k = 0; k < rule.tp_groups; ++k) {
    Box group = box;
    group.offset[d] = k * g;
    group.size[d] = g;
    out.boxes.push_back(split_box(group, rule.tp_dim, l.tp, c.tp));
  }
  return out;
}

}  // namespace

nlohmann::json Layout::to_json() const { return {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"zero", zero}}; }

Layout Layout::from_json(const nlohmann::json& j) {
  Layout l;
  if (!j.is_object()) throw Error("layout must be an object with dp, tp, pp, zero");
  auto get = [&](const char* key, int fallback) {
    if (!j.contains(key)) return fallback;
    if (!j.at(key).is_number_integer()) throw Error(std::string("layout.") + key + " must be an integer");
    return j.at(key).get<int>();
  };
  l.dp = get("dp", 1);
  l.tp = get("tp", 1);
  l.pp = get("pp", 1);
  l.zero = get("zero", 0);
  l.validate();
  return l;
}

void Layout::validate() const {
  if (dp < 1) throw ConfigError("layout dp=" + std::to_string(dp) + " must be >= 1");
  if (tp < 1) throw ConfigError("layout tp=" + std::to_string(tp) + " must be >= 1");
  if (pp < 1) throw ConfigError("layout pp=" + std::to_string(pp) + " must be >= 1");
  if (zero < 0 || zero > 3) throw ConfigError("layout zero=" + std::to_string(zero) + " must be 0..3");
}

RankCoord coord_of(const Layout& l, int rank) {
  RankCoord c;
  c.tp = rank % l.tp;
  c.dp = (rank / l.tp) % l.dp;
  c.pp = rank / (l.tp * l.dp);
  return c;
}

int rank_of(const Layout& l, const RankCoord& c) { return c.tp + l.tp * (c.dp + l.dp * c.pp); }

std::vector<SplitRule> gpt_rules() {
  return {
      {"wte", Stage::First, -1, 0, 1},      {"wpe", Stage::First, -1, -1, 1},      {"ln1w", Stage::Layers, 0, -1, 1},
      {"ln1b", Stage::Layers, 0, -1, 1},    {"qkvw", Stage::Layers, 0, 1, 3},      {"qkvb", Stage::Layers, 0, 1, 3},
      {"attprojw", Stage::Layers, 0, 2, 1}, {"attprojb", Stage::Layers, 0, -1, 1}, {"ln2w", Stage::Layers, 0, -1, 1},
      {"ln2b", Stage::Layers, 0, -1, 1},    {"fcw", Stage::Layers, 0, 1, 1},       {"fcb", Stage::Layers, 0, 1, 1},
      {"fcprojw", Stage::Layers, 0, 2, 1},  {"fcprojb", Stage::Layers, 0, -1, 1},  {"lnfw", Stage::Last, -1, -1, 1},
      {"lnfb", Stage::Last, -1, -1, 1},
  };
}

std::vector<TensorDef> gpt_tensor_defs(int layers, int channels, int max_seq_len, int padded_vocab,
                                       bool with_optimizer) {
  const int64_t L = layers, C = channels, T = max_seq_len, V = padded_vocab;
  std::vector<TensorDef> p = {
      {"wte", DType::F32, {V, C}},
      {"wpe", DType::F32, {T, C}},
      {"ln1w", DType::F32, {L, C}},
      {"ln1b", DType::F32, {L, C}},
      {"qkvw", DType::F32, {L, 3 * C, C}},
      {"qkvb", DType::F32, {L, 3 * C}},
      {"attprojw", DType::F32, {L, C, C}},
      {"attprojb", DType::F32, {L, C}},
      {"ln2w", DType::F32, {L, C}},
      {"ln2b", DType::F32, {L, C}},
      {"fcw", DType::F32, {L, 4 * C, C}},
      {"fcb", DType::F32, {L, 4 * C}},
      {"fcprojw", DType::F32, {L, C, 4 * C}},
      {"fcprojb", DType::F32, {L, C}},
      {"lnfw", DType::F32, {C}},
      {"lnfb", DType::F32, {C}},
  };
  if (!with_optimizer) return p;
  std::vector<TensorDef> all = p;
  for (const char* prefix : {"adam_m/", "adam_v/"}) {
    for (const auto& d : p) all.push_back({prefix + d.name, d.dtype, d.shape});
  }
  return all;
}

std::vector<FlatView> flat_views(const std::vector<TensorDef>& defs, void* base) {
  std::vector<FlatView> out;
  auto* p = static_cast<unsigned char*>(base);
  for (const auto& d : defs) {
    out.push_back({d, p});
    p += static_cast<size_t>(shape_volume(d.shape)) * dtype_size(d.dtype);
  }
  return out;
}

const SplitRule& match_rule(const std::string& tensor, const std::vector<SplitRule>& rules) {
  size_t slash = tensor.rfind('/');
  std::string base = slash == std::string::npos ? tensor : tensor.substr(slash + 1);
  for (const auto& r : rules) {
    if (glob_match(r.pattern, base)) return r;
  }
  throw ConfigError("no layout rule matches tensor '" + tensor + "': add a SplitRule for '" + base + "'");
}

std::vector<PlacedBox> rank_boxes(const Layout& layout, int rank, const std::vector<TensorDef>& defs,
                                  const std::vector<SplitRule>& rules) {
  layout.validate();
  if (rank < 0 || rank >= layout.world_size()) {
    throw ConfigError("rank " + std::to_string(rank) + " is outside the world of " +
                      std::to_string(layout.world_size()));
  }
  const RankCoord c = coord_of(layout, rank);
  std::vector<PlacedBox> out;
  // ZeRO: the optimizer state of one (tp, pp) shard is one flat buffer per prefix (the concatenation of the
  // shard's boxes in definition order) split into dp near-equal contiguous ranges.
  struct FlatPart {
    std::string tensor;
    Box box;
    bool tp_replicated;
  };
  std::vector<std::pair<std::string, std::vector<FlatPart>>> flat;  // prefix -> parts, in order
  for (const auto& def : defs) {
    const SplitRule& rule = match_rule(def.name, rules);
    ModelShard shard = model_shard(layout, c, def, rule);
    const bool zero_split = layout.zero >= 1 && is_optimizer(def.name);
    for (const Box& b : shard.boxes) {
      if (b.empty()) continue;
      if (zero_split) {
        std::string prefix = prefix_of(def.name);
        auto it = flat.begin();
        while (it != flat.end() && it->first != prefix) ++it;
        if (it == flat.end()) it = flat.insert(flat.end(), {prefix, {}});
        it->second.push_back({def.name, b, shard.tp_replicated});
        continue;
      }
      PlacedBox p{def.name, b, 0, layout.dp};
      p.replica_index = c.dp;
      if (shard.tp_replicated) {
        p.num_replicas = layout.dp * layout.tp;
        p.replica_index = c.dp * layout.tp + c.tp;
      }
      out.push_back(std::move(p));
    }
  }
  for (const auto& [prefix, parts] : flat) {
    int64_t total = 0;
    for (const auto& p : parts) total += p.box.volume();
    const int64_t lo = total * c.dp / layout.dp, hi = total * (c.dp + 1) / layout.dp;
    int64_t start = 0;
    for (const auto& p : parts) {
      const int64_t vol = p.box.volume();
      const int64_t a = std::max(lo, start), b = std::min(hi, start + vol);
      if (a < b) {
        for (Box& sub : flat_range_to_boxes(p.box, a - start, b - start)) {
          PlacedBox pb{p.tensor, std::move(sub), 0, 1};
          if (p.tp_replicated) {
            pb.num_replicas = layout.tp;
            pb.replica_index = c.tp;
          }
          out.push_back(std::move(pb));
        }
      }
      start += vol;
    }
  }
  return out;
}

}  // namespace railyard::ckpt
