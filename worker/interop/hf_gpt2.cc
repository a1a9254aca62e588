#include "worker/interop/hf_gpt2.h"

#include <filesystem>

#include "common/atomic_file.h"
#include "common/error.h"

namespace railyard::worker {

namespace {

// Layer l's (rows, cols) matrix of a stacked (L, rows, cols) tensor, transposed to (cols, rows).
std::vector<float> transposed(const float* stacked, size_t l, size_t rows, size_t cols) {
  const float* m = stacked + l * rows * cols;
  std::vector<float> out(rows * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) out[c * rows + r] = m[r * cols + c];
  return out;
}

std::vector<float> slice(const float* base, size_t offset, size_t count) {
  return std::vector<float>(base + offset, base + offset + count);
}

}  // namespace

std::vector<SafetensorsTensor> hf_gpt2_tensors(const GptConfig& cfg, const float* params) {
  if (cfg.moe.experts > 0)
    throw ConfigError("a mixture-of-experts model has no Hugging Face GPT-2 form (GPT-2 has no experts)");
  // Pointers into the flat buffer, "sizes, then point into one buffer".
  const auto sizes = param_sizes(cfg);
  std::array<const float*, kNumParamTensors> p{};
  size_t offset = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    p[static_cast<size_t>(i)] = params + offset;
    offset += sizes[static_cast<size_t>(i)];
  }
  enum { wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb };
  const int64_t V = cfg.vocab_size, T = cfg.max_seq_len, C = cfg.channels;
  const size_t c = static_cast<size_t>(C);
  std::vector<SafetensorsTensor> out;
  out.push_back({"wte.weight", {V, C}, slice(p[wte], 0, static_cast<size_t>(V) * c)});
  out.push_back({"wpe.weight", {T, C}, slice(p[wpe], 0, static_cast<size_t>(T) * c)});
  for (int l = 0; l < cfg.num_layers; ++l) {
    const size_t L = static_cast<size_t>(l);
    const std::string h = "h." + std::to_string(l) + ".";
    out.push_back({h + "ln_1.weight", {C}, slice(p[ln1w], L * c, c)});
    out.push_back({h + "ln_1.bias", {C}, slice(p[ln1b], L * c, c)});
    out.push_back({h + "attn.c_attn.weight", {C, 3 * C}, transposed(p[qkvw], L, 3 * c, c)});
    out.push_back({h + "attn.c_attn.bias", {3 * C}, slice(p[qkvb], L * 3 * c, 3 * c)});
    out.push_back({h + "attn.c_proj.weight", {C, C}, transposed(p[attprojw], L, c, c)});
    out.push_back({h + "attn.c_proj.bias", {C}, slice(p[attprojb], L * c, c)});
    out.push_back({h + "ln_2.weight", {C}, slice(p[ln2w], L * c, c)});
    out.push_back({h + "ln_2.bias", {C}, slice(p[ln2b], L * c, c)});
    out.push_back({h + "mlp.c_fc.weight", {C, 4 * C}, transposed(p[fcw], L, 4 * c, c)});
    out.push_back({h + "mlp.c_fc.bias", {4 * C}, slice(p[fcb], L * 4 * c, 4 * c)});
    out.push_back({h + "mlp.c_proj.weight", {4 * C, C}, transposed(p[fcprojw], L, c, 4 * c)});
    out.push_back({h + "mlp.c_proj.bias", {C}, slice(p[fcprojb], L * c, c)});
  }
  out.push_back({"ln_f.weight", {C}, slice(p[lnfw], 0, c)});
  out.push_back({"ln_f.bias", {C}, slice(p[lnfb], 0, c)});
  return out;
}

nlohmann::json hf_gpt2_config(const GptConfig& cfg) {
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                      {"model_type", "gpt2"},
                      {"vocab_size", cfg.vocab_size},
                      {"n_positions", cfg.max_seq_len},
                      {"n_ctx", cfg.max_seq_len},
                      {"n_embd", cfg.channels},
                      {"n_layer", cfg.num_layers},
                      {"n_head", cfg.num_heads},
                      {"n_inner", nullptr},
                      {"activation_function", "gelu_new"},  // tanh-approximated GELU, as our kernels and llm.c
                      {"layer_norm_epsilon", 1e-5},
                      {"resid_pdrop", 0.0},
                      {"embd_pdrop", 0.0},
                      {"attn_pdrop", 0.0},
                      {"initializer_range", 0.02},
                      {"scale_attn_weights", true},
                      {"tie_word_embeddings", true},
                      {"torch_dtype", "float32"}};
  // GPT-2's <|endoftext|> only where the vocabulary is GPT-2's.
  if (cfg.vocab_size == 50257) j["bos_token_id"] = j["eos_token_id"] = 50256;
  return j;
}

void export_hf_gpt2(const std::string& dir, const GptConfig& cfg, const float* params) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + dir + ": " + ec.message());
  write_safetensors(dir + "/model.safetensors", hf_gpt2_tensors(cfg, params), {{"format", "pt"}});
  const std::string text = hf_gpt2_config(cfg).dump(2) + "\n";
  AtomicFileWriter w(dir + "/config.json");
  w.write(text.data(), text.size());
  w.commit();
}

}  // namespace railyard::worker
