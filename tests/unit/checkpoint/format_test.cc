// Pure logic: CRC32C, box arithmetic, manifest serialisation, layout rules.
#include "checkpoint/format.h"

#include <doctest/doctest.h>

#include <random>

#include "checkpoint/crc32c.h"
#include "checkpoint/layout.h"
#include "checkpoint/writer.h"
#include "common/error.h"

using namespace railyard::ckpt;

TEST_CASE("crc32c matches the standard check value and both implementations agree") {
  const char* check = "123456789";
  CHECK(crc32c(check, 9) == 0xE3069283u);
  CHECK(crc32c_portable(check, 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(5000);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t start : {0u, 1u, 3u, 7u}) {
    for (size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 1000u, 4993u}) {
      CHECK(crc32c(buf.data() + start, len) == crc32c_portable(buf.data() + start, len));
    }
  }
  // Long buffers take the three-stream path: it must agree too, at every alignment and tail length.
  std::vector<unsigned char> big(3 * 3 * 4096 + 777);
  for (auto& b : big) b = static_cast<unsigned char>(rng());
  for (size_t start : {0u, 5u}) {
    for (size_t len : std::vector<size_t>{3 * 4096 - 1, 3 * 4096, 3 * 4096 + 9, 6 * 4096 + 100, big.size() - 5}) {
      CHECK(crc32c(big.data() + start, len) == crc32c_portable(big.data() + start, len));
    }
  }
  // Extending a CRC over a split buffer gives the CRC of the whole.
  uint32_t a = crc32c(buf.data(), 1234);
  CHECK(crc32c(buf.data() + 1234, buf.size() - 1234, a) == crc32c(buf.data(), buf.size()));
  MESSAGE("crc32c hardware path: " << std::string(crc32c_hardware() ? "SSE4.2" : "slicing-by-8"));
}

TEST_CASE("flat_range_to_boxes covers exactly the flat range, for every range of a 3-d box") {
  Box b{{1, 2, 3}, {3, 4, 5}};  // 60 elements
  const int64_t n = b.volume();
  for (int64_t begin = 0; begin <= n; begin += 7) {
    for (int64_t end = begin; end <= n; end += 5) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      size_t boxes = 0;
      for (const Box& sub : flat_range_to_boxes(b, begin, end)) {
        ++boxes;
        for (int64_t i = 0; i < sub.size[0]; ++i)
          for (int64_t j = 0; j < sub.size[1]; ++j)
            for (int64_t k = 0; k < sub.size[2]; ++k) {
              int64_t gi = sub.offset[0] + i - 1, gj = sub.offset[1] + j - 2, gk = sub.offset[2] + k - 3;
              REQUIRE(gi >= 0);
              REQUIRE(gj >= 0);
              REQUIRE(gk >= 0);
              hits[static_cast<size_t>((gi * 4 + gj) * 5 + gk)]++;
            }
      }
      CHECK(boxes <= 5);
      for (int64_t e = 0; e < n; ++e) CHECK(hits[static_cast<size_t>(e)] == (e >= begin && e < end ? 1 : 0));
    }
  }
}

TEST_CASE("copy_region copies a sub-box between differently shaped boxes") {
  // Global 6x7 tensor with value = 100*i + j.
  Box src_box{{1, 0}, {4, 7}}, dst_box{{2, 2}, {4, 4}};
  std::vector<float> src(28), dst(16, -1);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 7; ++j) src[static_cast<size_t>(i * 7 + j)] = static_cast<float>(100 * (i + 1) + j);
  auto region = intersect(src_box, dst_box);
  REQUIRE(region);
  CHECK(box_to_string(*region) == "[2:5,2:6]");
  copy_region(src.data(), src_box, dst.data(), dst_box, *region, sizeof(float));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      float want = (i + 2 < 5) ? static_cast<float>(100 * (i + 2) + j + 2) : -1.0f;
      CHECK(dst[static_cast<size_t>(i * 4 + j)] == want);
    }
  CHECK_FALSE(intersect(Box{{0}, {3}}, Box{{3}, {2}}));
}

TEST_CASE("manifest round trip and tamper detection") {
  Manifest m;
  m.step = 42;
  m.run_id = "r1";
  m.created = "2026-11-22T00:00:00Z";
  m.world_size = 2;
  m.layout = Layout{2, 1, 1, 0}.to_json();
  m.tensors.push_back({"w", DType::BF16, {4, 6}});
  m.slices.push_back({"w", Box{{0, 0}, {2, 6}}, "rank-00000.bin", 0, 24, 0xdeadbeef});
  m.slices.push_back({"w", Box{{2, 0}, {2, 6}}, "rank-00001.bin", 0, 24, 0x01020304});
  m.files["rank-00000.bin"] = 24;
  m.files["rank-00001.bin"] = 24;
  m.rank_state[1] = {{"rng", {1, 2, 3}}, {"lr", 0.25}};
  const std::string text = serialize_manifest(m);
  Manifest back = parse_manifest(text, "t");
  CHECK(back.step == 42);
  CHECK(back.tensors == m.tensors);
  REQUIRE(back.slices.size() == 2);
  CHECK(back.slices[1].crc32c == 0x01020304u);
  CHECK(back.rank_state.at(1)["lr"].get<double>() == 0.25);
  validate_coverage(back);
  // Every single-byte flip is either a parse error or a checksum mismatch.
  int detected = 0, total = 0;
  for (size_t i = 0; i < text.size(); i += 3) {
    std::string bad = text;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    ++total;
    try {
      parse_manifest(bad, "t");
    } catch (const railyard::Error&) {
      ++detected;
    }
  }
  CHECK(detected == total);
  // Overlapping or missing coverage is refused.
  Manifest gap = back;
  gap.slices.pop_back();
  CHECK_THROWS_WITH_AS(validate_coverage(gap), doctest::Contains("cover 12 of 24"), railyard::Error);
  Manifest overlap = back;
  overlap.slices[1].box = Box{{1, 0}, {2, 6}};  // same volume, but rows 1..2 twice and row 3 never
  CHECK_THROWS_WITH_AS(validate_coverage(overlap), doctest::Contains("overlap"), railyard::Error);
}

