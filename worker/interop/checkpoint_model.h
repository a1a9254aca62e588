// A trained model out of a checkpoint directory (what `railyard-worker train --ckpt-dir` and a TrainingJob's
// spec.checkpoint.path hold), whatever data/tensor/pipeline/ZeRO layout wrote it: the checkpoint keeps every tensor
// in its global shape, so the reader copies each whole tensor into the flat llm.c-ordered parameter buffer. Used by
// `railyard eval`; the AdamW state is not read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/model/gpt_config.h"

namespace railyard::worker {

struct CheckpointModel {
  int64_t step = 0;           // the checkpoint's step (steps trained)
  GptConfig config;           // from the rank state's model description ("L2 C64 NH4 maxT64 V256 (Vp256), ...")
  std::vector<float> params;  // num_parameters(config) floats, llm.c order
};

// The newest complete checkpoint under root, or exactly `step`. Throws railyard::ConfigError naming the directory
// when there is none, when it holds a mixture-of-experts model (not supported yet) or when its tensors disagree with
// the model it names.
CheckpointModel load_checkpoint_model(const std::string& root, std::optional<int64_t> step = std::nullopt);

// "L2 C64 NH4 maxT64 V256 (Vp256), 0.10M params" -> the config (make_gpt_config); nullopt when the text is not of
// that form or names experts.
std::optional<GptConfig> parse_model_description(const std::string& text);

}  // namespace railyard::worker
