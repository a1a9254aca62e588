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

namespace {
// Every token of the shards, in order.
std::vector<uint16_t> tokens_of(const std::vector<std::string>& shards, int vocab) {
  std::vector<uint16_t> out;
  for (const auto& p : shards) {
    MappedShard s(p, vocab);
    out.insert(out.end(), s.tokens(), s.tokens() + s.num_tokens());
  }
  return out;
}
}  // namespace

TEST_CASE("prepare takes token shards as inputs: their tokens as they are, beside text, re-split into train and val") {
  TempDir dir;
  // A GPT-2 token shard (tokens up to 50000, as llm.c's FineWeb shards), given alone: no vocabulary files needed.
  std::vector<uint16_t> gpt2_tokens(30000);
  for (size_t i = 0; i < gpt2_tokens.size(); ++i) gpt2_tokens[i] = static_cast<uint16_t>((i * 7919) % 50000);
  write_shard(dir.file("fineweb_train_000001.bin"), gpt2_tokens.data(), gpt2_tokens.size());
  PrepareOptions o;
  o.inputs = {dir.file("fineweb_train_000001.bin")};
  o.output_dir = dir.file("gpt2");
  o.tokenizer = "gpt2";
  o.vocab_dir = dir.file("no-vocab-here");  // never read: no text to encode
  o.val_fraction = 0.25;
  o.shard_tokens = 10000;
  const PrepareResult r = prepare_dataset(o);
  CHECK(r.vocab_size == 50257);
  CHECK(r.total_tokens == 30000);
  CHECK(r.val_tokens == 7500);
  CHECK(r.train_shards.size() == 3);
  std::vector<uint16_t> got = tokens_of(r.train_shards, 50257);
  const std::vector<uint16_t> val = tokens_of(r.val_shards, 50257);
  got.insert(got.end(), val.begin(), val.end());
  CHECK(got == gpt2_tokens);
  const auto m = nlohmann::json::parse(test::slurp(r.manifest));
  CHECK(m["inputs"][0]["format"] == "token shard");
  CHECK(m["inputs"][0]["tokens"] == 30000);

  // Byte text and a shard of byte tokens under the byte tokenizer: the text's bytes, then the shard's tokens.
  const std::string text = test::slurp(kInputs[0]);
  std::vector<uint16_t> bytes_tokens(5000);
  for (size_t i = 0; i < bytes_tokens.size(); ++i) bytes_tokens[i] = static_cast<uint16_t>(i % 256);
  write_shard(dir.file("bytes.bin"), bytes_tokens.data(), bytes_tokens.size());
  PrepareOptions b;
  b.inputs = {kInputs[0], dir.file("bytes.bin")};
  b.output_dir = dir.file("mixed");
  const PrepareResult rb = prepare_dataset(b);
  CHECK(rb.total_tokens == text.size() + bytes_tokens.size());
  std::vector<uint16_t> want(text.begin(), text.end());
  for (auto& t : want) t &= 0xff;  // char -> unsigned byte
  want.insert(want.end(), bytes_tokens.begin(), bytes_tokens.end());
  std::vector<uint16_t> all = tokens_of(rb.train_shards, 256);
  const std::vector<uint16_t> bval = tokens_of(rb.val_shards, 256);
  all.insert(all.end(), bval.begin(), bval.end());
  CHECK(all == want);
  const auto mb = nlohmann::json::parse(test::slurp(rb.manifest));
  CHECK_FALSE(mb["inputs"][0].contains("format"));
  CHECK(mb["inputs"][1]["format"] == "token shard");

  // A GPT-2 shard under the byte tokenizer is refused naming the shard and the token; a shard cut short (a broken
  // download) naming the file; nothing is written either time.
  PrepareOptions bad;
  bad.inputs = {dir.file("fineweb_train_000001.bin")};
  bad.output_dir = dir.file("bad");
  try {
    prepare_dataset(bad);
    FAIL("a GPT-2 shard was taken as byte tokens");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("fineweb_train_000001.bin") != std::string::npos);
    CHECK(std::string(e.what()).find(">= vocab size 256") != std::string::npos);
  }
  const std::string whole = test::slurp(dir.file("bytes.bin"));
  test::write_bytes(dir.file("cut.bin"), whole.data(), whole.size() - 100);
  bad.inputs = {dir.file("cut.bin")};
  try {
    prepare_dataset(bad);
    FAIL("a truncated shard was taken");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("cut.bin") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir.file("bad/train_000000.bin")));
}
