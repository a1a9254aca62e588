// The trainer's shard list from a tensor/pipeline-parallel stage's shard_map() (worker/parallel/stage_plan.h):
// 8 ranks of (dp, tp, pp) = (2, 2, 2) save their local params and AdamW m/v with shards_from_slices, and the
// checkpoint loads bitwise into the full llm.c buffers and into another layout's local buffers.
#include <doctest/doctest.h>

#include <random>
#include <thread>

#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "tests/unit/checkpoint/test_util.h"
#include "worker/model/gpt_config.h"
#include "worker/parallel/stage_plan.h"
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
