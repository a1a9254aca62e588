// `railyard plan --moe-experts E --ep N`: the MoE block after the plans (docs/planner.md "Mixture of experts").
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>

#include "tests/ctest_env.h"

namespace {

// stdout + stderr of `railyard plan ARGS` and its exit code.
std::pair<int, std::string> plan(const std::string& args) {
  FILE* p = popen((railyard::test::bin_path("railyard") + " plan " + args + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST_CASE("railyard plan --moe-experts: parameters, states and the all-to-all choice") {
  // gpt2-124m with 16 experts top-2: 124.4M + 12 (15 (8 h^2 + 5 h) + 16 h) = 974.6M; ep 16: one expert per layer.
  auto [code, out] =
      plan("--model gpt2-124m --gpus 16 --gpu h100 --global-batch 256 --moe-experts 16 --moe-top-k 2 --ep 16 --top 1");
  REQUIRE(code == 0);
  CHECK(out.find("experts (E16 top-2 capacity factor 1.25, ep 16") != std::string::npos);
  CHECK(out.find("974.6M parameters, 124.6M per GPU") != std::string::npos);
  CHECK(out.find("over 2 node(s) x 8: flat") != std::string::npos);
  // ep 8 stays inside a node: no network, flat kept.
  std::tie(code, out) =
      plan("--model gpt2-124m --gpus 16 --gpu h100 --global-batch 256 --moe-experts 16 --ep 8 --top 1");
  REQUIRE(code == 0);
  CHECK(out.find("over 1 node(s) x 8") != std::string::npos);
  CHECK(out.find("-> flat") != std::string::npos);
  std::tie(code, out) = plan("--model gpt2-124m --gpus 16 --gpu h100 --global-batch 256 --moe-experts 16 --ep 3");
  CHECK(code != 0);
  CHECK(out.find("--ep 3 must divide --moe-experts 16") != std::string::npos);
}
