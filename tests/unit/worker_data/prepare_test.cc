#include "worker/data/prepare.h"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/unit/worker_data/test_util.h"
#include "worker/data/data_loader.h"
#include "worker/data/shard.h"
#include "worker/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace railyard;
using namespace railyard::worker;
using railyard::test::TempDir;

namespace {

const std::vector<std::string> kInputs = {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
                                          "/usr/share/common-licenses/MPL-2.0"};

std::string decode_all(const std::vector<std::string>& shards, std::vector<size_t>* sizes = nullptr) {
  std::string out;
  for (const auto& p : shards) {
    MappedShard s(p, kByteVocabSize);
    out += byte_decode(s.tokens(), s.num_tokens());
    if (sizes) sizes->push_back(s.num_tokens());
  }
  return out;
}

}  // namespace

TEST_CASE("byte tokenizer round-trips every byte and refuses non-byte tokens") {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  const auto t = byte_encode(all);
  REQUIRE(t.size() == 256);
  CHECK(t[255] == 255);
  CHECK(byte_decode(t.data(), t.size()) == all);
  const std::vector<int32_t> bad = {72, 105, 256};
  try {
    byte_decode(bad.data(), bad.size());
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("token 256 at index 2") != std::string::npos);
  }
  CHECK(escape_for_terminal(std::string("a\tb\n\x1b[2J\x7f") + "\xc3\xa9") == "a\tb\n\\x1b[2J\\x7f\xc3\xa9");
  // Invalid UTF-8 is escaped byte by byte (a stray continuation byte, a truncated sequence, an overlong form, a
  // surrogate, a lead byte above U+10FFFF); well-formed 2-, 3- and 4-byte sequences stay.
  CHECK(escape_for_terminal("\x80x\xc3") == "\\x80x\\xc3");
  CHECK(escape_for_terminal("\xc0\xaf \xed\xa0\x80 \xf5\x80\x80\x80") ==
        "\\xc0\\xaf \\xed\\xa0\\x80 \\xf5\\x80\\x80\\x80");
  CHECK(escape_for_terminal("\xe2\x82\xac \xf0\x9f\x98\x80 \xe6\x97\xa5") ==
        "\xe2\x82\xac \xf0\x9f\x98\x80 \xe6\x97\xa5");
}

TEST_CASE("prepare on real text files: decoded train + val shards equal the input, split at the stated boundary") {
  TempDir dir;
  std::string expected;
  for (const auto& f : kInputs) expected += test::slurp(f);
  REQUIRE(expected.size() > 50000);

  PrepareOptions o;
  o.inputs = kInputs;
  o.output_dir = dir.file("out");
  o.val_fraction = 0.1;
  o.shard_tokens = 16384;
  const PrepareResult r = prepare_dataset(o);

  const uint64_t val = static_cast<uint64_t>(std::floor(expected.size() * 0.1));
  CHECK(r.total_tokens == expected.size());
  CHECK(r.val_tokens == val);
  CHECK(r.train_tokens == expected.size() - val);
  CHECK(r.train_shards.size() == (r.train_tokens + 16383) / 16384);
  CHECK(r.val_shards.size() == (r.val_tokens + 16383) / 16384);
  CHECK(r.train_shards[0] == dir.file("out/train_000000.bin"));
  CHECK(r.val_shards[0] == dir.file("out/val_000000.bin"));

  std::vector<size_t> sizes;
  CHECK(decode_all(r.train_shards, &sizes) == expected.substr(0, r.train_tokens));
  CHECK(decode_all(r.val_shards) == expected.substr(r.train_tokens));
  for (size_t i = 0; i + 1 < sizes.size(); ++i) CHECK(sizes[i] == 16384);

  // Nothing but shards and the manifest is left behind (no staging directory, no temp files).
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.file("out"))) {
    const std::string n = e.path().filename().string();
    CHECK((n == "prepare.json" || n.rfind("train_", 0) == 0 || n.rfind("val_", 0) == 0));
    ++entries;
  }
  CHECK(entries == r.train_shards.size() + r.val_shards.size() + 1);
  const auto m = nlohmann::json::parse(test::slurp(r.manifest));
  CHECK(m["split_offset"] == r.train_tokens);
  CHECK(m["tokenizer"] == "bytes");
  CHECK(m["inputs"].size() == kInputs.size());

  // The loader accepts the result with the byte vocabulary, train by directory and val by pattern.
  DataLoader train(dir.file("out"), 4, 64, 0, 1, 1, kByteVocabSize);
  CHECK(train.num_tokens() == r.train_tokens);
  DataLoader valid(dir.file("out/val_*.bin"), 4, 64, 0, 1, 1, kByteVocabSize, false);
  CHECK(valid.num_tokens() == r.val_tokens);
  std::vector<int32_t> in(256), tg(256);
  valid.next_batch(in.data(), tg.data());
  CHECK(byte_decode(in.data(), 64) == expected.substr(r.train_tokens, 64));
}

TEST_CASE("prepare refuses to mix with existing shards unless forced, and --force removes stale shards") {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {kInputs[0]};
  o.output_dir = dir.file("out");
  o.shard_tokens = 4000;
  const PrepareResult first = prepare_dataset(o);
  REQUIRE(first.train_shards.size() > 2);
  try {
    prepare_dataset(o);
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("already holds shards") != std::string::npos);
    CHECK(std::string(e.what()).find("--force") != std::string::npos);
  }
  o.force = true;
  o.shard_tokens = 1000000;
  o.val_fraction = 0;
  const PrepareResult second = prepare_dataset(o);
  CHECK(second.train_shards.size() == 1);
  CHECK(second.val_shards.empty());
  CHECK_FALSE(fs::exists(first.train_shards[1]));
  CHECK_FALSE(fs::exists(dir.file("out/val_000000.bin")));
  CHECK(decode_all(second.train_shards) == test::slurp(kInputs[0]));
}

TEST_CASE("prepare refuses bad options and inputs, naming them") {
  TempDir dir;
  auto message = [](const PrepareOptions& o) -> std::string {
    try {
      prepare_dataset(o);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  PrepareOptions o;
  o.output_dir = dir.file("out");
  CHECK(message(o).find("--input is missing") != std::string::npos);
  o.inputs = {dir.file("missing.txt")};
  CHECK(message(o) == "input " + dir.file("missing.txt") + ": No such file or directory");
  o.inputs = {dir.path().string()};
  CHECK(message(o).find("not a regular file") != std::string::npos);
  test::write_bytes(dir.file("empty.txt"), "", 0);
  o.inputs = {dir.file("empty.txt")};
  CHECK(message(o).find("inputs are empty") != std::string::npos);
  test::write_bytes(dir.file("tiny.txt"), "abc", 3);
  o.inputs = {dir.file("tiny.txt")};
  CHECK(message(o).find("leaves no validation tokens") != std::string::npos);
  o.val_fraction = 1.0;
  CHECK(message(o).find("--val-fraction") != std::string::npos);
  o.val_fraction = 0.1;
  o.shard_tokens = 0;
  CHECK(message(o).find("--shard-tokens 0") != std::string::npos);
  // Nothing was created by the failed runs.
  CHECK_FALSE(fs::exists(dir.file("out/train_000000.bin")));
}
