// Helpers for the worker data/interop tests: a private temp directory and raw file access.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/ctest_env.h"  // ctest_env, bin_path
#include "tests/temp_dir.h"
#include "worker/model/gpt_config.h"

namespace railyard::test {

// A byte-level GPT small enough to write as an llm.c file in a test (2 layers, 4 heads, 16 channels, T 32).
inline worker::GptConfig small_byte_gpt() {
  return worker::make_gpt_config(/*L=*/2, /*C=*/16, /*NH=*/4, /*maxT=*/32, /*V=*/256);
}

class TempDir : public ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("railyard-data-test") {}
  std::string file(const std::string& name) const { return (dir() / name).string(); }
  const std::filesystem::path& path() const { return dir(); }
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) throw std::runtime_error("cannot write " + path);
}

// A raw shard file with an arbitrary header (for the bad-shard cases) followed by the given tokens.
inline void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t count,
                            const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version;
  h[2] = count;
  std::string bytes(reinterpret_cast<const char*>(h.data()), h.size() * 4);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  write_bytes(path, bytes.data(), bytes.size());
}

// Runs a shell command line; returns the exit code and combined stdout+stderr.
struct RunResult {
  int code = -1;
  std::string output;
};
RunResult run_command(const std::string& command_line);

}  // namespace railyard::test
