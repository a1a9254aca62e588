// Runs one fuzz target over its committed seed corpus and every crash input found so far (regressions/), as an
// ordinary unit test in every build (plain, ASan+UBSan), so a fixed finding stays fixed without clang or libFuzzer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::filesystem::path> inputs_under(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("fuzz target survives its seed corpus and every committed crash input") {
  const std::filesystem::path corpus = RAILYARD_FUZZ_CORPUS_DIR;
  const std::filesystem::path regressions = RAILYARD_FUZZ_REGRESSION_DIR;
  auto seeds = inputs_under(corpus);
  // An empty corpus would make this test pass vacuously.
  REQUIRE_MESSAGE(!seeds.empty(), "no seed inputs under ", corpus.string(),
                  ": run railyard_fuzz_seeds (docs/hardening.md)");
  auto all = seeds;
  for (auto& p : inputs_under(regressions)) all.push_back(p);
  for (const auto& path : all) {
    INFO("input: ", path.string());
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == 0);
  }
}
