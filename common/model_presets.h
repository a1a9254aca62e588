// The named GPT model shapes, in one pure header so the operator (which validates TrainingJobs) and the worker
// (which builds the model) agree without the operator depending on the worker.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace railyard {

struct ModelPreset {
  std::string_view name;
  int layers;   // L
  int hidden;   // C
  int heads;    // NH
  int seq_len;  // maxT
  int vocab;    // V (real vocabulary; padded to a multiple of 128 by the worker)
};

inline constexpr std::array<ModelPreset, 5> kModelPresets = {{
    {"tiny", 4, 128, 4, 256, 256},
    {"gpt2-124m", 12, 768, 12, 1024, 50257},
    {"gpt2-350m", 24, 1024, 16, 1024, 50257},
    {"gpt2-774m", 36, 1280, 20, 1024, 50257},
    {"gpt2-1.5b", 48, 1600, 25, 1024, 50257},
}};

inline std::optional<ModelPreset> find_model_preset(std::string_view name) {
  for (const auto& p : kModelPresets)
    if (p.name == name) return p;
  return std::nullopt;
}

// "tiny, gpt2-124m, ..." for error messages.
inline std::string model_preset_names() {
  std::string out;
  for (const auto& p : kModelPresets) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

}  // namespace railyard
