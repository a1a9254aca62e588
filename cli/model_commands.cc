// railyard model inspect | export
#include <iostream>

#include "cli/cli.h"
#include "cli/model_source.h"
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
  if (args.empty()) throw UsageError{"model: subcommand required (inspect, export)"};
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "inspect") return inspect(rest);
  if (args[0] == "export") return export_model(rest);
  throw UsageError{"model: unknown subcommand '" + args[0] + "' (inspect, export)"};
}

}  // namespace railyard::cli
