#include "worker/data/shard.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "common/error.h"
#include "tests/unit/worker_data/test_util.h"

using namespace railyard;
using namespace railyard::worker;
using railyard::test::TempDir;

namespace {
std::string error_of(const std::string& path, int vocab) {
  try {
    MappedShard s(path, vocab);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a written shard has llm.c's layout and maps back to the same tokens") {
  TempDir dir;
  std::mt19937 rng(7);
  std::vector<uint16_t> tokens(1000);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 50257);
  const std::string path = dir.file("train_000000.bin");
  write_shard(path, tokens.data(), tokens.size());

  const std::string raw = test::slurp(path);
  REQUIRE(raw.size() == 1024 + 2 * tokens.size());
  const auto* h = reinterpret_cast<const int32_t*>(raw.data());
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  CHECK(h[2] == 1000);
  for (int i = 3; i < 256; ++i) CHECK(h[i] == 0);

  const ShardHeader hdr = read_shard_header(path);
  CHECK(hdr.num_tokens == 1000);
  CHECK(hdr.file_bytes == raw.size());

  MappedShard s(path, 50257);
  REQUIRE(s.num_tokens() == tokens.size());
  CHECK(std::equal(tokens.begin(), tokens.end(), s.tokens()));
  // No temp file is left next to the shard.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()) == 1);

  MappedShard moved = std::move(s);
  CHECK(moved.num_tokens() == 1000);
  CHECK(moved.tokens()[999] == tokens[999]);
}

TEST_CASE("an empty shard is valid") {
  TempDir dir;
  const std::string path = dir.file("e.bin");
  write_shard(path, nullptr, 0);
  MappedShard s(path, 256);
  CHECK(s.num_tokens() == 0);
}

TEST_CASE("bad shards are refused with the file name and the byte offset") {
  TempDir dir;
  const std::vector<uint16_t> ok(300, 65);

  SUBCASE("wrong magic") {
    const std::string p = dir.file("magic.bin");
    test::write_raw_shard(p, 20240326, 1, 300, ok);
    CHECK(error_of(p, 256) ==
          "shard " + p + ": bad magic 20240326 at byte offset 0 (expected 20240520): not an llm.c token shard");
  }
  SUBCASE("wrong version") {
    const std::string p = dir.file("version.bin");
    test::write_raw_shard(p, 20240520, 2, 300, ok);
    CHECK(error_of(p, 256) == "shard " + p + ": unsupported version 2 at byte offset 4 (expected 1: uint16 tokens)");
  }
  SUBCASE("token count larger than the file") {
    const std::string p = dir.file("trunc.bin");
    test::write_raw_shard(p, 20240520, 1, 301, ok);
    CHECK(error_of(p, 256) == "shard " + p +
                                  ": token count 301 at byte offset 8 needs 1626 bytes but the file has 1624: the file "
                                  "is truncated");
    CHECK_THROWS_AS(read_shard_header(p), ConfigError);
  }
  SUBCASE("negative token count") {
    const std::string p = dir.file("neg.bin");
    test::write_raw_shard(p, 20240520, 1, -5, ok);
    CHECK(error_of(p, 256) == "shard " + p + ": negative token count -5 at byte offset 8");
  }
  SUBCASE("trailing bytes after the tokens") {
    const std::string p = dir.file("trail.bin");
    test::write_raw_shard(p, 20240520, 1, 299, ok);
    CHECK(error_of(p, 256) == "shard " + p +
                                  ": token count 299 at byte offset 8 accounts for 1622 bytes but the file has 1624: "
                                  "trailing data from byte offset 1622");
  }
  SUBCASE("file shorter than the header") {
    const std::string p = dir.file("short.bin");
    test::write_bytes(p, "abcdef", 6);
    CHECK(error_of(p, 256) ==
          "shard " + p + ": file has 6 bytes, shorter than the 1024-byte header: the file is truncated");
  }
  SUBCASE("token >= vocab") {
    const std::string p = dir.file("train_000.bin");
    std::vector<uint16_t> bad = ok;
    bad[256] = 300;  // byte offset 1024 + 2*256 = 1536
    bad[290] = 9999;
    write_shard(p, bad.data(), bad.size());
    CHECK(error_of(p, 256) == "shard " + p + ": token 300 at byte offset 1536 is >= vocab size 256");
    // The same file is fine for a vocabulary that holds both tokens.
    CHECK(error_of(p, 10000) == "");
    CHECK(error_of(p, 9999) == "shard " + p + ": token 9999 at byte offset 1604 is >= vocab size 9999");
  }
  SUBCASE("missing file and impossible vocab") {
    CHECK(error_of(dir.file("nope.bin"), 256).find("nope.bin: cannot open") != std::string::npos);
    const std::string p = dir.file("fine.bin");
    write_shard(p, ok.data(), ok.size());
    CHECK(error_of(p, 0).find("vocab size 0 is outside 1..65536") != std::string::npos);
    CHECK(error_of(p, 70000).find("vocab size 70000") != std::string::npos);
  }
}
