// llm.c GPT-2 checkpoint import/export.
//
// File layout (little-endian): 256 int32 header = {magic 20240326, version, maxT, V, L, NH, C, Vp, 0...}, then
// every parameter tensor in llm.c's order, which is exactly our flat buffer order (worker/model/gpt_config.h).
// Version 3 stores fp32 parameters; version 5 stores bf16 (llm.c's mixed-precision build) and is widened to fp32 on
// import. We always export version 3, which llm.c, its PyTorch reference (train_gpt2.py) and we all read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/model/gpt_config.h"

namespace railyard::worker {

inline constexpr int32_t kLlmcModelMagic = 20240326;
inline constexpr int32_t kLlmcVersionFp32 = 3;
inline constexpr int32_t kLlmcVersionBf16 = 5;
inline constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

struct LlmcModelInfo {
  int version = 0;  // 3 (fp32) or 5 (bf16)
  GptConfig config;
  size_t num_parameters = 0;
  size_t file_bytes = 0;
};

// Reads and validates the header and the file size. Throws railyard::ConfigError naming the file and the problem
// (bad magic, unsupported version, a non-positive field, expected vs actual size).
LlmcModelInfo inspect_llmc_model(const std::string& path);
GptConfig read_llmc_header(const std::string& path);

// Loads the whole model as fp32.
void load_llmc_model(const std::string& path, GptConfig& cfg_out, std::vector<float>& params_out);
// Loads into a caller buffer of num_parameters(expected) floats; a header that disagrees with `expected` is
// refused naming the field ("model.bin: header says 12 layers, expected 24").
void load_llmc_model(const std::string& path, const GptConfig& expected, float* params);

// The first dimension in which an llm.c file's shape (`file`, from read_llmc_header) differs from the model a job
// asks for (`expected`), named as in a TrainingJob's spec.model: layers, hidden, heads, seqLen, vocab, and
// "vocab (padded)" when only the padded vocabulary differs. nullopt when the shapes agree (MoE fields not compared).
struct LlmcShapeMismatch {
  std::string dimension;
  int expected = 0, file = 0;
};
std::optional<LlmcShapeMismatch> llmc_shape_mismatch(const GptConfig& expected, const GptConfig& file);

// Writes a version 3 (fp32) file atomically. params holds num_parameters(cfg) floats.
void save_llmc_model(const std::string& path, const GptConfig& cfg, const float* params);

}  // namespace railyard::worker
