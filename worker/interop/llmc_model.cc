#include "worker/interop/llmc_model.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <tuple>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"

namespace railyard::worker {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void read_exact(int fd, const std::string& path, void* dst, size_t bytes, size_t offset) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw ConfigError(path + ": read failed at byte offset " + std::to_string(offset) + ": " + std::strerror(errno));
    if (n == 0) throw ConfigError(path + ": unexpected end of file at byte offset " + std::to_string(offset));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
}

std::string shape_text(const GptConfig& c) {
  return "maxT=" + std::to_string(c.max_seq_len) + " V=" + std::to_string(c.vocab_size) +
         " Vp=" + std::to_string(c.padded_vocab_size) + " L=" + std::to_string(c.num_layers) +
         " NH=" + std::to_string(c.num_heads) + " C=" + std::to_string(c.channels);
}

// Fields a header or config must get right before sizes can even be computed.
void check_config(const std::string& path, const GptConfig& c) {
  const std::array<std::pair<const char*, int>, 6> fields = {{{"max sequence length (maxT)", c.max_seq_len},
                                                              {"vocab size (V)", c.vocab_size},
                                                              {"number of layers (L)", c.num_layers},
                                                              {"number of heads (NH)", c.num_heads},
                                                              {"channels (C)", c.channels},
                                                              {"padded vocab size (Vp)", c.padded_vocab_size}}};
  for (const auto& [name, v] : fields) {
    if (v <= 0) throw ConfigError(path + ": " + name + " is " + std::to_string(v) + ", must be positive");
  }
  if (c.padded_vocab_size < c.vocab_size) {
    throw ConfigError(path + ": padded vocab size " + std::to_string(c.padded_vocab_size) + " is below vocab size " +
                      std::to_string(c.vocab_size));
  }
  if (c.channels % c.num_heads != 0) {
    throw ConfigError(path + ": channels " + std::to_string(c.channels) + " are not divisible by " +
                      std::to_string(c.num_heads) + " heads");
  }
}

LlmcModelInfo inspect_fd(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw ConfigError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw ConfigError(path + ": not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kLlmcHeaderBytes) {
    throw ConfigError(path + ": file has " + std::to_string(size) + " bytes, shorter than the " +
                      std::to_string(kLlmcHeaderBytes) + "-byte llm.c header: truncated or not an llm.c model");
  }
  std::array<int32_t, 256> h{};
  read_exact(fd, path, h.data(), kLlmcHeaderBytes, 0);
  if (h[0] != kLlmcModelMagic) {
    throw ConfigError(path + ": bad magic " + std::to_string(h[0]) + " (expected " + std::to_string(kLlmcModelMagic) +
                      "): not an llm.c GPT-2 checkpoint");
  }
  if (h[1] != kLlmcVersionFp32 && h[1] != kLlmcVersionBf16) {
    throw ConfigError(path + ": unsupported llm.c model version " + std::to_string(h[1]) +
                      " (supported: 3 = fp32, 5 = bf16); re-export it with a current llm.c");
  }
  LlmcModelInfo info;
  info.version = h[1];
  info.config.max_seq_len = h[2];
  info.config.vocab_size = h[3];
  info.config.num_layers = h[4];
  info.config.num_heads = h[5];
  info.config.channels = h[6];
  info.config.padded_vocab_size = h[7];
  check_config(path, info.config);
  info.num_parameters = num_parameters(info.config);
  info.file_bytes = size;
  const size_t elem = info.version == kLlmcVersionFp32 ? 4 : 2;
  const size_t expected = kLlmcHeaderBytes + info.num_parameters * elem;
  if (size != expected) {
    throw ConfigError(path + ": file has " + std::to_string(size) + " bytes, expected " + std::to_string(expected) +
                      " (1024-byte header + " + std::to_string(info.num_parameters) + " " +
                      (elem == 4 ? "fp32" : "bf16") + " parameters for " + shape_text(info.config) +
                      "): " + (size < expected ? "the file is truncated" : "trailing data"));
  }
  return info;
}

