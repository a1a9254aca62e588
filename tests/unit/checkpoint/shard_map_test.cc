// The trainer's shard list from a tensor/pipeline-parallel stage's shard_map() (worker/parallel/stage_plan.h):
// 8 ranks of (dp, tp, pp) = (2, 2, 2) save their local params and AdamW m/v with shards_from_slices, and the
// checkpoint loads bitwise into the full llm.c buffers and into another layout's local buffers. With ZeRO over dp
// (zero_slices_shards, zero_state_shards) the owned moment ranges of the real BucketLayout are saved as slices of
// the global tensors: (2,2,2) with and without ZeRO loads bitwise into (1,1,1), (4,1,2), (2,2,1) with and without.
#include <doctest/doctest.h>

#include <random>
#include <thread>
#include <tuple>

#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "tests/unit/checkpoint/test_util.h"
#include "worker/model/gpt_config.h"
#include "worker/parallel/stage_plan.h"
#include "worker/parallel/zero.h"
#include "worker/train/checkpointing.h"

using namespace railyard;
using namespace railyard::worker;

namespace {

struct RankBuffers {
  std::vector<parallel::ShardSlice> map;
  std::vector<float> p, m, v;
};

RankBuffers local_of(const GptConfig& c, int tp, int tp_rank, int pp, int pp_rank, const std::vector<float>& p,
                     const std::vector<float>& m, const std::vector<float>& v) {
  const auto shape = parallel::make_stage_shape(c, c.max_seq_len, tp, tp_rank, pp, pp_rank);
  RankBuffers b;
  b.map = parallel::make_shard_map(shape);
  size_t n = 0;
  for (size_t s : parallel::local_param_sizes(shape)) n += s;
  b.p.assign(n, -1.0f);
  b.m.assign(n, -1.0f);
  b.v.assign(n, -1.0f);
  if (!p.empty()) {
    parallel::copy_full_to_local(b.map, c, p.data(), b.p.data());
    parallel::copy_full_to_local(b.map, c, m.data(), b.m.data());
    parallel::copy_full_to_local(b.map, c, v.data(), b.v.data());
  }
  return b;
}

std::vector<float> random_buffer(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (auto& e : x) e = d(rng);
  return x;
}

}  // namespace

TEST_CASE("shards_from_slices: save under (dp,tp,pp)=(2,2,2), load full and under (1,1,2) bitwise") {
  const GptConfig c = parse_model_spec("l=4,c=64,nh=4,t=32,v=256");
  const size_t N = num_parameters(c);
  const auto P = random_buffer(N, 1), M = random_buffer(N, 2), V = random_buffer(N, 3);
  ckpt::test::TempDir dir("shard-map");
  const int dp = 2, tp = 2, pp = 2, world = dp * tp * pp;

  std::vector<RankBuffers> ranks;
  for (int r = 0; r < world; ++r) {
    // The rank grid of checkpoint/layout.h: tp fastest, then dp, then pp (dp replicas hold the same slices).
    const int tp_rank = r % tp, pp_rank = r / (tp * dp);
    ranks.push_back(local_of(c, tp, tp_rank, pp, pp_rank, P, M, V));
  }
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        const int tp_rank = r % tp, dp_rank = (r / tp) % dp;
        auto& b = ranks[static_cast<size_t>(r)];
        const auto specs = shards_from_slices(b.map, b.p.data(), b.m.data(), b.v.data(), tp_rank, tp, dp_rank, dp);
        std::vector<ckpt::TensorShard> shards;
        for (const auto& s : specs)
          if (s.write)
            shards.push_back(
                {s.name, ckpt::DType::F32, s.global_shape, s.box, s.data, s.replica_index, s.num_replicas});
        ckpt::WriterOptions o;
        o.root = dir.path();
        o.rank = r;
        o.world_size = world;
        o.run_id = "shard-map-test";
        o.layout = {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"zero", 0}};
        ckpt::Writer w(o);
        w.snapshot(7, shards, {{"rank", r}});
        w.flush();
        if (w.last_status().state != ckpt::SaveState::Committed) errors[static_cast<size_t>(r)] = w.last_status().error;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r)
    CHECK_MESSAGE(errors[static_cast<size_t>(r)].empty(), "rank " << r << ": " << errors[r]);
  REQUIRE(ckpt::verify_checkpoint(dir.path(), 7).ok);

  // Every element is stored exactly once (the coverage check of the commit), and the full buffers come back.
  std::vector<float> p(N, 0), m(N, 0), v(N, 0);
  TrainerState full;
  full.params = p.data();
  full.adam_m = m.data();
  full.adam_v = v.data();
  full.num_params = N;
  std::vector<ckpt::LoadTarget> targets;
  for (const auto& s : full_state_shards(c, full)) targets.push_back({s.name, ckpt::DType::F32, s.box, s.data});
  const auto res = ckpt::Reader(dir.path()).load_latest(targets);
  CHECK(res.step == 7);
  CHECK(p == P);
  CHECK(m == M);
  CHECK(v == V);

  // Another layout: tp = 1, pp = 2, stage 1 (holds the tied wte copy, which is restored too).
  RankBuffers want = local_of(c, 1, 0, 2, 1, P, M, V);
  RankBuffers got = local_of(c, 1, 0, 2, 1, {}, {}, {});
  const auto specs = shards_from_slices(got.map, got.p.data(), got.m.data(), got.v.data(), 0, 1, 0, 1);
  bool has_tied = false;
  for (const auto& s : specs) has_tied = has_tied || !s.write;
  CHECK(has_tied);
  std::vector<ckpt::LoadTarget> t2;
  for (const auto& s : specs) t2.push_back({s.name, ckpt::DType::F32, s.box, s.data});
  ckpt::Reader(dir.path()).load_step(7, t2);
  CHECK(got.p == want.p);
  CHECK(got.m == want.m);
  CHECK(got.v == want.v);
}

