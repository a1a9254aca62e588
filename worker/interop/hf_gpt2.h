// Our GPT as Hugging Face transformers' GPT-2 (GPT2LMHeadModel): a directory with model.safetensors and config.json
// that `GPT2LMHeadModel.from_pretrained(DIR)` opens. The mapping (per layer i; ours on the left, shapes (out, in) as
// in llm.c; HF's GPT-2 uses Conv1D layers whose weights are stored (in, out), hence the transposes):
//   wte (Vp, C)            -> wte.weight (V, C)                    the padded rows dropped; the LM head is tied to it
//   wpe (maxT, C)          -> wpe.weight (maxT, C)
//   ln1w/ln1b[i] (C)       -> h.i.ln_1.weight / .bias
//   qkvw[i] (3C, C)        -> h.i.attn.c_attn.weight (C, 3C)       transposed; q, k, v stay in that order
//   qkvb[i] (3C)           -> h.i.attn.c_attn.bias
//   attprojw[i] (C, C)     -> h.i.attn.c_proj.weight (C, C)        transposed
//   attprojb[i] (C)        -> h.i.attn.c_proj.bias
//   ln2w/ln2b[i] (C)       -> h.i.ln_2.weight / .bias
//   fcw[i] (4C, C)         -> h.i.mlp.c_fc.weight (C, 4C)          transposed
//   fcb[i] (4C)            -> h.i.mlp.c_fc.bias
//   fcprojw[i] (C, 4C)     -> h.i.mlp.c_proj.weight (4C, C)        transposed
//   fcprojb[i] (C)         -> h.i.mlp.c_proj.bias
//   lnfw/lnfb (C)          -> ln_f.weight / .bias
// The names are those of the published gpt2 checkpoints (no "transformer." prefix, which from_pretrained adds).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/interop/safetensors.h"
#include "worker/model/gpt_config.h"

namespace railyard::worker {

// The tensors above from a flat parameter buffer (num_parameters(cfg) floats, llm.c order). Dense models only:
// throws railyard::ConfigError for a mixture-of-experts config (GPT-2 has no experts).
std::vector<SafetensorsTensor> hf_gpt2_tensors(const GptConfig& cfg, const float* params);

// transformers' GPT2Config as JSON: n_layer, n_head, n_embd, n_positions, vocab_size, tanh GELU ("gelu_new"),
// layer_norm_epsilon 1e-5, tied embeddings, no dropout.
nlohmann::json hf_gpt2_config(const GptConfig& cfg);

// DIR/model.safetensors and DIR/config.json (the directory is created). Throws railyard::Error naming the path.
void export_hf_gpt2(const std::string& dir, const GptConfig& cfg, const float* params);

}  // namespace railyard::worker