Fd open_model(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) throw ConfigError(path + ": cannot open: " + std::strerror(errno));
  return f;
}

void read_params(int fd, const std::string& path, const LlmcModelInfo& info, float* params) {
  if (info.version == kLlmcVersionFp32) {
    read_exact(fd, path, params, info.num_parameters * sizeof(float), kLlmcHeaderBytes);
    return;
  }
  // bf16 is the top half of an fp32, so widening is exact: shift into place, in chunks to bound memory.
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<uint16_t> buf(kChunk);
  for (size_t done = 0; done < info.num_parameters; done += kChunk) {
    const size_t n = std::min(kChunk, info.num_parameters - done);
    read_exact(fd, path, buf.data(), n * 2, kLlmcHeaderBytes + done * 2);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(buf[i]) << 16;
      std::memcpy(params + done + i, &bits, sizeof(float));
    }
  }
}

}  // namespace

LlmcModelInfo inspect_llmc_model(const std::string& path) {
  Fd f = open_model(path);
  return inspect_fd(f.fd, path);
}

GptConfig read_llmc_header(const std::string& path) { return inspect_llmc_model(path).config; }

void load_llmc_model(const std::string& path, GptConfig& cfg_out, std::vector<float>& params_out) {
  Fd f = open_model(path);
  const LlmcModelInfo info = inspect_fd(f.fd, path);
  params_out.resize(info.num_parameters);
  read_params(f.fd, path, info, params_out.data());
  cfg_out = info.config;
}

void load_llmc_model(const std::string& path, const GptConfig& expected, float* params) {
  Fd f = open_model(path);
  const LlmcModelInfo info = inspect_fd(f.fd, path);
  const GptConfig& got = info.config;
  const std::array<std::tuple<const char*, int, int>, 6> fields = {
      {{"layers", got.num_layers, expected.num_layers},
       {"heads", got.num_heads, expected.num_heads},
       {"channels", got.channels, expected.channels},
       {"as max sequence length", got.max_seq_len, expected.max_seq_len},
       {"as vocab size", got.vocab_size, expected.vocab_size},
       {"as padded vocab size", got.padded_vocab_size, expected.padded_vocab_size}}};
  for (const auto& [name, g, e] : fields) {
    if (g == e) continue;
    std::string what = name;
    // "header says 12 layers, expected 24" for counts, "header says 1024 as max sequence length, ..." otherwise.
    throw ConfigError(path + ": header says " + std::to_string(g) + " " + what + ", expected " + std::to_string(e) +
                      " (the model config and the checkpoint must match)");
  }
  read_params(f.fd, path, info, params);
}

std::optional<LlmcShapeMismatch> llmc_shape_mismatch(const GptConfig& expected, const GptConfig& file) {
  const std::array<std::tuple<const char*, int, int>, 6> fields = {
      {{"layers", expected.num_layers, file.num_layers},
       {"hidden", expected.channels, file.channels},
       {"heads", expected.num_heads, file.num_heads},
       {"seqLen", expected.max_seq_len, file.max_seq_len},
       {"vocab", expected.vocab_size, file.vocab_size},
       {"vocab (padded)", expected.padded_vocab_size, file.padded_vocab_size}}};
  for (const auto& [name, e, f] : fields)
    if (e != f) return LlmcShapeMismatch{name, e, f};
  return std::nullopt;
}

void save_llmc_model(const std::string& path, const GptConfig& cfg, const float* params) {
  check_config(path, cfg);
  std::array<int32_t, 256> h{};
  h[0] = kLlmcModelMagic;
  h[1] = kLlmcVersionFp32;
  h[2] = cfg.max_seq_len;
  h[3] = cfg.vocab_size;
  h[4] = cfg.num_layers;
  h[5] = cfg.num_heads;
  h[6] = cfg.channels;
  h[7] = cfg.padded_vocab_size;
  AtomicFileWriter w(path);
  w.write(h.data(), kLlmcHeaderBytes);
  w.write(params, num_parameters(cfg) * sizeof(float));
  w.commit();
}

}  // namespace railyard::worker
