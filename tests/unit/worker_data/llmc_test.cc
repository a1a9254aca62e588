#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "common/error.h"
#include "tests/unit/worker_data/test_util.h"
#include "worker/interop/llmc_model.h"

using namespace railyard;
using namespace railyard::worker;
using railyard::test::TempDir;

namespace {

// V 50 pads to Vp 128: the padded rows are part of what the file carries.
GptConfig small_config() { return make_gpt_config(/*L=*/2, /*C=*/8, /*NH=*/2, /*maxT=*/16, /*V=*/50); }

// llm.c's tensor sizes written out from its layout, independently of param_sizes().
std::vector<size_t> llmc_sizes(size_t Vp, size_t maxT, size_t L, size_t C) {
  return {Vp * C, maxT * C, L * C,         L * C,     L * 3 * C * C, L * 3 * C, L * C * C, L * C,
          L * C,  L * C,    L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C,     C,         C};
}

std::string header(int32_t magic, int32_t version, const GptConfig& c) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version;
  h[2] = c.max_seq_len;
  h[3] = c.vocab_size;
  h[4] = c.num_layers;
  h[5] = c.num_heads;
  h[6] = c.channels;
  h[7] = c.padded_vocab_size;
  return std::string(reinterpret_cast<const char*>(h.data()), 1024);
}

std::string message(auto&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a hand-built llm.c file loads every tensor from its offset") {
  TempDir dir;
  const GptConfig c = small_config();
  const std::vector<size_t> sizes = llmc_sizes(128, 16, 2, 8);
  // Tensor k holds k * 100000 + j at element j: each value names its tensor and position.
  std::string file = header(20240326, 3, c);
  size_t total = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (size_t j = 0; j < sizes[k]; ++j) {
      const float v = static_cast<float>(k * 100000 + j);
      file.append(reinterpret_cast<const char*>(&v), 4);
    }
    total += sizes[k];
  }
  const std::string path = dir.file("model.bin");
  test::write_bytes(path, file.data(), file.size());

  CHECK(read_llmc_header(path) == c);
  const LlmcModelInfo info = inspect_llmc_model(path);
  CHECK(info.version == 3);
  CHECK(info.num_parameters == total);
  CHECK(info.file_bytes == 1024 + 4 * total);

  GptConfig got;
  std::vector<float> params;
  load_llmc_model(path, got, params);
  CHECK(got == c);
  REQUIRE(params.size() == total);
  const auto ours = param_sizes(c);
  size_t offset = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    CAPTURE(k);
    CHECK(ours[k] == sizes[k]);
    CHECK(params[offset] == static_cast<float>(k * 100000));
    CHECK(params[offset + sizes[k] - 1] == static_cast<float>(k * 100000 + sizes[k] - 1));
    // And the float at the tensor's byte offset in the file is the one we loaded.
    float raw = 0;
    std::memcpy(&raw, file.data() + 1024 + offset * 4, 4);
    CHECK(raw == params[offset]);
    offset += sizes[k];
  }

  // The caller-buffer form reads the same.
  std::vector<float> buf(total);
  load_llmc_model(path, c, buf.data());
  CHECK(std::memcmp(buf.data(), params.data(), total * 4) == 0);
}

TEST_CASE("save then load is bit-exact, and the file is llm.c's layout") {
  TempDir dir;
  const GptConfig c = small_config();
  const size_t n = num_parameters(c);
  std::vector<float> params(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 0.02f);
  for (auto& p : params) p = dist(rng);
  params[0] = -0.0f;
  params[1] = std::numeric_limits<float>::denorm_min();
  params[2] = std::numeric_limits<float>::infinity();
  params[3] = std::numeric_limits<float>::quiet_NaN();
  const std::string path = dir.file("out.bin");
  save_llmc_model(path, c, params.data());

  const std::string raw = test::slurp(path);
  REQUIRE(raw.size() == 1024 + 4 * n);
  CHECK(raw.substr(0, 1024) == header(20240326, 3, c));
  CHECK(std::memcmp(raw.data() + 1024, params.data(), 4 * n) == 0);

  GptConfig got;
  std::vector<float> back;
  load_llmc_model(path, got, back);
  CHECK(got == c);
  REQUIRE(back.size() == n);
  CHECK(std::memcmp(back.data(), params.data(), 4 * n) == 0);
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()) == 1);
}

TEST_CASE("version 5 (bf16) files are widened to fp32 exactly") {
  TempDir dir;
  const GptConfig c = small_config();
  const size_t n = num_parameters(c);
  std::string file = header(20240326, 5, c);
  std::vector<float> expected(n);
  for (size_t i = 0; i < n; ++i) {
    // Values with at most 8 significant bits are exact in bf16.
    expected[i] = static_cast<float>(static_cast<int>(i % 255) - 127) / 64.0f;
    uint32_t bits = 0;
    std::memcpy(&bits, &expected[i], 4);
    const uint16_t top = static_cast<uint16_t>(bits >> 16);
    file.append(reinterpret_cast<const char*>(&top), 2);
  }
  const std::string path = dir.file("bf16.bin");
  test::write_bytes(path, file.data(), file.size());
  CHECK(inspect_llmc_model(path).version == 5);
  GptConfig got;
  std::vector<float> back;
  load_llmc_model(path, got, back);
  CHECK(back == expected);
}