namespace {

// One rank of a (dp, tp, pp, zero) layout as the trainer holds it: local params (a stage's buffer, or the llm.c buffer
// when tp = pp = 1) and AdamW moments, either laid out like the params (zero = 0) or, under ZeRO, only the pieces
// this dp rank owns in the real BucketLayout over that buffer, back to back; plus the shard list worker/main.cc builds.
struct LayoutRank {
  std::vector<float> p, m, v;  // m, v: the local layout (zero = 0) or the ZeRO shard buffers
  std::vector<ShardSpec> specs;
};

constexpr size_t kBucketElems = 1000;  // small buckets: owned ranges cut tensors (and stage slices) in the middle

LayoutRank layout_rank(const GptConfig& c, int dp, int tp, int pp, int zero, int r, const std::vector<float>& P,
                       const std::vector<float>& M, const std::vector<float>& V) {
  // The rank grid of checkpoint/layout.h and comm::ProcessGroups: tp fastest, then dp, then pp.
  const int tp_rank = r % tp, dp_rank = (r / tp) % dp, pp_rank = r / (tp * dp);
  const bool fill = !P.empty();
  std::vector<parallel::ShardSlice> map;
  std::vector<float> lm, lv;
  LayoutRank out;
  if (tp * pp == 1) {
    const size_t n = num_parameters(c);
    out.p = fill ? P : std::vector<float>(n, -1.0f);
    lm = fill ? M : std::vector<float>(n, -1.0f);
    lv = fill ? V : std::vector<float>(n, -1.0f);
  } else {
    RankBuffers b = local_of(c, tp, tp_rank, pp, pp_rank, P, M, V);
    map = b.map;
    out.p = std::move(b.p);
    lm = std::move(b.m);
    lv = std::move(b.v);
  }
  if (zero == 0) {
    out.m = std::move(lm);
    out.v = std::move(lv);
    if (tp * pp == 1) {
      TrainerState s;
      s.params = out.p.data();
      s.adam_m = out.m.data();
      s.adam_v = out.v.data();
      s.num_params = out.p.size();
      out.specs = full_state_shards(c, s);
      for (auto& sh : out.specs) {
        sh.replica_index = dp_rank;  // as worker/main.cc sets it for plain dp
        sh.num_replicas = dp;
      }
    } else {
      out.specs = shards_from_slices(map, out.p.data(), out.m.data(), out.v.data(), tp_rank, tp, dp_rank, dp);
    }
    return out;
  }
  const parallel::BucketLayout bl(out.p.size(), dp, kBucketElems);
  out.m.assign(bl.shard_size(), -1.0f);
  out.v.assign(bl.shard_size(), -1.0f);
  std::vector<OwnedRange> owned;
  for (size_t b = 0; b < bl.buckets().size(); ++b) {
    const auto [s, e] = bl.own(b, dp_rank);
    if (s >= e) continue;
    owned.push_back({s, e, bl.buckets()[b].shard_offset});
    if (fill) {
      std::copy(lm.begin() + static_cast<ptrdiff_t>(s), lm.begin() + static_cast<ptrdiff_t>(e),
                out.m.begin() + static_cast<ptrdiff_t>(bl.buckets()[b].shard_offset));
      std::copy(lv.begin() + static_cast<ptrdiff_t>(s), lv.begin() + static_cast<ptrdiff_t>(e),
                out.v.begin() + static_cast<ptrdiff_t>(bl.buckets()[b].shard_offset));
    }
  }
  out.specs = tp * pp == 1
                  ? zero_state_shards(c, out.p.data(), out.m.data(), out.v.data(), owned, dp_rank, dp)
                  : zero_slices_shards(map, out.p.data(), out.m.data(), out.v.data(), owned, tp_rank, tp, dp_rank, dp);
  return out;
}

// Every rank of the layout saves `step` concurrently (one writer each, as the ranks of a job do); "" or the errors.
std::string save_layout(const std::string& root, int64_t step, std::vector<LayoutRank>& ranks, int dp, int tp, int pp,
                        int zero) {
  const int world = dp * tp * pp;
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::vector<ckpt::TensorShard> shards;
        for (const auto& s : ranks[static_cast<size_t>(r)].specs)
          if (s.write)
            shards.push_back(
                {s.name, ckpt::DType::F32, s.global_shape, s.box, s.data, s.replica_index, s.num_replicas});
        ckpt::WriterOptions o;
        o.root = root;
        o.rank = r;
        o.world_size = world;
        o.run_id = "layout-" + std::to_string(step);
        o.layout = {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"zero", zero}};
        ckpt::Writer w(o);
        w.snapshot(step, shards, {{"rank", r}});
        w.flush();
        if (w.last_status().state != ckpt::SaveState::Committed) errors[static_cast<size_t>(r)] = w.last_status().error;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::string all;
  for (int r = 0; r < world; ++r)
    if (!errors[static_cast<size_t>(r)].empty()) all += "rank " + std::to_string(r) + ": " + errors[r] + "; ";
  return all;
}

}  // namespace

