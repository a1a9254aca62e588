#include "cli/model_source.h"

#include "worker/interop/checkpoint_model.h"
#include "worker/interop/llmc_model.h"

namespace railyard::cli {

bool ModelSource::take(const Args& args, size_t& i, const std::string& command) {
  const std::string& a = args[i];
  if (a != "--model" && a != "--checkpoint" && a != "--step") return false;
  if (i + 1 >= args.size() || (args[i + 1].size() > 1 && args[i + 1][0] == '-'))
    throw UsageError{command + ": " + a + " needs a value"};
  const std::string& v = args[++i];
  if (a == "--model") file = v;
  if (a == "--checkpoint") checkpoint = v;
  if (a == "--step") step = static_cast<int64_t>(parse_count("--step", v));
  return true;
}

void ModelSource::check(const std::string& command) const {
  if (file.empty() == checkpoint.empty())
    throw UsageError{command + ": give exactly one of --model FILE and --checkpoint DIR"};
  if (step && checkpoint.empty()) throw UsageError{command + ": --step goes with --checkpoint"};
}

LoadedModel ModelSource::load() const {
  LoadedModel m;
  if (!file.empty()) {
    worker::load_llmc_model(file, m.config, m.params);
    m.source = file;
    return m;
  }
  worker::CheckpointModel c = worker::load_checkpoint_model(checkpoint, step);
  m.config = c.config;
  m.params = std::move(c.params);
  m.source = checkpoint + " (step " + std::to_string(c.step) + ")";
  return m;
}

}  // namespace railyard::cli
