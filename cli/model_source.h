// Where a CLI command reads a trained model from: `--model FILE` (an llm.c GPT-2 file) or `--checkpoint DIR
// [--step N]` (a checkpoint directory of any parallel layout). Shared by `railyard eval` and `railyard model export`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "worker/model/gpt_config.h"

namespace railyard::cli {

struct LoadedModel {
  worker::GptConfig config;
  std::vector<float> params;  // llm.c order
  std::string source;         // "model.bin" or "ckpt (step 20)", for the command's report
};

struct ModelSource {
  std::string file, checkpoint;
  std::optional<int64_t> step;

  // Consumes --model, --checkpoint or --step at args[i] (and its value); false for any other argument.
  bool take(const Args& args, size_t& i, const std::string& command);
  // Exactly one of --model and --checkpoint; --step only with --checkpoint. Throws UsageError naming `command`.
  void check(const std::string& command) const;
  LoadedModel load() const;
};

}  // namespace railyard::cli
