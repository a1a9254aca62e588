// llm.c GPT-2 model files (worker/interop/llmc_model.h): header validation and, for files small enough, the full
// load (fp32 and bf16). Bad files are a railyard::Error naming the file and field.
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/interop/llmc_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = railyard::fuzz::write_scratch("model.bin", {reinterpret_cast<const char*>(data), size});
  try {
    railyard::worker::LlmcModelInfo info = railyard::worker::inspect_llmc_model(path);
    if (info.file_bytes != size) __builtin_trap();
    railyard::worker::GptConfig cfg;
    std::vector<float> params;
    railyard::worker::load_llmc_model(path, cfg, params);
    if (params.size() != info.num_parameters) __builtin_trap();
  } catch (const railyard::Error&) {
  }
  return 0;
}
