#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "tests/unit/worker_data/test_util.h"
#include "worker/data/data_loader.h"
#include "worker/data/permutation.h"
#include "worker/data/shard.h"

using namespace railyard;
using namespace railyard::worker;
using railyard::test::TempDir;

namespace {

// Three shards whose tokens are their global index (unique, < 65536), so the first input token of a row names the
// sample. Shard sizes give 312 + 187 + 486 = 985 samples at T = 16.
constexpr int kT = 16;
constexpr int kVocab = 65536;
const std::vector<size_t> kShardTokens = {5000, 3001, 7777};

struct Dataset {
  TempDir dir;
  std::vector<size_t> base;  // global index of each shard's first token
  size_t samples = 0;
  Dataset() {
    size_t next = 0;
    for (size_t s = 0; s < kShardTokens.size(); ++s) {
      std::vector<uint16_t> t(kShardTokens[s]);
      for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(next + i);
      write_shard(dir.file("train_00000" + std::to_string(s) + ".bin"), t.data(), t.size());
      base.push_back(next);
      next += t.size();
      samples += (kShardTokens[s] - 1) / kT;
    }
    // A val shard in the same directory must not be picked up by the directory form.
    std::vector<uint16_t> v(100, 1);
    write_shard(dir.file("val_000000.bin"), v.data(), v.size());
  }
  std::string dirname() const { return dir.path().string(); }
};

struct Batch {
  std::vector<int32_t> in, tg;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& l, int B) {
  Batch b{std::vector<int32_t>(static_cast<size_t>(B) * kT), std::vector<int32_t>(static_cast<size_t>(B) * kT)};
  l.next_batch(b.in.data(), b.tg.data());
  return b;
}

// Checks a row is a real sample of the data set (starts at a multiple of T inside one shard, targets shifted by
// one) and returns its identity: the global index of its first token.
int32_t check_row(const Dataset& d, const Batch& b, int row) {
  const int32_t* in = b.in.data() + row * kT;
  const int32_t* tg = b.tg.data() + row * kT;
  for (int t = 0; t < kT; ++t) {
    REQUIRE(in[t] == in[0] + t);
    REQUIRE(tg[t] == in[t] + 1);
  }
  const size_t first = static_cast<size_t>(in[0]);
  size_t s = 0;
  while (s + 1 < d.base.size() && first >= d.base[s + 1]) ++s;
  const size_t local = first - d.base[s];
  REQUIRE(local % kT == 0);
  REQUIRE(local / kT < (kShardTokens[s] - 1) / kT);  // the +1 target token exists inside the shard
  return in[0];
}

}  // namespace

TEST_CASE("shard patterns: a directory means its train_*.bin, globs expand sorted, no match is an error") {
  Dataset d;
  auto dir_files = expand_shard_pattern(d.dirname());
  REQUIRE(dir_files.size() == 3);
  CHECK(dir_files[0] == d.dir.file("train_000000.bin"));
  CHECK(dir_files[2] == d.dir.file("train_000002.bin"));
  CHECK(expand_shard_pattern(d.dir.file("val_*.bin")).size() == 1);
  CHECK(expand_shard_pattern(d.dir.file("train_000001.bin")).size() == 1);
  try {
    expand_shard_pattern(d.dir.file("test_*.bin"));
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("test_*.bin") != std::string::npos);
    CHECK(std::string(e.what()).find("railyard data prepare") != std::string::npos);
  }
}

