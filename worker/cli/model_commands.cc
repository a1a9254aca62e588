// railyard model inspect
#include <iostream>

#include "worker/cli/cli.h"
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

}  // namespace

int run_model(const Args& args) {
  if (args.empty()) throw UsageError{"model: subcommand required (inspect)"};
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "inspect") return inspect(rest);
  throw UsageError{"model: unknown subcommand '" + args[0] + "' (inspect)"};
}

}  // namespace railyard::cli
