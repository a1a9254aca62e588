#include "worker/model/gpt_config.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>

#include "common/error.h"
#include "common/model_presets.h"

namespace railyard::worker {

namespace {

std::string preset_names() { return model_preset_names(); }

}  // namespace

void validate(const GptConfig& c) {
  auto bad = [](const std::string& what) { throw ConfigError("model: " + what); };
  if (c.num_layers <= 0) bad("layers (l) must be positive, got " + std::to_string(c.num_layers));
  if (c.channels <= 0) bad("channels (c) must be positive, got " + std::to_string(c.channels));
  if (c.num_heads <= 0) bad("heads (nh) must be positive, got " + std::to_string(c.num_heads));
  if (c.channels % c.num_heads != 0) {
    bad("channels (c=" + std::to_string(c.channels) +
        ") must be divisible by heads (nh=" + std::to_string(c.num_heads) + ")");
  }
  if (c.max_seq_len <= 0) bad("max sequence length (t) must be positive, got " + std::to_string(c.max_seq_len));
  if (c.vocab_size <= 0 || c.vocab_size > 1 << 24) bad("vocab (v) must be in 1..16777216");
  if (c.moe.experts < 0 || (c.moe.experts > 0 && (c.moe.top_k < 1 || c.moe.top_k > c.moe.experts))) {
    bad("mixture of experts: experts " + std::to_string(c.moe.experts) + ", top-k " + std::to_string(c.moe.top_k) +
        " (need top-k in 1..experts)");
  }
  if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size % 128 != 0) {
    bad("padded vocab " + std::to_string(c.padded_vocab_size) + " must be a multiple of 128 and >= vocab " +
        std::to_string(c.vocab_size));
  }
}

MoeConfig make_moe_config(int experts, int top_k, double capacity_factor, double aux_loss_coef) {
  if (experts < 2 || experts > 1024) {
    throw ConfigError("--moe-experts " + std::to_string(experts) + " must be in 2..1024 (omit it for the dense MLP)");
  }
  if (top_k < 1 || top_k > experts) {
    throw ConfigError("--moe-top-k " + std::to_string(top_k) + " must be in 1.." + std::to_string(experts) +
                      " (the number of experts)");
  }
  if (!std::isfinite(capacity_factor)) throw ConfigError("--moe-capacity-factor must be a number (<= 0: no limit)");
  if (!(aux_loss_coef >= 0) || !std::isfinite(aux_loss_coef)) {
    throw ConfigError("--moe-aux-coef must be a number >= 0");
  }
  MoeConfig m;
  m.experts = experts;
  m.top_k = top_k;
  m.capacity_factor = capacity_factor;
  m.aux_loss_coef = aux_loss_coef;
  return m;
}

RecomputeSpec parse_recompute(std::string_view mode, int layers, const GptConfig& c) {
  RecomputeSpec r;
  const std::optional<Recompute> m = recompute_from_string(mode);
  if (!m) throw ConfigError("--recompute '" + std::string(mode) + "' is not none, selective or full");
  r.mode = *m;
  if (layers < -1 || layers > c.num_layers) {
    throw ConfigError("--recompute-layers " + std::to_string(layers) + " must be in 0.." +
                      std::to_string(c.num_layers) + " (the model's layers; omit it for all layers)");
  }
  r.layers = layers == c.num_layers ? -1 : layers;
  return r;
}

std::string describe(const RecomputeSpec& r) {
  if (r.mode == Recompute::kNone || r.layers == 0) return "none";
  return std::string(to_string(r.mode)) +
         (r.layers < 0 ? " (all layers)" : " (layers 0-" + std::to_string(r.layers - 1) + ")");
}

GptConfig make_gpt_config(int num_layers, int channels, int num_heads, int max_seq_len, int vocab_size) {
  GptConfig c;
  c.num_layers = num_layers;
  c.channels = channels;
  c.num_heads = num_heads;
  c.max_seq_len = max_seq_len;
  c.vocab_size = vocab_size;
  c.padded_vocab_size = vocab_size > 0 ? pad_vocab(vocab_size) : 0;
  validate(c);
  return c;
}

GptConfig model_preset(std::string_view name) {
  // The table lives in common/model_presets.h so the operator validates jobs against the same shapes.
  if (auto p = find_model_preset(name)) return make_gpt_config(p->layers, p->hidden, p->heads, p->seq_len, p->vocab);
  throw ConfigError("model: unknown preset '" + std::string(name) + "': use one of " + preset_names() +
                    ", or a custom shape like l=2,c=64,nh=4,t=128,v=256");
}

GptConfig parse_model_spec(std::string_view spec) {
  if (spec.find('=') == std::string_view::npos) return model_preset(spec);
  std::map<std::string, int> kv;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      throw ConfigError("model: '" + std::string(item) + "' in '" + std::string(spec) + "' is not key=value");
    }
    std::string key(item.substr(0, eq));
    std::string_view val = item.substr(eq + 1);
    if (key != "l" && key != "c" && key != "nh" && key != "t" && key != "v") {
      throw ConfigError("model: unknown key '" + key + "' in '" + std::string(spec) + "': keys are l, c, nh, t, v");
    }
    int n = 0;
    auto [end, ec] = std::from_chars(val.data(), val.data() + val.size(), n);
    if (ec != std::errc() || end != val.data() + val.size()) {
      throw ConfigError("model: " + key + "='" + std::string(val) + "' is not an integer");
    }
    kv[key] = n;
  }
  for (const char* k : {"l", "c", "nh", "t", "v"}) {
    if (!kv.count(k)) {
      throw ConfigError(std::string("model: custom shape '") + std::string(spec) + "' lacks " + k +
                        "=N (all of l, c, nh, t, v are required)");
    }
  }
  return make_gpt_config(kv["l"], kv["c"], kv["nh"], kv["t"], kv["v"]);
}

std::string describe(const GptConfig& c) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "L%d C%d NH%d maxT%d V%d (Vp%d), %.2fM params", c.num_layers, c.channels, c.num_heads,
                c.max_seq_len, c.vocab_size, c.padded_vocab_size, num_parameters(global_config(c)) / 1e6);
  std::string out = buf;
  if (c.moe.experts > 0) {
    std::snprintf(buf, sizeof(buf), ", MoE E%d top-%d capacity %.3g aux %.3g", c.moe.experts, c.moe.top_k,
                  c.moe.capacity_factor, c.moe.aux_loss_coef);
    out += buf;
  }
  if (c.moe.expert_shards > 1) {
    const int el = local_experts(c);
    std::snprintf(buf, sizeof(buf), ", holds experts %d-%d (%.2fM params)", c.moe.expert_shard * el,
                  (c.moe.expert_shard + 1) * el - 1, num_parameters(c) / 1e6);
    out += buf;
  }
  return out;
}

GptConfig expert_shard_config(const GptConfig& global, int shards, int shard) {
  const int E = global.moe.experts;
  if (shards < 1 || shard < 0 || shard >= shards) {
    throw ConfigError("expert-parallel storage: shard " + std::to_string(shard) + " of " + std::to_string(shards) +
                      " is not a valid position");
  }
  if (shards > 1 && (E <= 0 || E % shards != 0)) {
    throw ConfigError("--ep " + std::to_string(shards) + " needs --moe-experts divisible by it (the model has " +
                      std::to_string(E) + " experts per layer)");
  }
  GptConfig c = global;
  c.moe.expert_shards = shards;
  c.moe.expert_shard = shards > 1 ? shard : 0;
  return c;
}

}  // namespace railyard::worker
