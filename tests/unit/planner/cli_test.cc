// `railyard plan` end to end: the binary's output and its one-line errors naming the flag at fault.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/ctest_env.h"

namespace {

struct Run {
  int code = -1;
  std::string out;  // stdout and stderr
};

Run plan(const std::string& args, bool merge_stderr = true) {
  const std::string cmd =
      railyard::test::bin_path("railyard") + " plan " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Run r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace

TEST_CASE("railyard plan: GPT-3 175B on 1,024 A100s, JSON") {
  const Run r =
      plan("--model gpt3-175b --gpus 1024 --gpu a100 --global-batch 1536 --tokens 300e9 --top 3 --json", false);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j["plans"].size() == 3);
  const auto& best = j["plans"][0];
  CHECK(best["layout"]["dp"].get<int>() * best["layout"]["tp"].get<int>() * best["layout"]["pp"].get<int>() == 1024);
  CHECK(best["memoryBytes"]["total"].get<double>() <= best["memoryBytes"]["capacity"].get<double>());
  // The best plan beats the published 140 TFLOP/s layout (34 days): it may use newer techniques (sequence
  // parallelism, selective recomputation), but not by more than 2x.
  CHECK(best["days"].get<double>() < 34);
  CHECK(best["days"].get<double>() > 17);
  CHECK(j["plans"][1].contains("slowerBecause"));
}

TEST_CASE("railyard plan: text output on a topology file") {
  const Run r =
      plan("--model gpt2-1.5b --global-batch 512 --topology " + railyard::test::ctest_env("RAILYARD_SOURCE_DIR") +
           "/deploy/local/topologies/h100-8node.yaml --top 2");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("cluster: 64 x h100-sxm") != std::string::npos);
  CHECK(r.out.find("#1 dp") != std::string::npos);
  CHECK(r.out.find("#2 dp") != std::string::npos);
  CHECK(r.out.find("tokens/s") != std::string::npos);
  CHECK(r.out.find("MFU") != std::string::npos);
}

TEST_CASE("railyard plan --mixed: the speed-balanced split beats the even one") {
  const Run r = plan("--model gpt3-13b --global-batch 512 --mixed a100:64,h100:64 --json", false);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j["balancedStepSeconds"].get<double>() < j["evenStepSeconds"].get<double>());
  CHECK(j["speedup"].get<double>() > 1.2);
  // The H100 replicas (listed after the A100 ones) take more micro-batches.
  const auto mbs = j["balancedMicroBatchesPerReplica"].get<std::vector<int>>();
  REQUIRE(mbs.size() >= 2);
  CHECK(mbs.back() > mbs.front());
  const Run bad = plan("--model gpt3-13b --global-batch 512 --mixed a100:64,h100");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("--mixed 'h100' is not TYPE:GPUS") != std::string::npos);
  // With pp 4 every pipeline can also span the types: 2 A100 + 2 H200 stages, cut in proportion to speed with the
  // larger-memory H200s (141 GB) first, beats the even 10/10/10/10 cut.
  const Run pipe = plan("--model gpt3-13b --global-batch 256 --mixed a100:64,h200:64 --tp 8 --pp 4 --json", false);
  REQUIRE(pipe.code == 0);
  const auto mp = nlohmann::json::parse(pipe.out)["mixedPipeline"];
  REQUIRE(mp.is_object());
  CHECK(mp["stageDevices"] == nlohmann::json::array({"h200", "h200", "a100-80gb", "a100-80gb"}));
  CHECK(mp["evenStageLayers"] == nlohmann::json::array({10, 10, 10, 10}));
  const auto layers = mp["stageLayers"].get<std::vector<int>>();
  CHECK(layers.front() > layers.back());
  CHECK(mp["balancedStepSeconds"].get<double>() < mp["evenStepSeconds"].get<double>());
  CHECK(mp["fits"] == true);
}