TEST_CASE(
    "ZeRO with tp/pp: (2,2,2) saved with and without ZeRO loads bitwise into (1,1,1), (4,1,2), (2,2,1), "
    "each with and without ZeRO") {
  // V = 250 is padded to 256 (padding rows of wte are state too); l=4 splits over pp = 2.
  const GptConfig c = parse_model_spec("l=4,c=64,nh=4,t=32,v=250");
  const size_t N = num_parameters(c);
  const auto P = random_buffer(N, 11), M = random_buffer(N, 12), V = random_buffer(N, 13);
  for (const int src_zero : {1, 0}) {
    CAPTURE(src_zero);
    ckpt::test::TempDir dir("zero-tp-pp");
    std::vector<LayoutRank> src;
    for (int r = 0; r < 8; ++r) src.push_back(layout_rank(c, 2, 2, 2, src_zero, r, P, M, V));
    if (src_zero > 0) {
      // The moments really are split: a ZeRO rank holds about half of its stage's moments.
      CHECK(src[0].m.size() < src[0].p.size() / 2 + kBucketElems);
    }
    // The commit checks that every element of every tensor is written by exactly one rank.
    const std::string err = save_layout(dir.path(), 5, src, 2, 2, 2, src_zero);
    REQUIRE_MESSAGE(err.empty(), err);
    const ckpt::VerifyReport rep = ckpt::verify_checkpoint(dir.path(), 5);
    REQUIRE_MESSAGE(rep.ok, (rep.problems.empty() ? "" : rep.problems.front()));

    for (auto [dp, tp, pp] : {std::tuple{1, 1, 1}, {4, 1, 2}, {2, 2, 1}, {2, 2, 2}}) {
      for (const int zero : {0, 1}) {
        CAPTURE(dp);
        CAPTURE(tp);
        CAPTURE(pp);
        CAPTURE(zero);
        for (int r = 0; r < dp * tp * pp; ++r) {
          CAPTURE(r);
          const LayoutRank want = layout_rank(c, dp, tp, pp, zero, r, P, M, V);
          LayoutRank got = layout_rank(c, dp, tp, pp, zero, r, {}, {}, {});
          std::vector<ckpt::LoadTarget> targets;
          for (const auto& s : got.specs) targets.push_back({s.name, ckpt::DType::F32, s.box, s.data});
          CHECK(ckpt::Reader(dir.path()).load_step(5, targets).step == 5);
          CHECK(got.p == want.p);
          CHECK(got.m == want.m);
          CHECK(got.v == want.v);
        }
      }
    }
  }
}