TEST_CASE(
    "shard globs (spec.data.train/val): any pattern, files only, sorted; the default val glob sits beside train") {
  Dataset d;
  const std::string dir = d.dirname();
  // A glob other than train_*.bin selects exactly its files, sorted by name, whatever the order of creation.
  auto files = expand_shard_pattern(dir + "/train_00000[02].bin");
  CHECK(files == std::vector<std::string>{d.dir.file("train_000000.bin"), d.dir.file("train_000002.bin")});
  CHECK(expand_shard_pattern(dir + "/*.bin").size() == 4);  // three train shards and the val shard
  // A directory matched by a wildcard is not a shard.
  std::filesystem::create_directory(d.dir.file("train_999999.bin"));
  CHECK(expand_shard_pattern(dir + "/train_*.bin").size() == 3);
  CHECK(expand_shard_pattern(dir).size() == 3);
  // A loader built from a glob reads only the shards it matches.
  DataLoader two(dir + "/train_00000[02].bin", 2, kT, 0, 1, 7, kVocab);
  CHECK(two.num_shards() == 2);
  CHECK(two.num_tokens() == kShardTokens[0] + kShardTokens[2]);

  CHECK(shard_glob(dir) == dir + "/train_*.bin");
  CHECK(shard_glob(dir, "val_*.bin") == dir + "/val_*.bin");
  CHECK(shard_glob("/data/web/shard_*.bin", "val_*.bin") == "/data/web/shard_*.bin");
  CHECK(default_val_glob(dir) == dir + "/val_*.bin");
  CHECK(default_val_glob(dir + "/train_*.bin") == dir + "/val_*.bin");
  CHECK(default_val_glob("/data/*/tr_*.bin") == "/data/*/val_*.bin");
  CHECK(default_val_glob("train_*.bin") == "val_*.bin");
  CHECK(expand_shard_pattern(default_val_glob(dir + "/train_00000[01].bin")) ==
        std::vector<std::string>{d.dir.file("val_000000.bin")});
}

TEST_CASE("the loader counts tokens and samples, and every row is a real sample with shifted targets") {
  Dataset d;
  DataLoader l(d.dirname(), 4, kT, 0, 1, 42, kVocab);
  CHECK(l.num_shards() == 3);
  CHECK(l.num_tokens() == 5000 + 3001 + 7777);
  CHECK(l.samples_per_epoch() == d.samples);
  CHECK(l.steps_per_epoch() == d.samples / 4);
  for (int step = 0; step < 30; ++step) {
    Batch b = next(l, 4);
    for (int r = 0; r < 4; ++r) check_row(d, b, r);
  }
}

TEST_CASE("without shuffle the loader reads shards and samples in file order, like llm.c") {
  Dataset d;
  DataLoader l(d.dirname(), 3, kT, 0, 1, 42, kVocab, /*shuffle=*/false);
  Batch b = next(l, 3);
  CHECK(b.in[0] == 0);
  CHECK(b.in[kT] == kT);
  CHECK(b.in[2 * kT] == 2 * kT);
  // Two ranks without shuffle: rank 1 gets the second run of B samples.
  DataLoader r1(d.dirname(), 3, kT, 1, 2, 42, kVocab, false);
  CHECK(next(r1, 3).in[0] == 3 * kT);
  // Shard 0 has 312 samples = 104 steps of B = 3, so the 105th step starts shard 1.
  for (int i = 1; i < 104; ++i) next(l, 3);
  Batch cross = next(l, 3);  // samples 312, 313, 314 of the sequence = shard 1 samples 0, 1, 2
  CHECK(cross.in[0] == static_cast<int32_t>(d.base[1]));
}

TEST_CASE("same seed gives the same batches; another seed another order") {
  Dataset d;
  DataLoader a(d.dirname(), 4, kT, 0, 1, 1234, kVocab);
  DataLoader b(d.dirname(), 4, kT, 0, 1, 1234, kVocab);
  DataLoader c(d.dirname(), 4, kT, 0, 1, 999, kVocab);
  bool all_same_as_c = true;
  for (int step = 0; step < 600; ++step) {  // > 2 epochs of 246 steps
    Batch x = next(a, 4);
    REQUIRE(x == next(b, 4));
    if (!(x == next(c, 4))) all_same_as_c = false;
  }
  CHECK_FALSE(all_same_as_c);
  CHECK(a.epoch() == 2);
}