TEST_CASE("llmc_shape_mismatch names the first dimension that differs, as spec.model calls it") {
  const GptConfig c = small_config();
  CHECK_FALSE(llmc_shape_mismatch(c, c));
  struct Case {
    int GptConfig::*field;
    const char* dimension;
  } cases[] = {{&GptConfig::num_layers, "layers"}, {&GptConfig::channels, "hidden"},
               {&GptConfig::num_heads, "heads"},   {&GptConfig::max_seq_len, "seqLen"},
               {&GptConfig::vocab_size, "vocab"},  {&GptConfig::padded_vocab_size, "vocab (padded)"}};
  for (const auto& k : cases) {
    CAPTURE(k.dimension);
    GptConfig want = c;
    want.*k.field += 64;
    auto m = llmc_shape_mismatch(want, c);
    REQUIRE(m);
    CHECK(m->dimension == k.dimension);
    CHECK(m->expected == c.*k.field + 64);
    CHECK(m->file == c.*k.field);
  }
}

TEST_CASE("mismatched, truncated and foreign model files are refused, naming the file and the sizes") {
  TempDir dir;
  const GptConfig c = small_config();
  const size_t n = num_parameters(c);
  std::vector<float> params(n, 0.5f);
  const std::string path = dir.file("model.bin");
  save_llmc_model(path, c, params.data());
  const size_t full = 1024 + 4 * n;

  SUBCASE("expected config differs") {
    GptConfig want = c;
    want.num_layers = 24;
    std::vector<float> buf(num_parameters(want));
    CHECK(message([&] { load_llmc_model(path, want, buf.data()); }) ==
          path + ": header says 2 layers, expected 24 (the model config and the checkpoint must match)");
    want = c;
    want.max_seq_len = 1024;
    CHECK(message([&] { load_llmc_model(path, want, buf.data()); }).find("header says 16 as max sequence length") !=
          std::string::npos);
  }
  SUBCASE("truncated") {
    std::filesystem::resize_file(path, full - 4);
    const std::string m = message([&] { read_llmc_header(path); });
    CHECK(m.find(path + ": file has " + std::to_string(full - 4) + " bytes, expected " + std::to_string(full)) == 0);
    CHECK(m.find("the file is truncated") != std::string::npos);
    GptConfig got;
    std::vector<float> out;
    CHECK_THROWS_AS(load_llmc_model(path, got, out), ConfigError);
  }
  SUBCASE("trailing data") {
    std::filesystem::resize_file(path, full + 8);
    CHECK(message([&] { read_llmc_header(path); }).find("trailing data") != std::string::npos);
  }
  SUBCASE("shorter than a header") {
    test::write_bytes(path, "xy", 2);
    CHECK(message([&] { read_llmc_header(path); }).find("shorter than the 1024-byte llm.c header") !=
          std::string::npos);
  }
  SUBCASE("a token shard is not a model") {
    std::string f = header(20240520, 1, c);
    test::write_bytes(path, f.data(), f.size());
    CHECK(message([&] { read_llmc_header(path); }) ==
          path + ": bad magic 20240520 (expected 20240326): not an llm.c GPT-2 checkpoint");
  }
  SUBCASE("unsupported version") {
    std::string f = header(20240326, 4, c);
    test::write_bytes(path, f.data(), f.size());
    CHECK(message([&] { read_llmc_header(path); }).find("unsupported llm.c model version 4") != std::string::npos);
  }
  SUBCASE("nonsense shape") {
    GptConfig bad = c;
    bad.num_heads = 3;
    std::string f = header(20240326, 3, bad);
    test::write_bytes(path, f.data(), f.size());
    CHECK(message([&] { read_llmc_header(path); }) == path + ": channels 8 are not divisible by 3 heads");
    bad = c;
    bad.num_layers = 0;
    f = header(20240326, 3, bad);
    test::write_bytes(path, f.data(), f.size());
    CHECK(message([&] { read_llmc_header(path); }) == path + ": number of layers (L) is 0, must be positive");
  }
  SUBCASE("missing file") {
    CHECK(message([&] { read_llmc_header(dir.file("none.bin")); }).find("none.bin: cannot open") != std::string::npos);
    CHECK(message([&] { read_llmc_header(dir.path().string()); }) == dir.path().string() + ": not a regular file");
  }
  SUBCASE("saving a bad config is refused before anything is written") {
    GptConfig bad = c;
    bad.padded_vocab_size = 10;
    CHECK(message([&] {
            save_llmc_model(dir.file("bad.bin"), bad, params.data());
          }).find("padded vocab size 10 is below vocab size 50") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir.file("bad.bin")));
  }
}
