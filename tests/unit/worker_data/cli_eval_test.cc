// `railyard eval` prints the trainer's own validation numbers: for a model exported by `railyard-worker train
// --export`, for its checkpoint directory (newest and a given step), and for a checkpoint written by a tensor-parallel
// ZeRO world of 4 processes (whose validation runs in rounds, --val-steps > micro-batches per step).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "tests/unit/worker_data/test_util.h"

using railyard::test::run_command;
using railyard::test::TempDir;

namespace {

std::string bin(const char* name) { return railyard::test::bin_path(name); }

// "validation step=20 val_loss=4.064723" (the last such line of rank 0 or the only rank) -> "4.064723"
std::string trainer_val_loss(const std::string& log, int step) {
  const std::regex re("validation step=" + std::to_string(step) + " val_loss=([0-9.]+)");
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(log, m, re), log);
  return m[1];
}

std::string eval_val_loss(const std::string& out) {
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("val_loss: +([0-9.]+)")), out);
  return m[1];
}

// Shards of the GPL text in DIR/data, a fifth of it for validation; returns that directory.
std::string prepare_data(const TempDir& dir) {
  const std::string data = dir.file("data");
  REQUIRE(run_command(bin("railyard") + " data prepare --input /usr/share/common-licenses/GPL-3 --output " + data +
                      " --val-fraction 0.2")
              .code == 0);
  return data;
}
}  // namespace

TEST_CASE("railyard eval prints the trainer's validation loss for an exported model and its checkpoints") {
  TempDir dir;
  const std::string data = prepare_data(dir), cli = bin("railyard"), worker = bin("railyard-worker");
  const std::string shape = " --data " + data + " --batch 4 --seq 32 --threads 1";
  const auto train =
      run_command(worker + " train --model tiny --steps 20 --val-every 10 --val-steps 5" + shape + " --export " +
                  dir.file("model.bin") + " --ckpt-dir " + dir.file("ckpt") + " --ckpt-every 10");
  REQUIRE_MESSAGE(train.code == 0, train.output);
  const std::string at10 = trainer_val_loss(train.output, 10), at20 = trainer_val_loss(train.output, 20);
  REQUIRE(at10 != at20);  // training moved the model: the comparisons below can tell the steps apart

  auto r = run_command(cli + " eval --model " + dir.file("model.bin") + " --steps 5" + shape);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(eval_val_loss(r.output) == at20);
  const double loss = std::stod(at20);
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, std::regex("perplexity: ([0-9.]+)")));
  CHECK(std::stod(m[1]) == doctest::Approx(std::exp(loss)).epsilon(1e-4));

  r = run_command(cli + " eval --checkpoint " + dir.file("ckpt") + " --steps 5" + shape);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(eval_val_loss(r.output) == at20);
  CHECK(r.output.find("(step 20)") != std::string::npos);
  r = run_command(cli + " eval --checkpoint " + dir.file("ckpt") + " --step 10 --steps 5" + shape);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(eval_val_loss(r.output) == at10);

  // Bad input: exit 2 naming the flag, exit 1 naming the directory.
  r = run_command(cli + " eval --model " + dir.file("model.bin") + " --checkpoint " + dir.file("ckpt") + shape);
  CHECK(r.code == 2);
  CHECK(r.output.find("exactly one of --model FILE and --checkpoint DIR") != std::string::npos);
  r = run_command(cli + " eval --model " + dir.file("model.bin") + " --data " + data + " --seq 999");
  CHECK(r.code == 2);
  CHECK(r.output.find("--seq 999 exceeds the model's maxT") != std::string::npos);
  r = run_command(cli + " eval --checkpoint " + dir.file("nothing") + shape);
  CHECK(r.code == 1);
  CHECK(r.output.find("checkpoint directory " + dir.file("nothing") + " does not exist") != std::string::npos);
}

TEST_CASE("railyard eval reads a checkpoint a tensor-parallel ZeRO world wrote") {
  TempDir dir;
  const std::string data = prepare_data(dir), cli = bin("railyard"), worker = bin("railyard-worker");
  const std::string shape = " --data " + data + " --batch 4 --seq 32 --threads 1";
  // dp 2 x tp 2, one micro-batch per step and rank: 5 validation batches run in 5 rounds.
  const auto train = run_command(worker + " train --nproc 4 --tp 2 --zero 1 --global-batch 256 --model tiny" +
                                 " --steps 20 --val-every 20 --val-steps 5" + shape + " --ckpt-dir " +
                                 dir.file("ckpt") + " --ckpt-every 20");
  REQUIRE_MESSAGE(train.code == 0, train.output);
  const double trainer = std::stod(trainer_val_loss(train.output, 20));
  const auto r = run_command(cli + " eval --checkpoint " + dir.file("ckpt") + " --steps 5" + shape);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  // Tensor parallelism sums in another order: equal to a few ulps of the printed digits, not bitwise.
  CHECK(std::stod(eval_val_loss(r.output)) == doctest::Approx(trainer).epsilon(1e-5));
  CHECK(trainer < 5.0);  // trained (the untrained model's loss is ln 256 = 5.55)
}
