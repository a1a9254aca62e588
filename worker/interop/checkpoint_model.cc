#include "worker/interop/checkpoint_model.h"

#include <cstdio>
#include <filesystem>

#include "checkpoint/reader.h"
#include "common/error.h"

namespace railyard::worker {

std::optional<GptConfig> parse_model_description(const std::string& text) {
  int L = 0, C = 0, NH = 0, maxT = 0, V = 0, Vp = 0, used = 0;
  if (std::sscanf(text.c_str(), "L%d C%d NH%d maxT%d V%d (Vp%d)%n", &L, &C, &NH, &maxT, &V, &Vp, &used) != 6 ||
      used == 0 || text.find("MoE") != std::string::npos) {
    return std::nullopt;
  }
  try {
    GptConfig c = make_gpt_config(L, C, NH, maxT, V);
    if (c.padded_vocab_size != Vp) return std::nullopt;
    return c;
  } catch (const ConfigError&) {
    return std::nullopt;
  }
}

CheckpointModel load_checkpoint_model(const std::string& root, std::optional<int64_t> step) {
  if (!std::filesystem::is_directory(root)) throw ConfigError("checkpoint directory " + root + " does not exist");
  const ckpt::Reader reader(root);
  if (!step) {
    const std::vector<int64_t> steps = reader.complete_steps();
    if (steps.empty()) throw ConfigError("no complete checkpoint under " + root + " (railyard ckpt ls " + root + ")");
    step = steps.front();
  }
  const ckpt::Manifest m = reader.read_manifest(*step);
  std::string described;
  for (const auto& [rank, state] : m.rank_state) {
    if (state.is_object() && state.contains("model") && state["model"].is_string()) {
      described = state["model"].get<std::string>();
      break;
    }
  }
  const std::optional<GptConfig> cfg = parse_model_description(described);
  if (!cfg) {
    throw ConfigError("checkpoint " + root + " step " + std::to_string(*step) + " holds model '" + described +
                      "': only dense GPT checkpoints of railyard-worker train are read here (mixture-of-experts models "
                      "are not supported by railyard eval yet)");
  }
  CheckpointModel out;
  out.step = *step;
  out.config = *cfg;
  out.params.assign(num_parameters(*cfg), 0.0f);
  std::vector<ckpt::LoadTarget> targets;
  const auto sizes = param_sizes(*cfg);
  size_t offset = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const std::string name(kParamNames[static_cast<size_t>(i)]);
    const ckpt::TensorRecord* t = m.find_tensor(name);
    int64_t volume = 1;
    if (t != nullptr)
      for (int64_t d : t->shape) volume *= d;
    if (t == nullptr || static_cast<size_t>(volume) != sizes[static_cast<size_t>(i)]) {
      throw ConfigError("checkpoint " + root + " step " + std::to_string(*step) + ": tensor " + name +
                        (t == nullptr ? " is missing" : " has " + std::to_string(volume) + " elements") + ", model " +
                        described + " needs " + std::to_string(sizes[static_cast<size_t>(i)]));
    }
    ckpt::LoadTarget target;
    target.name = name;
    target.box.offset.assign(t->shape.size(), 0);
    target.box.size = t->shape;
    target.data = out.params.data() + offset;
    targets.push_back(std::move(target));
    offset += sizes[static_cast<size_t>(i)];
  }
  reader.load_step(*step, targets);
  return out;
}

}  // namespace railyard::worker
