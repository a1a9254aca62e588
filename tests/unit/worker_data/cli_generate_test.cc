// `railyard generate`: the key/value cache draws the same tokens as recomputing the whole sequence (greedy and
// sampled), the seed makes it repeatable, the prompt is echoed and continued, and bad input names the flag.
#include <doctest/doctest.h>

#include <cstdlib>
#include <regex>

#include "tests/unit/worker_data/test_util.h"

using railyard::test::run_command;
using railyard::test::TempDir;

namespace {

std::string env(const char* name) { return railyard::test::ctest_env(name); }

// The command's stdout: run_command merges stderr, where generate reports its timing on one "generated ..." line.
std::string text_of(const std::string& out) {
  return std::regex_replace(out, std::regex("generated [0-9]+ tokens after [^\n]*\n"), "");
}

std::string ids_of(const std::string& out) {
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(out, m, std::regex("ids:([0-9 ]+)")), out);
  return m[1];
}

}  // namespace

TEST_CASE("railyard generate: the same tokens with and without the key/value cache, repeatable by seed") {
  TempDir dir;
  const std::string bin = env("RAILYARD_BIN_DIR"), cli = bin + "/railyard", data = dir.file("data");
  REQUIRE(run_command(cli + " data prepare --input /usr/share/common-licenses/GPL-3 --output " + data).code == 0);
  const auto train = run_command(bin + "/railyard-worker train --model l=2,c=64,nh=4,t=96,v=256 --steps 60 --batch 8" +
                                 " --seq 64 --threads 1 --data " + data + " --export " + dir.file("model.bin"));
  REQUIRE_MESSAGE(train.code == 0, train.output);
  const std::string gen = cli + " generate --model " + dir.file("model.bin") + " --threads 1 --ids --prompt 'The GNU'";

  for (const char* how : {" --temperature 0 --tokens 60", " --temperature 0.9 --top-k 40 --top-p 0.95 --tokens 60"}) {
    CAPTURE(how);
    const auto cached = run_command(gen + how);
    const auto full = run_command(gen + how + " --no-cache");
    REQUIRE_MESSAGE(cached.code == 0, cached.output);
    REQUIRE_MESSAGE(full.code == 0, full.output);
    CHECK(ids_of(cached.output) == ids_of(full.output));
    const std::string text = text_of(cached.output);
    CHECK(text == text_of(full.output));
    CHECK(text.rfind("The GNU", 0) == 0);                     // the prompt, then its continuation
    CHECK(text.size() > std::string("The GNU").size() + 60);  // 60 new bytes (this model's tokens)
  }
  // Sampling: the seed repeats, another seed differs (60 draws from a 256-way distribution).
  const std::string sampled = gen + " --temperature 1 --tokens 60";
  CHECK(ids_of(run_command(sampled + " --seed 5").output) == ids_of(run_command(sampled + " --seed 5").output));
  CHECK(ids_of(run_command(sampled + " --seed 5").output) != ids_of(run_command(sampled + " --seed 6").output));

  // No prompt: generation starts from a newline (bytes).
  auto r = run_command(cli + " generate --model " + dir.file("model.bin") + " --tokens 5 --ids --temperature 0");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(text_of(r.output)[0] == '\n');

  // Bad input: exit 2 naming the flag.
  r = run_command(gen + " --tokens 500");
  CHECK(r.code == 2);
  CHECK(r.output.find("exceed the model's maxT 96") != std::string::npos);
  r = run_command(gen + " --tokenizer sentencepiece");
  CHECK(r.code == 2);
  CHECK(r.output.find("--tokenizer 'sentencepiece' is not one of auto, bytes, gpt2") != std::string::npos);
  r = run_command(gen + " --top-p 0");
  CHECK(r.code == 2);
  CHECK(r.output.find("--top-p must be in (0, 1]") != std::string::npos);
  r = run_command(cli + " generate --prompt x");
  CHECK(r.code == 2);
  CHECK(r.output.find("exactly one of --model FILE and --checkpoint DIR") != std::string::npos);
}
