// GPT-2-style model shape and the layout of its flat parameter buffer.
//
// The parameter tensors live in one flat fp32 buffer in exactly llm.c's order and shapes, so weights move
// between Railyard, llm.c and PyTorch without reordering:
//   wte (Vp, C)  wpe (maxT, C)  ln1w (L, C)  ln1b (L, C)  qkvw (L, 3C, C)  qkvb (L, 3C)
//   attprojw (L, C, C)  attprojb (L, C)  ln2w (L, C)  ln2b (L, C)  fcw (L, 4C, C)  fcb (L, 4C)
//   fcprojw (L, C, 4C)  fcprojb (L, C)  lnfw (C)  lnfb (C)
// Linear weights are (out, in), as in PyTorch's nn.Linear. The LM head is tied to wte.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "common/recompute.h"

namespace railyard::worker {

// Mixture-of-experts MLP (docs/worker.md, "Mixture of experts"): every layer's MLP becomes E expert MLPs of the
// dense shape and a softmax router; each token goes to its top-k experts, weighted by their router probability.
struct MoeConfig {
  int experts = 0;                // E; 0 = the dense MLP
  int top_k = 1;                  // experts per token, 1..E
  double capacity_factor = 1.25;  // per expert and micro-batch at most ceil(cf * k * N / E) tokens; <= 0: no limit
  double aux_loss_coef = 0.01;    // alpha of the load-balancing loss alpha * E * sum_e f_e P_e (per layer)
  // Expert-parallel storage (docs/parallel.md "Expert parallelism"): the flat buffers hold only experts
  // [shard * E/shards, (shard + 1) * E/shards) of every layer (expert_shard_config). 1 = all E (the global layout).
  int expert_shards = 1;
  int expert_shard = 0;
  bool operator==(const MoeConfig&) const = default;
};

struct GptConfig {
  int max_seq_len = 0;        // maxT
  int vocab_size = 0;         // V: real vocabulary
  int padded_vocab_size = 0;  // Vp: V rounded up to a multiple of 128 (rows >= V are never predicted)
  int num_layers = 0;         // L
  int num_heads = 0;          // NH
  int channels = 0;           // C
  MoeConfig moe;              // experts == 0: dense (the llm.c model)