TEST_CASE("restore continues with exactly the same batches, also through JSON and across epochs") {
  Dataset d;
  for (int k : {0, 7, 245, 246, 300}) {
    CAPTURE(k);
    DataLoader a(d.dirname(), 4, kT, 1, 2, 77, kVocab);
    for (int i = 0; i < k; ++i) next(a, 4);
    const LoaderState s = a.state();
    CHECK(s.steps == static_cast<uint64_t>(k));
    const nlohmann::json j = s;
    const LoaderState back = j.get<LoaderState>();
    CHECK(back == s);

    DataLoader b(d.dirname(), 4, kT, 1, 2, 77, kVocab);
    next(b, 4);  // b is somewhere else before the restore
    b.restore(back);
    for (int i = 0; i < 150; ++i) REQUIRE(next(a, 4) == next(b, 4));
    CHECK(a.state() == b.state());
  }
}

TEST_CASE("state records epoch, position and shard index; reset goes back to the start") {
  Dataset d;
  DataLoader l(d.dirname(), 5, kT, 0, 1, 3, kVocab, false);
  const Batch first = next(l, 5);
  LoaderState s = l.state();
  CHECK(s.epoch == 0);
  CHECK(s.position == 5);
  CHECK(s.shard_index == 0);
  CHECK(s.seq_len == kT);
  CHECK(s.num_shards == 3);
  for (int i = 0; i < 70; ++i) next(l, 5);  // 355 samples: into shard 1 (312..498)
  CHECK(l.state().shard_index == 1);
  l.reset();
  CHECK(l.state().position == 0);
  CHECK(next(l, 5) == first);
}

TEST_CASE("ranks see disjoint samples that cover the epoch except the tail of less than one global step") {
  Dataset d;
  const int B = 2, world = 3;
  for (bool shuffle : {true, false}) {
    CAPTURE(shuffle);
    std::vector<DataLoader> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(d.dirname(), B, kT, r, world, 5, kVocab, shuffle);
    const size_t steps = ranks[0].steps_per_epoch();
    CHECK(steps == d.samples / (B * world));
    std::set<int32_t> seen;
    size_t rows = 0;
    for (size_t step = 0; step < steps; ++step) {
      for (int r = 0; r < world; ++r) {
        Batch b = next(ranks[r], B);
        for (int row = 0; row < B; ++row) {
          seen.insert(check_row(d, b, row));
          ++rows;
        }
      }
    }
    CHECK(rows == steps * B * world);
    CHECK(seen.size() == rows);                  // disjoint
    CHECK(d.samples - seen.size() < B * world);  // covering: only the tail is skipped
    CHECK(ranks[0].epoch() == 0);
    next(ranks[0], B);
    CHECK(ranks[0].epoch() == 1);
  }
}

TEST_CASE("epochs wrap around with a new order over the same samples") {
  Dataset d;
  const int B = 5;  // 985 samples = 197 steps of 5: nothing is skipped
  DataLoader l(d.dirname(), B, kT, 0, 1, 11, kVocab);
  REQUIRE(l.steps_per_epoch() == 197);
  std::vector<int32_t> e0, e1;
  for (int i = 0; i < 197; ++i) {
    Batch b = next(l, B);
    for (int r = 0; r < B; ++r) e0.push_back(check_row(d, b, r));
  }
  CHECK(l.epoch() == 0);
  for (int i = 0; i < 197; ++i) {
    Batch b = next(l, B);
    for (int r = 0; r < B; ++r) e1.push_back(check_row(d, b, r));
  }
  CHECK(l.epoch() == 1);
  CHECK(e0 != e1);
  std::vector<int32_t> s0 = e0, s1 = e1;
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  CHECK(s0 == s1);
  CHECK(std::adjacent_find(s0.begin(), s0.end()) == s0.end());
  CHECK(s0.size() == d.samples);
}

