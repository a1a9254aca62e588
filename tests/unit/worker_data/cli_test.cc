#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/unit/worker_data/test_util.h"
#include "worker/data/shard.h"
#include "worker/interop/llmc_model.h"

using namespace railyard;
using railyard::test::run_command;
using railyard::test::TempDir;

namespace {

std::string cli() {
  const std::string path = railyard::test::bin_path("railyard");
  REQUIRE_MESSAGE(std::filesystem::exists(path), (path + " is missing: build the `railyard` target"));
  return path;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("railyard --help and usage errors exit 0 and 2") {
  const std::string bin = cli();
  struct Case {
    std::string args;  // after the binary
    int code;
    std::vector<std::string> says;  // each somewhere in the output
  };
  const std::vector<Case> cases = {
      {" --help", 0, {"data prepare --input FILE|URL...", "model inspect FILE"}},
      {"", 2, {"no command given"}},
      {" frobnicate", 2, {"unknown command 'frobnicate'"}},
      {" --frob", 2, {"unknown flag '--frob'"}},
      {" data shuffle", 2, {"unknown subcommand 'shuffle'"}},
      {" data prepare --input /usr/share/common-licenses/GPL-3 --outptu /tmp/x", 2, {"unknown flag '--outptu'"}},
      {" data prepare --input /usr/share/common-licenses/GPL-3", 2, {"--output DIR is required"}},
      {" data prepare --input a --output b --shard-tokens 12k",
       2,
       {"--shard-tokens '12k' is not a non-negative integer"}},
      {" data prepare --input a --output b --val-fraction 1.5", 2, {}},
      {" data prepare --input a --output b --tokenizer sentencepiece",
       2,
       {"--tokenizer 'sentencepiece' is not known (bytes, gpt2)"}},
      {" data prepare --input a --output b --vocab-dir /tmp", 2, {"--vocab-dir needs --tokenizer gpt2"}},
      // `ckpt` is dispatched to the checkpoint library's command line.
      {" ckpt", 2, {"usage: railyard ckpt"}},
      {" model inspect", 2, {}},
      {" model export x", 2, {}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args);
    const auto r = run_command(bin + c.args);
    CHECK(r.code == c.code);
    for (const std::string& part : c.says) CHECK(contains(r.output, part));
  }
}

TEST_CASE("railyard data prepare and inspect on a real text file") {
  const std::string bin = cli();
  TempDir dir;
  const std::string out = dir.file("data");
  auto r = run_command(bin + " data prepare --input /usr/share/common-licenses/GPL-3 --output " + out +
                       " --val-fraction 0.2 --shard-tokens 10000");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string text = test::slurp("/usr/share/common-licenses/GPL-3");
  const size_t train = text.size() - static_cast<size_t>(text.size() * 0.2);
  CHECK(contains(r.output, "train: " + std::to_string(train) + " tokens"));
  CHECK(contains(r.output, "input bytes [0, " + std::to_string(train) + ")"));
  CHECK(std::filesystem::exists(out + "/train_000000.bin"));
  CHECK(std::filesystem::exists(out + "/val_000000.bin"));

  r = run_command(bin + " data inspect " + out + "/train_000000.bin --tokens 30");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "tokens:   10000"));
  CHECK(contains(r.output, "magic:    20240520"));
  CHECK(contains(r.output, text.substr(0, 30)));

  // data sample runs the training loader: deterministic, and skipping k steps lands where k steps of output end.
  const std::string sample = bin + " data sample " + out + " --batch 2 --seq 24 --seed 5";
  auto s1 = run_command(sample + " --steps 3");
  REQUIRE_MESSAGE(s1.code == 0, s1.output);
  CHECK(s1.output == run_command(sample + " --steps 3").output);
  CHECK(contains(s1.output, "\"position\":6"));
  auto s2 = run_command(sample + " --skip 2 --steps 1");
  REQUIRE_MESSAGE(s2.code == 0, s2.output);
  const size_t from1 = s1.output.find("step 2 (epoch 0)"), from2 = s2.output.find("step 2 (epoch 0)");
  REQUIRE(from1 != std::string::npos);
  REQUIRE(from2 != std::string::npos);
  CHECK(s1.output.substr(from1) == s2.output.substr(from2));
  CHECK(run_command(bin + " data sample " + dir.file("nothing_*.bin")).code == 1);
  CHECK(run_command(bin + " data sample " + out + " --batch 0").code == 2);

  // --tokenizer gpt2 without its vocabulary: exit 1, naming the missing file and the script that fetches it, and
  // nothing written. (With the vocabulary: worker_data_gpt2_tests.)
  r = run_command(bin + " data prepare --tokenizer gpt2 --vocab-dir " + dir.file("no-vocab") +
                  " --input /usr/share/common-licenses/GPL-3 --output " + dir.file("gpt2"));
  CHECK(r.code == 1);
  CHECK(contains(r.output, dir.file("no-vocab") + "/encoder.json is missing"));
  CHECK(contains(r.output, "scripts/fetch_gpt2_vocab.sh"));
  CHECK_FALSE(std::filesystem::exists(dir.file("gpt2")));

  // Running again without --force fails (exit 1) and says why.
  r = run_command(bin + " data prepare --input /usr/share/common-licenses/GPL-3 --output " + out);
  CHECK(r.code == 1);
  CHECK(contains(r.output, "pass --force"));

  // A bad shard: exit 1, with the file and byte offset.
  std::vector<uint16_t> tokens(10, 65);
  tokens[3] = 700;
  worker::write_shard(dir.file("bad.bin"), tokens.data(), tokens.size());
  r = run_command(bin + " data inspect " + dir.file("bad.bin") + " --vocab 256");
  CHECK(r.code == 1);
  CHECK(contains(r.output, "shard " + dir.file("bad.bin") + ": token 700 at byte offset 1030 is >= vocab size 256"));
  r = run_command(bin + " data inspect " + dir.file("bad.bin"));
  CHECK(r.code == 0);
  CHECK(contains(r.output, "not decoded"));
}

TEST_CASE("railyard model inspect shows the llm.c header and parameter count") {
  const std::string bin = cli();
  TempDir dir;
  const worker::GptConfig c = railyard::test::small_byte_gpt();
  std::vector<float> params(worker::num_parameters(c), 1.0f);
  const std::string path = dir.file("m.bin");
  worker::save_llmc_model(path, c, params.data());
  auto r = run_command(bin + " model inspect " + path);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "version 3 (fp32)"));
  CHECK(contains(r.output, "parameters:  " + std::to_string(params.size())));
  CHECK(contains(r.output, "layers:      2"));
  // wte starts right after the header; wpe after wte's 256*16 floats.
  CHECK(contains(r.output, "  wte 4096 1024\n"));
  CHECK(contains(r.output, "  wpe 512 17408\n"));

  std::filesystem::resize_file(path, 2000);
  r = run_command(bin + " model inspect " + path);
  CHECK(r.code == 1);
  CHECK(contains(r.output, "file has 2000 bytes, expected"));
}