TEST_CASE("railyard plan: bad input names the flag and exits 2 (1 when nothing fits)") {
  struct Case {
    const char* args;
    int code;
    const char* message;
  };
  const Case cases[] = {
      {"--model gpt3-175b --gpus abc --gpu a100 --global-batch 8", 2, "--gpus 'abc' is not a non-negative integer"},
      {"--model gpt5 --gpus 8 --gpu a100 --global-batch 8", 2, "--model 'gpt5' is not a preset"},
      {"--model tiny --gpus 8 --gpu a100", 2, "--global-batch (sequences per step) is required"},
      {"--model tiny --gpus 8 --gpu v100 --global-batch 8", 2, "unknown GPU type 'v100'"},
      {"--model tiny --gpus 8 --gpu a100 --global-batch 8 --recompute sometimes", 2, "--recompute must be"},
      {"--model tiny --gpus 8 --gpu a100 --global-batch 8 --dropout maybe", 2, "--dropout must be on or off"},
      {"--model tiny --gpus 8 --gpu a100 --global-batch 8 --tokens lots", 2, "--tokens 'lots' is not a number"},
      {"--layers 2 --hidden 64 --gpus 8 --gpu a100 --global-batch 8", 2, "--heads is required without --model"},
      {"--model tiny --gpus 8 --gpu a100 --global-batch 8 --frobnicate 1", 2, "unknown flag '--frobnicate'"},
      {"--model tiny --gpus 8 --global-batch 8 --topology /nonexistent/t.yaml", 1, "/nonexistent/t.yaml"},
      {"--model gpt3-175b --gpus 8 --gpu a100 --global-batch 8", 1, "no layout fits: the smallest needs"},
  };
  for (const Case& c : cases) {
    const Run r = plan(c.args);
    INFO(std::string(c.args) << " -> " << r.out);
    CHECK(r.code == c.code);
    CHECK(r.out.find(c.message) != std::string::npos);
    if (c.code == 2) CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 2);  // one error line + the --help pointer
  }
}

TEST_CASE("railyard plan: activations as the worker stores them (no dropout) unless --dropout on") {
  // gpt2-124m on one CPU process, one layout pinned: only the activations differ, by the dropout masks and the
  // dropped attention probabilities (docs/planner.md "Memory per GPU").
  const std::string args = "--model gpt2-124m --gpus 1 --gpu cpu --global-batch 4 --micro-batch 4 --json --top 1";
  const Run off = plan(args, false), on = plan(args + " --dropout on", false);
  REQUIRE(off.code == 0);
  REQUIRE(on.code == 0);
  const auto a = nlohmann::json::parse(off.out), b = nlohmann::json::parse(on.out);
  CHECK(a["model"]["dropout"] == false);
  CHECK(b["model"]["dropout"] == true);
  const auto& ma = a["plans"][0]["memoryBytes"];
  const auto& mb = b["plans"][0]["memoryBytes"];
  CHECK(ma["params"] == mb["params"]);
  // Per layer S (8 + 24 + 2 a s / h) without dropout against S (10 + 24 + 5 a s / h) with it (s 1024, a 12, h 768);
  // the embedding output and the logits are the same in both.
  const double as_h = 12.0 * 1024 / 768, S = 4.0 * 1024 * 768, layers = 12, e = 4;  // fp32 activations on the CPU
  const double per_layer_delta = (e / 2) * S * ((10 + 24 + 5 * as_h) - (8 + 24 + 2 * as_h));
  CHECK(mb["activations"].get<double>() - ma["activations"].get<double>() ==
        doctest::Approx(layers * per_layer_delta).epsilon(1e-9));
}

TEST_CASE("railyard plan: gpt2-774m on one cpu offloads its optimizer only when it does not fit otherwise") {
  // --dropout on: with the dropout masks gpt2-774m just misses the CPU profile's memory without offload (without them
  // it fits, and nothing is offloaded).
  const std::string base = "--model gpt2-774m --global-batch 1 --gpus 1 --gpu cpu --recompute none --dropout on --json";
  const Run fallback = plan(base, false);
  REQUIRE(fallback.code == 0);
  const auto best = nlohmann::json::parse(fallback.out)["plans"][0];
  CHECK(best["layout"]["offload"].get<bool>());
  CHECK(best["memoryBytes"]["optimizer"].get<double>() == 0);
  CHECK(best["memoryBytes"]["host"].get<double>() > 9e9);  // 0.77 B parameters x (8 state + 4 gradient copy) bytes
  CHECK(best["time"]["offloadUpdate"].get<double>() >= best["time"]["optimizer"].get<double>());
  const Run off = plan(base + " --offload off");
  CHECK(off.code == 1);  // nothing fits without offload
  CHECK(plan(base + " --offload sometimes").code == 2);
  // A small model fits as it is: no offload unless pinned.
  const Run small = plan("--model gpt2-124m --global-batch 1 --gpus 1 --gpu cpu --recompute none --json", false);
  REQUIRE(small.code == 0);
  CHECK_FALSE(nlohmann::json::parse(small.out)["plans"][0]["layout"]["offload"].get<bool>());
}
