// railyard model inspect | export | fetch
#include <filesystem>
#include <iostream>

#include "cli/cli.h"
#include "cli/data_fetch.h"
#include "cli/model_source.h"
#include "common/error.h"
#include "worker/interop/hf_gpt2.h"
#include "worker/interop/llmc_model.h"

namespace railyard::cli {

namespace {

int inspect(const Args& a) {
  if (a.empty()) throw UsageError{"model inspect: FILE is required"};
  if (a.size() > 1)
    throw UsageError{"model inspect: one FILE expected, got " + std::to_string(a.size()) + " arguments"};
  if (a[0].size() > 1 && a[0][0] == '-') throw UsageError{"model inspect: unknown flag '" + a[0] + "'"};
  const worker::LlmcModelInfo info = worker::inspect_llmc_model(a[0]);
  const worker::GptConfig& c = info.config;
  std::cout << "file:        " << a[0] << "\n"
            << "format:      llm.c GPT-2 checkpoint, version " << info.version << " ("
            << (info.version == worker::kLlmcVersionFp32 ? "fp32" : "bf16") << ")\n"
            << "maxT:        " << c.max_seq_len << "\n"
            << "vocab:       " << c.vocab_size << " (padded " << c.padded_vocab_size << ")\n"
            << "layers:      " << c.num_layers << "\n"
            << "heads:       " << c.num_heads << "\n"
            << "channels:    " << c.channels << "\n"
            << "parameters:  " << info.num_parameters << "\n"
            << "bytes:       " << info.file_bytes << "\n"
            << "tensors (name, elements, byte offset):\n";
  const auto sizes = worker::param_sizes(c);
  const size_t elem = info.version == worker::kLlmcVersionFp32 ? 4 : 2;
  size_t offset = worker::kLlmcHeaderBytes;
  for (int i = 0; i < worker::kNumParamTensors; ++i) {
    std::cout << "  " << worker::kParamNames[i] << " " << sizes[i] << " " << offset << "\n";
    offset += sizes[i] * elem;
  }
  return kExitOk;
}

// railyard model fetch SOURCE --output FILE: an llm.c model file from a URL (or a path in the pod) into FILE, checked
// before it replaces FILE; FILE of the same content is left as it is. A job's initializer runs this for
// spec.initializer.model (docs/storage.md "Initializer").
int fetch_model(const Args& a) {
  std::string source, output;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--output") {
      if (i + 1 >= a.size() || (a[i + 1].size() > 1 && a[i + 1][0] == '-'))
        throw UsageError{"model fetch: --output needs a value"};
      output = a[++i];
    } else {
      take_one_positional("model fetch", "SOURCE", a[i], source);
    }
  }
  if (source.empty()) throw UsageError{"model fetch: SOURCE (a URL or a file) is required"};
  if (output.empty()) throw UsageError{"model fetch: --output FILE is required"};
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::path(output).has_parent_path()) fs::create_directories(fs::path(output).parent_path(), ec);
  const std::string part = output + ".part";
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code e;
      fs::remove(path, e);
    }
  } cleanup{part};
  if (is_url(source)) {
    std::cout << "fetching " << source << std::endl;
    fetch_url(source, part);
  } else {
    fs::copy_file(source, part, fs::copy_options::overwrite_existing, ec);
    if (ec) throw ConfigError("model fetch: cannot copy " + source + ": " + ec.message());
  }
  // Checked before it replaces anything: a page of HTML or a truncated download never becomes the model.
  const worker::LlmcModelInfo info = worker::inspect_llmc_model(part);
  const std::string digest = sha256_file(part);
  if (fs::exists(output) && sha256_file(output) == digest) {
    std::cout << "up to date: " << output << " has the same content (sha256 " << digest << ")\n";
    return kExitOk;
  }
  fs::rename(part, output, ec);
  if (ec) throw ConfigError("model fetch: cannot move the model into " + output + ": " + ec.message());
  std::cout << "wrote " << output << ": llm.c GPT-2, " << info.config.num_layers << " layers, " << info.config.channels
            << " channels, vocab " << info.config.vocab_size << ", " << info.num_parameters << " parameters, sha256 "
            << digest << "\n";
  return kExitOk;
}

// railyard model export (--model FILE | --checkpoint DIR [--step N]) --output PATH [--format hf|llmc]
int export_model(const Args& a) {
  ModelSource from;
  std::string output, format = "hf";
  for (size_t i = 0; i < a.size(); ++i) {
    if (from.take(a, i, "model export")) continue;
    if (a[i] == "--output" || a[i] == "--format") {
      if (i + 1 >= a.size() || (a[i + 1].size() > 1 && a[i + 1][0] == '-'))
        throw UsageError{"model export: " + a[i] + " needs a value"};
      (a[i] == "--output" ? output : format) = a[i + 1];
      ++i;
    } else if (a[i].size() > 1 && a[i][0] == '-') {
      throw UsageError{"model export: unknown flag '" + a[i] + "'"};
    } else {
      throw UsageError{"model export: unexpected argument '" + a[i] + "'"};
    }
  }
  from.check("model export");
  if (output.empty()) throw UsageError{"model export: --output PATH is required"};
  if (format != "hf" && format != "llmc")
    throw UsageError{"model export: --format '" + format + "' is not one of hf, llmc"};
  const LoadedModel m = from.load();
  if (format == "hf") {
    worker::export_hf_gpt2(output, m.config, m.params.data());
    std::cout << "wrote " << output << "/model.safetensors and " << output << "/config.json (Hugging Face GPT-2) from "
              << m.source << ", " << worker::describe(m.config) << "\n";
  } else {
    worker::save_llmc_model(output, m.config, m.params.data());
    std::cout << "wrote " << output << " (llm.c GPT-2, fp32) from " << m.source << ", " << worker::describe(m.config)
              << "\n";
  }
  return kExitOk;
}

}  // namespace

int run_model(const Args& args) {
  return run_subcommand("model", args, {{"inspect", inspect}, {"export", export_model}, {"fetch", fetch_model}});
}

}  // namespace railyard::cli
