// Damage the newest checkpoint in four ways; verify and the reader must notice, name the file and slice, and fall
// back to the previous checkpoint.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/cli.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "test_util.h"

using namespace railyard::ckpt;
using namespace railyard::ckpt::test;

namespace {

struct TwoSteps {
  TempDir dir;
  std::vector<TensorDef> defs = small_gpt(true);
  GlobalState s1 = GlobalState::make(defs, 1);
  GlobalState s2 = GlobalState::make(defs, 2);
  TwoSteps() {
    Layout l{2, 1, 1, 1};
    for (int step = 1; step <= 2; ++step) {
      const GlobalState& g = step == 1 ? s1 : s2;
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          WriterOptions o;
          o.root = dir.path();
          o.rank = r;
          o.world_size = 2;
          o.run_id = "c" + std::to_string(step);
          o.layout = l.to_json();
          Writer w(o);
          RankState rs = rank_state(g, l, r);
          w.snapshot(step, rs.shards);
          REQUIRE(w.wait(step, Clock::now() + std::chrono::seconds(30)).state == SaveState::Committed);
        });
      }
      for (auto& t : threads) t.join();
    }
  }
  std::string step2(const std::string& f) const { return dir / (step_dir_name(2) + "/" + f); }
};

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

int cli(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return cli_main(static_cast<int>(argv.size()), argv.data());
}

// The reader skips step 2 with a reason containing `why`, loads step 1 element-exact.
void expect_fallback(const TwoSteps& t, const std::string& why) {
  VerifyReport v = verify_checkpoint(t.dir.path(), 2);
  CHECK_FALSE(v.ok);
  REQUIRE_FALSE(v.problems.empty());
  CHECK_MESSAGE(v.problems.front().find(why) != std::string::npos, v.problems.front());
  std::vector<std::string> skipped;
  CHECK(Reader(t.dir.path()).newest_valid_step(&skipped) == 1);
  REQUIRE(skipped.size() == 1);
  CHECK_MESSAGE(skipped.front().find(why) != std::string::npos, skipped.front());
  CHECK(cli({"ckpt", "verify", t.dir.path(), "--step", "2"}) == 1);
  CHECK(cli({"ckpt", "verify", t.dir.path()}) == 1);  // every step: the damaged one fails the whole root
  CHECK(cli({"ckpt", "verify", t.dir.path(), "--step", "1"}) == 0);
  for (bool full : {false, true}) {
    FullTargets full_targets(t.defs);
    LoadOptions opt;
    opt.full_verify = full;
    LoadResult r = Reader(t.dir.path()).load_latest(full_targets.targets, opt);
    CHECK(r.step == 1);
    REQUIRE(r.skipped.size() == 1);
    CHECK_MESSAGE(r.skipped.front().find(why) != std::string::npos, r.skipped.front());
    CHECK(r.skipped.front().rfind("step-00000002", 0) == 0);
    CHECK(count_mismatches(t.s1, full_targets.data) == 0);
  }
}

}  // namespace

TEST_CASE("corruption: a flipped byte in a shard is a CRC32C mismatch naming file and slice") {
  TwoSteps t;
  Manifest m = Reader(t.dir.path()).read_manifest(2);
  const SliceRecord* qkv = nullptr;
  for (const auto& s : m.slices) {
    if (s.tensor == "qkvw" && s.file == "rank-00001.bin") qkv = &s;
  }
  REQUIRE(qkv != nullptr);
  flip_byte(t.step2(qkv->file), qkv->offset + qkv->bytes / 2);
  expect_fallback(t, "step-00000002: shard rank-00001.bin: CRC32C mismatch at slice " + slice_label(*qkv));
}

TEST_CASE("corruption: a flipped byte in the manifest") {
  TwoSteps t;
  const std::string path = t.step2("manifest.json");
  flip_byte(path, std::filesystem::file_size(path) / 2);
  expect_fallback(t, "manifest");
}

TEST_CASE("corruption: a changed digit in the manifest that leaves valid JSON is a manifest CRC32C mismatch") {
  TwoSteps t;
  const std::string path = t.step2("manifest.json");
  std::string text;
  {
    std::ifstream f(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  // The first slice offset of a second-rank shard: a plausible but wrong value, the JSON still parses.
  const size_t key = text.find("\"offset\":", text.find("rank-00001.bin"));
  REQUIRE(key != std::string::npos);
  size_t digit = key + 9;
  while (digit < text.size() && (text[digit] < '0' || text[digit] > '9')) ++digit;
  REQUIRE(digit < text.size());
  text[digit] = text[digit] == '1' ? '2' : '1';
  REQUIRE(nlohmann::json::accept(text));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  expect_fallback(t, "manifest CRC32C mismatch");
}

TEST_CASE("corruption: a truncated manifest") {
  TwoSteps t;
  const std::string path = t.step2("manifest.json");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  expect_fallback(t, "manifest");
}

TEST_CASE("corruption: a truncated shard") {
  TwoSteps t;
  const std::string path = t.step2("rank-00000.bin");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  expect_fallback(t, "shard rank-00000.bin has");
}

TEST_CASE("corruption: a deleted shard") {
  TwoSteps t;
  std::filesystem::remove(t.step2("rank-00001.bin"));
  expect_fallback(t, "shard rank-00001.bin is missing");
  auto infos = list_checkpoints(t.dir.path());  // what `railyard ckpt ls` shows
  REQUIRE(infos.size() == 2);
  CHECK(infos[0].complete);
  CHECK_FALSE(infos[1].complete);
  CHECK(infos[1].problem.find("rank-00001.bin is missing") != std::string::npos);
}

TEST_CASE("corruption: every checkpoint damaged is one clear error listing each") {
  TwoSteps t;
  std::filesystem::remove(t.step2("rank-00001.bin"));
  std::filesystem::remove(t.dir / (step_dir_name(1) + "/manifest.json"));
  FullTargets full(t.defs);
  try {
    Reader(t.dir.path()).load_latest(full.targets);
    FAIL("load_latest should have thrown");
  } catch (const railyard::Error& e) {
    std::string what = e.what();
    CHECK(what.find("no loadable checkpoint") != std::string::npos);
    CHECK(what.find("step-00000002: shard rank-00001.bin is missing") != std::string::npos);
    CHECK(what.find("step-00000001: incomplete: no manifest.json") != std::string::npos);
  }
}