TEST_CASE("step directory names") {
  CHECK(step_dir_name(1000) == "step-00001000");
  CHECK(parse_step_dir("step-00001000") == 1000);
  CHECK_FALSE(parse_step_dir("step-00001000.tmp-x"));
  CHECK_FALSE(parse_step_dir("latest"));
  CHECK(rank_file_name(3) == "rank-00003.bin");
  CHECK_THROWS_WITH_AS(parse_dtype("float"), doctest::Contains("f32, bf16"), railyard::Error);
}

namespace {
// Counts, for each element of each tensor, how many ranks write it under `layout`.
void check_written_once(const Layout& layout, const std::vector<TensorDef>& defs) {
  std::map<std::string, std::vector<int>> hits;
  for (const auto& d : defs) hits[d.name].assign(static_cast<size_t>(shape_volume(d.shape)), 0);
  for (int r = 0; r < layout.world_size(); ++r) {
    for (const auto& pb : rank_boxes(layout, r, defs)) {
      const TensorDef* def = nullptr;
      for (const auto& d : defs) def = d.name == pb.tensor ? &d : def;
      REQUIRE(def != nullptr);
      REQUIRE(box_within(pb.box, def->shape));
      Box part = replica_part(pb.box, pb.replica_index, pb.num_replicas);
      std::vector<int> ones(static_cast<size_t>(part.volume()), 1);
      // Accumulate: copy 1s into a scratch global image and add.
      std::vector<int> img(static_cast<size_t>(shape_volume(def->shape)), 0);
      copy_region(ones.data(), part, img.data(), full_box(def->shape), part, sizeof(int));
      auto& h = hits[pb.tensor];
      for (size_t i = 0; i < h.size(); ++i) h[i] += img[i];
    }
  }
  for (const auto& entry : hits) {  // no structured binding: clang 14 cannot capture one (CHECK_MESSAGE's lambda)
    const auto& name = entry.first;
    const auto& h = entry.second;
    size_t wrong = 0;
    for (int v : h) wrong += v != 1;
    CHECK_MESSAGE(wrong == 0, name << ": " << wrong << " elements not written exactly once under dp=" << layout.dp
                                   << " tp=" << layout.tp << " pp=" << layout.pp << " zero=" << layout.zero);
  }
}
}  // namespace

TEST_CASE("layout: every element is written exactly once for many layouts, with and without ZeRO") {
  auto defs = gpt_tensor_defs(4, 32, 16, 128, true);
  for (int zero : {0, 1}) {
    for (Layout l : {Layout{1, 1, 1, 0}, Layout{2, 2, 2, 0}, Layout{4, 1, 2, 0}, Layout{2, 2, 1, 0}, Layout{3, 4, 4, 0},
                     Layout{1, 2, 3, 0}}) {
      l.zero = zero;
      check_written_once(l, defs);
    }
  }
}

TEST_CASE("layout: GPT rules split qkv per block, rows and layers as documented") {
  auto defs = gpt_tensor_defs(4, 32, 16, 128, false);
  Layout l{1, 2, 2, 0};
  // rank 3 = tp 1, dp 0, pp 1.
  auto c = coord_of(l, 3);
  CHECK(c.tp == 1);
  CHECK(c.pp == 1);
  CHECK(rank_of(l, c) == 3);
  std::vector<std::string> qkv;
  bool has_wte = false, has_lnf = false;
  for (const auto& pb : rank_boxes(l, 3, defs)) {
    if (pb.tensor == "qkvw") qkv.push_back(box_to_string(pb.box));
    if (pb.tensor == "attprojw") CHECK(box_to_string(pb.box) == "[2:4,0:32,16:32]");
    if (pb.tensor == "ln1w") CHECK(pb.num_replicas == 2);
    has_wte = has_wte || pb.tensor == "wte";
    has_lnf = has_lnf || pb.tensor == "lnfw";
  }
  CHECK(qkv == std::vector<std::string>{"[2:4,16:32,0:32]", "[2:4,48:64,0:32]", "[2:4,80:96,0:32]"});
  CHECK_FALSE(has_wte);  // first stage only
  CHECK(has_lnf);        // last stage
  CHECK_THROWS_WITH_AS(rank_boxes(Layout{1, 5, 1, 0}, 0, defs), doctest::Contains("not divisible by tp=5"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(rank_boxes(l, 0, {{"mystery", DType::F32, {3}}}), doctest::Contains("no layout rule"),
                       railyard::ConfigError);
}