TEST_CASE("a state restores into a different world size: the global sample sequence continues") {
  Dataset d;
  // Two ranks with B = 2, then one rank with B = 4 (same global batch, as after an elastic shrink).
  std::vector<DataLoader> two;
  for (int r = 0; r < 2; ++r) two.emplace_back(d.dirname(), 2, kT, r, 2, 9, kVocab);
  for (int i = 0; i < 10; ++i)
    for (auto& l : two) next(l, 2);
  DataLoader one(d.dirname(), 4, kT, 0, 1, 9, kVocab);
  one.restore(two[0].state());
  for (int i = 0; i < 20; ++i) {
    Batch g = next(one, 4);
    Batch r0 = next(two[0], 2), r1 = next(two[1], 2);
    std::vector<int32_t> joined = r0.in;
    joined.insert(joined.end(), r1.in.begin(), r1.in.end());
    REQUIRE(g.in == joined);
  }
}

TEST_CASE("bad arguments, mismatched states and bad shards are refused with a clear message") {
  Dataset d;
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(message([&] { DataLoader(d.dirname(), 0, kT, 0, 1, 1, kVocab); }).find("B=0") != std::string::npos);
  CHECK(message([&] { DataLoader(d.dirname(), 1, 0, 0, 1, 1, kVocab); }).find("T=0") != std::string::npos);
  CHECK(message([&] { DataLoader(d.dirname(), 1, kT, 2, 2, 1, kVocab); }).find("rank 2 is outside 0..1") !=
        std::string::npos);
  const std::string little = message([&] { DataLoader(d.dirname(), 100, kT, 0, 10, 1, kVocab); });
  CHECK(little.find("985 samples") != std::string::npos);
  CHECK(little.find("B*world=1000") != std::string::npos);
  // Tokens reach 15777, so a vocab of 256 refuses the first shard with its name.
  const std::string vocab = message([&] { DataLoader(d.dirname(), 1, kT, 0, 1, 1, 256); });
  CHECK(vocab == "shard " + d.dir.file("train_000000.bin") + ": token 256 at byte offset 1536 is >= vocab size 256");

  DataLoader l(d.dirname(), 2, kT, 0, 1, 1, kVocab);
  LoaderState s = l.state();
  s.seed = 2;
  CHECK(message([&] { l.restore(s); }).find("seed is 2 in the checkpoint but 1 in this loader") != std::string::npos);
  s = l.state();
  s.seq_len = 32;
  CHECK(message([&] { l.restore(s); }).find("seq_len is 32") != std::string::npos);
  s = l.state();
  s.total_tokens += 1;
  CHECK(message([&] { l.restore(s); }).find("same shards") != std::string::npos);
  s = l.state();
  s.position = 100000;
  CHECK(message([&] { l.restore(s); }).find("position 100000") != std::string::npos);

  nlohmann::json j = l.state();
  j.erase("position");
  CHECK(message([&] { (void)j.get<LoaderState>(); }).find("missing field 'position'") != std::string::npos);
  j = l.state();
  j["epoch"] = "x";
  CHECK(message([&] { (void)j.get<LoaderState>(); }).find("field 'epoch' has the wrong type") != std::string::npos);
}

TEST_CASE("IndexPermutation is a bijection and shuffled_indices a permutation") {
  for (uint64_t n : {1ULL, 2ULL, 3ULL, 5ULL, 17ULL, 1000ULL, 4097ULL}) {
    CAPTURE(n);
    IndexPermutation p(n, mix_key(1, 2, n));
    std::vector<bool> hit(n, false);
    size_t fixed = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      REQUIRE(v < n);
      REQUIRE_FALSE(hit[v]);
      hit[v] = true;
      fixed += (v == i);
    }
    if (n >= 1000) CHECK(fixed < n / 10);  // it actually shuffles
    std::vector<size_t> s = shuffled_indices(n, 99);
    std::sort(s.begin(), s.end());
    for (size_t i = 0; i < n; ++i) REQUIRE(s[i] == i);
  }
  // Different keys give different orders.
  IndexPermutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += (a(i) == b(i));
  CHECK(same < 100);
}