  bool operator==(const GptConfig&) const = default;
};

inline constexpr int kNumParamTensors = 16;

// Names in buffer order; also the names used in checkpoints and llm.c interop.
inline constexpr std::array<std::string_view, kNumParamTensors> kParamNames = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

// Shard maps and checkpoints name the MoE router (after the 16 tensors) as tensor index kRouterTensor.
inline constexpr int kRouterTensor = kNumParamTensors;
inline constexpr std::string_view param_tensor_name(int i) {
  return i == kRouterTensor ? std::string_view("routerw") : kParamNames[static_cast<size_t>(i)];
}

// Experts per layer this buffer holds: E, or E / expert_shards with expert-parallel storage (0 for a dense model).
inline int local_experts(const GptConfig& c) {
  return c.moe.experts > 0 ? c.moe.experts / (c.moe.expert_shards > 0 ? c.moe.expert_shards : 1) : 0;
}

// Element count of each parameter tensor, in buffer order. With experts (E > 0) the four MLP tensors hold E experts
// per layer: fcw (L, E, 4C, C), fcb (L, E, 4C), fcprojw (L, E, C, 4C), fcprojb (L, E, C); with expert-parallel
// storage E/expert_shards of them (the router and every dense tensor stay whole).
inline std::array<size_t, kNumParamTensors> param_sizes(const GptConfig& c) {
  const size_t Vp = c.padded_vocab_size, T = c.max_seq_len, L = c.num_layers, C = c.channels;
  const size_t E = c.moe.experts > 0 ? static_cast<size_t>(local_experts(c)) : 1;
  return {Vp * C,
          T * C,
          L * C,
          L * C,
          L * 3 * C * C,
          L * 3 * C,
          L * C * C,
          L * C,
          L * C,
          L * C,
          L * E * 4 * C * C,
          L * E * 4 * C,
          L * E * C * 4 * C,
          L * E * C,
          C,
          C};
}

// The MoE router weights (L, E, C), stored after the 16 tensors (0 elements for a dense model).
inline size_t router_size(const GptConfig& c) {
  return c.moe.experts > 0 ? static_cast<size_t>(c.num_layers) * c.moe.experts * c.channels : 0;
}

inline size_t num_parameters(const GptConfig& c) {
  size_t n = router_size(c);
  for (size_t s : param_sizes(c)) n += s;
  return n;
}

// Offset of the router weights in the flat buffer.
inline size_t router_offset(const GptConfig& c) { return num_parameters(c) - router_size(c); }

// The layout of rank `shard` of `shards` expert-parallel ranks: its E/shards experts per MoE layer. Throws
// railyard::ConfigError when shards does not divide E. shards = 1 gives the global layout.
GptConfig expert_shard_config(const GptConfig& global, int shards, int shard);
// The same model with all E experts (the layout checkpoints, FLOP counts and the planner speak of).
inline GptConfig global_config(GptConfig c) {
  c.moe.expert_shards = 1;
  c.moe.expert_shard = 0;
  return c;
}

inline int pad_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

// Presets (docs/worker.md): "tiny" (L4 C128 NH4, maxT 256, byte-level V 256 = Vp 256), "gpt2-124m" (L12 C768 NH12),
// "gpt2-350m" (L24 C1024 NH16), "gpt2-774m" (L36 C1280 NH20), "gpt2-1.5b" (L48 C1600 NH25); the GPT-2 presets
// have V 50257 (Vp 50304) and maxT 1024. Throws railyard::ConfigError listing the presets for an unknown name.
GptConfig model_preset(std::string_view name);

// A preset name, or a custom shape "l=2,c=64,nh=4,t=128,v=256" (keys l, c, nh, t = maxT, v = real vocab; every key
// required). Throws railyard::ConfigError naming the bad key or value.
GptConfig parse_model_spec(std::string_view spec);

// Builds and validates a shape (positive sizes, C divisible by NH); pads the vocabulary.
GptConfig make_gpt_config(int num_layers, int channels, int num_heads, int max_seq_len, int vocab_size);

// Activation recomputation (docs/worker.md, "Activation recomputation"): the modes are common/recompute.h's, shared
// with the planner and the operator. A recomputed layer drops activations after its forward and rebuilds them in
// backward with the same kernels on the same inputs, so results are bitwise those of kNone.
using railyard::Recompute;

struct RecomputeSpec {
  Recompute mode = Recompute::kNone;
  int layers = -1;  // applies to the first `layers` layers of the model (global index); -1 = all
  bool applies(int layer) const { return mode != Recompute::kNone && (layers < 0 || layer < layers); }
  bool full(int layer) const { return mode == Recompute::kFull && applies(layer); }
  bool selective(int layer) const { return mode == Recompute::kSelective && applies(layer); }
  bool operator==(const RecomputeSpec&) const = default;
};

// "none" | "selective" | "full", and the layer count (-1 = all; otherwise 0..L). Throws railyard::ConfigError naming
// --recompute / --recompute-layers.
RecomputeSpec parse_recompute(std::string_view mode, int layers, const GptConfig& c);
// "full (layers 0-5)", "selective (all layers)", "none"
std::string describe(const RecomputeSpec& r);

// Mixture of experts from the --moe-* flags: experts E >= 2, top_k in 1..E, capacity factor (<= 0 = no limit), aux
// coefficient >= 0. Throws railyard::ConfigError naming the flag.
MoeConfig make_moe_config(int experts, int top_k, double capacity_factor, double aux_loss_coef);

// Throws railyard::ConfigError when a config read from elsewhere (e.g. a checkpoint header) is inconsistent.
void validate(const GptConfig& c);

// "L12 C768 NH12 maxT1024 V50257 (Vp50304), 124.4M params"
std::string describe(const GptConfig& c);

}  // namespace railyard::worker
