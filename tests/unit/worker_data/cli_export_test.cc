// `railyard model export`: a trained model as Hugging Face GPT-2 (model.safetensors + config.json), checked by an
// independent reader (tests/reference/hf_gpt2_check.py: the format parsed from its description, names and shapes as
// GPT2LMHeadModel wants them, every tensor against the llm.c file, and transformers' GPT-2 forward in float64 giving
// `railyard eval`'s loss); and a checkpoint directory back to the llm.c file the trainer's --export wrote.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/unit/worker_data/test_util.h"

using railyard::test::run_command;
using railyard::test::slurp;
using railyard::test::TempDir;

namespace {

std::string env(const char* name) { return railyard::test::ctest_env(name); }

}  // namespace

TEST_CASE("railyard model export writes a Hugging Face GPT-2 that an independent reader computes the same loss with") {
  TempDir dir;
  const std::string bin = env("RAILYARD_BIN_DIR"), src = env("RAILYARD_SOURCE_DIR");
  const std::string cli = bin + "/railyard", data = dir.file("data");
  REQUIRE(run_command(cli + " data prepare --input /usr/share/common-licenses/GPL-3 --output " + data +
                      " --val-fraction 0.2")
              .code == 0);
  const auto train = run_command(bin + "/railyard-worker train --model l=2,c=64,nh=4,t=64,v=256 --steps 15 --batch 4" +
                                 " --seq 32 --threads 1 --data " + data + " --export " + dir.file("model.bin") +
                                 " --ckpt-dir " + dir.file("ckpt") + " --ckpt-every 15");
  REQUIRE_MESSAGE(train.code == 0, train.output);

  auto r = run_command(cli + " model export --model " + dir.file("model.bin") + " --output " + dir.file("hf"));
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto config = nlohmann::json::parse(slurp(dir.file("hf/config.json")));
  CHECK(config["n_layer"] == 2);
  CHECK(config["n_embd"] == 64);
  CHECK(config["n_head"] == 4);
  CHECK(config["vocab_size"] == 256);

  const std::string shard = data + "/val_000000.bin";
  r = run_command("/usr/bin/python3 " + src + "/tests/reference/hf_gpt2_check.py " + dir.file("hf") + " " +
                  dir.file("model.bin") + " " + shard + " 4 32");
  REQUIRE_MESSAGE(r.code == 0,
                  "hf_gpt2_check.py (77: install python3-torch, scripts/install-deps.sh --with-torch): " << r.output);
  const auto check = nlohmann::json::parse(r.output);
  CHECK(check["tensors"] == 4 + 2 * 12);
  r = run_command(cli + " eval --model " + dir.file("model.bin") + " --data '" + shard +
                  "' --batch 4 --seq 32 --steps 1 --threads 1");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, std::regex("val_loss: +([0-9.]+)")));
  // float32 (ours) against float64 (the reader's forward): agree to float32 rounding.
  CHECK(std::stod(m[1]) == doctest::Approx(check["loss"].get<double>()).epsilon(1e-5));
  CHECK(std::stod(m[1]) < 5.0);  // trained: the comparison is not between two untrained models

  // From the checkpoint, the llm.c file again: the very bytes the trainer exported.
  r = run_command(cli + " model export --checkpoint " + dir.file("ckpt") + " --format llmc --output " +
                  dir.file("from-ckpt.bin"));
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(slurp(dir.file("from-ckpt.bin")) == slurp(dir.file("model.bin")));

  // Bad input names the flag (exit 2).
  r = run_command(cli + " model export --model " + dir.file("model.bin") + " --output x --format onnx");
  CHECK(r.code == 2);
  CHECK(r.output.find("--format 'onnx' is not one of hf, llmc") != std::string::npos);
  r = run_command(cli + " model export --model " + dir.file("model.bin"));
  CHECK(r.code == 2);
  CHECK(r.output.find("--output PATH is required") != std::string::npos);
}
