// Mixture-of-experts layers inside the tensor/pipeline stage (GptStage + ParallelModel, docs/parallel.md "MoE with
// tensor, pipeline and sequence parallelism") over real Gloo sockets, against one process (Gpt<float>):
// - one forward/backward of M micro-batches with E4 top-2 and capacity factor 1.0 (choices are dropped): pp=2, tp=2,
//   tp=2 with sequence parallelism (each tp rank routes its half of the tokens, the dispatch order stays the whole
//   micro-batch's), tp=2 x pp=2 with sequence parallelism and dp=2 x pp=2: loss, every gradient (experts and router
//   included, gathered through the shard map) within 1e-5, the drop count exactly the single process's;
// - full recomputation with sequence parallelism: bitwise the stored-activation run;
// - AdamW steps through the Trainer (pp=2 and tp=2 with sequence parallelism): losses, aux loss and drop fraction
//   within 1e-5 of one process, parameters within 1e-5 of their scale (5e-5 with sequence parallelism, as in
//   worker_parallel_sp).
//
// Model: L4 C32 NH4 maxT16 V100, 4 experts top-2; B=2, T=8.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_parallel/parallel_trainer_util.h"
#include "worker/comm/local_world.h"
#include "worker/comm/process_groups.h"
#include "worker/model/gpt.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/dist_model.h"
#include "worker/parallel/expert_parallel.h"
#include "worker/parallel/parallel_model.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

namespace {

GptConfig moe_config() {
  GptConfig c = make_gpt_config(/*L=*/4, /*C=*/32, /*NH=*/4, /*maxT=*/16, /*V=*/100);
  c.moe = make_moe_config(/*experts=*/4, /*top_k=*/2, /*capacity_factor=*/1.0, /*aux_loss_coef=*/0.01);
  return c;
}
const GptConfig kCfg = moe_config();
constexpr int kB = 2, kT = 8;
constexpr uint64_t kSeed = 42;

using Data = railyard::worker::testing::TokenData;
Data make_data(int M) { return railyard::worker::testing::random_tokens(M, kB, kT, kCfg.vocab_size, 7); }

struct Grads {
  double loss = 0;
  std::vector<float> grads;  // full buffer (primary slices), router included
  MoeStats stats;
};

Grads single_process(const Data& d, int M) {
  Grads r;
  testing::AccumulatedGrads a = testing::accumulate_grads(kCfg, kB, kT, kSeed, d, M, [&](const Gpt<float>& model) {
    r.stats.aux_loss += model.moe_stats().aux_loss;
    r.stats.assignments += model.moe_stats().assignments;
    r.stats.dropped += model.moe_stats().dropped;
  });
  r.loss = a.loss;
  r.grads = std::move(a.grads);
  return r;
}

// dp x tp x pp ranks, each replica taking M of the dp*M micro-batches, gradients averaged over dp.
// ep > 1: expert parallelism over groups of ep data-parallel ranks of the same (tp, pp) coordinate.
Grads run_layout(int dp, int tp, int pp, bool sp, const Data& d, int M, const RecomputeSpec& recompute = {},
                 int ep = 1) {
  Grads res;
  res.grads.assign(num_parameters(kCfg), 0);
  std::vector<double> losses(static_cast<size_t>(dp * tp * pp));
  std::vector<MoeStats> stats(static_cast<size_t>(dp * tp * pp));
  std::mutex mu;
  comm::run_local_world(dp * tp * pp, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = dp, .tp = tp, .pp = pp});
    ThreadPool pool(1);
    ParallelModel model(kCfg, kB, kT, M, pool, model_groups(groups), {}, recompute, sp);
    std::unique_ptr<ExpertParallel> xp;
    if (ep > 1) {
      xp = std::make_unique<ExpertParallel>(groups.dp(), ExpertParallelOptions{.ep = ep});
      xp->attach(model.stage());
    }
    model.init_weights(kSeed);
    model.zero_grad();
    const size_t N = kB * kT;
    double loss =
        model.forward_backward(M, testing::micro_batches(d.in, d.tgt, groups.coord().dp * M, N), 1.0f / (M * dp));
    model.finish_grads();
    if (ep > 1) {
      // Expert parallelism really split the experts: before the dp reduction a rank has fcw gradients for its own
      // experts only.
      const size_t E = kCfg.moe.experts, per = 4 * kCfg.channels * kCfg.channels, mine = groups.dp().rank() % ep;
      for (const ShardSlice& sl : model.shard_map()) {
        if (sl.tensor != 10) continue;
        for (size_t b = 0; b < sl.extent[0] * E; ++b) {
          const float* gr = model.grads() + sl.local_offset + b * per;
          const bool any = std::any_of(gr, gr + per, [](float x) { return x != 0; });
          const bool owned = (b % E) / (E / ep) == mine;
          std::lock_guard<std::mutex> lock(mu);
          CHECK(any == owned);
        }
      }
    }
    // what the stage allocates is what stage_activation_bytes says (the MoE part included)
    CHECK(model.activation_bytes() ==
          stage_activation_bytes(model.shape(), kB, kT, model.stage().slots(), pool.size(), recompute, sp));
    MoeStats st = model.moe_stats();
    if (dp > 1) {
      groups.dp().all_reduce(model.grads(), model.num_params(), comm::DType::kFloat32, comm::ReduceOp::kSum);
      std::vector<int64_t> bits(static_cast<size_t>(dp) * 4);
      double mine[4] = {loss, st.aux_loss, static_cast<double>(st.assignments), static_cast<double>(st.dropped)};
      groups.dp().all_gather(mine, bits.data(), 4, comm::DType::kInt64);
      double all[4] = {0, 0, 0, 0};
      for (int r = 0; r < dp; ++r) {
        for (int i = 0; i < 4; ++i) {
          double v = 0;
          std::memcpy(&v, &bits[r * 4 + i], sizeof v);
          all[i] += v;
        }
      }
      loss = all[0] / dp;
      st.aux_loss = all[1];
      st.assignments = static_cast<size_t>(all[2]);
      st.dropped = static_cast<size_t>(all[3]);
    }
    std::lock_guard<std::mutex> lock(mu);
    losses[static_cast<size_t>(world.rank())] = loss;
    stats[static_cast<size_t>(world.rank())] = st;
    if (groups.coord().dp != 0) return;
    std::vector<ShardSlice> primary;
    for (const ShardSlice& sl : model.shard_map()) {
      if (!sl.tied_copy) primary.push_back(sl);
    }
    copy_local_to_full(primary, kCfg, model.grads(), res.grads.data());
  });
  for (size_t r = 0; r < losses.size(); ++r) {
    CHECK(losses[r] == losses[0]);
    CHECK(stats[r].aux_loss == stats[0].aux_loss);
    CHECK(stats[r].dropped == stats[0].dropped);
  }
  res.loss = losses[0];
  res.stats = stats[0];
  return res;
}

using testing::rel_err;

void check_close(const Grads& got, const Grads& ref, double tol) {
  CHECK(std::fabs(got.loss - ref.loss) <= tol * std::fabs(ref.loss));
  CHECK(got.stats.assignments == ref.stats.assignments);
  CHECK(got.stats.dropped == ref.stats.dropped);
  CHECK(std::fabs(got.stats.aux_loss - ref.stats.aux_loss) <= tol * ref.stats.aux_loss);
  const auto sizes = param_sizes(kCfg);
  size_t off = 0;
  for (int i = 0; i <= kNumParamTensors; ++i) {
    const size_t n = i < kNumParamTensors ? sizes[i] : router_size(kCfg);
    CAPTURE(param_tensor_name(i));
    const double e = rel_err(got.grads.data() + off, ref.grads.data() + off, n);
    CAPTURE(e);
    CHECK(e <= tol);
    off += n;
  }
}

}  // namespace

TEST_CASE("MoE in the stage: pp=2, tp=2, tp=2 + sp, tp=2 x pp=2 + sp, dp=2 x pp=2, pp=2 x ep=2, tp=2 + sp x ep=2") {
  constexpr int M = 3;
  const Data d = make_data(2 * M);
  const Grads ref1 = single_process(d, M);
  REQUIRE(ref1.stats.dropped > 0);  // capacity 1.0 with top-2: the dispatch order matters
  REQUIRE(ref1.stats.assignments == static_cast<size_t>(M) * 4 * kB * kT * 2);
  struct Case {
    int dp, tp, pp;
    bool sp;
  };
  for (const Case& c : {Case{1, 1, 2, false}, Case{1, 2, 1, false}, Case{1, 2, 1, true}, Case{1, 2, 2, true}}) {
    CAPTURE(c.tp);
    CAPTURE(c.pp);
    CAPTURE(c.sp);
    check_close(run_layout(c.dp, c.tp, c.pp, c.sp, d, M), ref1, 1e-5);
  }
  // dp=2 x pp=2: two replicas of M micro-batches each against one process accumulating all 2M.
  const Grads ref2 = single_process(d, 2 * M);
  check_close(run_layout(2, 1, 2, false, d, M), ref2, 1e-5);
  // expert parallelism over the two replicas: pp=2 x ep=2 and tp=2 (sequence parallel) x ep=2, 4 ranks each
  INFO("dp=2 x pp=2, ep=2");
  check_close(run_layout(2, 1, 2, false, d, M, {}, 2), ref2, 1e-5);
  INFO("dp=2 x tp=2 + sp, ep=2");
  check_close(run_layout(2, 2, 1, true, d, M, {}, 2), ref2, 1e-5);
}

TEST_CASE("MoE with sequence parallelism and full recomputation: bitwise the stored-activation run") {
  constexpr int M = 2;
  const Data d = make_data(M);
  const Grads plain = run_layout(1, 2, 1, true, d, M);
  const Grads rec = run_layout(1, 2, 1, true, d, M, RecomputeSpec{Recompute::kFull, -1});
  CHECK(plain.loss == rec.loss);
  CHECK(plain.stats.dropped == rec.stats.dropped);
  CHECK(std::memcmp(plain.grads.data(), rec.grads.data(), plain.grads.size() * sizeof(float)) == 0);
}

TEST_CASE("MoE in the stage: context parallelism is refused naming the flags") {
  comm::run_local_world(2, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = 2, .tp = 1, .pp = 1});
    ThreadPool pool(1);
    ModelGroups g = model_groups(groups);
    g.cp = &groups.dp();
    CHECK_THROWS_WITH_AS(ParallelModel(kCfg, kB, kT, 1, pool, g), doctest::Contains("--moe-experts with --cp"),
                         railyard::ConfigError);
  });
}

namespace {

constexpr int kMicro = 4, kSteps = 5;

TrainConfig train_config(bool sp) { return testing::sp_train_config(kSteps, kB, kT, kMicro, sp); }

}  // namespace

TEST_CASE("MoE AdamW steps through the Trainer: pp=2, tp=2 + sp and dp=2 x tp=2 + sp train like one process") {
  const testing::LayoutRun ref = testing::run_single_trainer(kCfg, train_config(false));
  REQUIRE(ref.steps.back().loss < ref.steps.front().loss);
  REQUIRE(ref.steps.front().moe_dropped_fraction > 0);
  const double scale = testing::max_abs(ref.params);
  struct Case {
    comm::Layout layout;
    bool sp;
  };
  for (const Case& c : {Case{{1, 1, 2}, false}, Case{{1, 2, 1}, true}, Case{{2, 2, 1}, true}}) {
    INFO("layout dp=" << c.layout.dp << " tp=" << c.layout.tp << " pp=" << c.layout.pp << " sp=" << c.sp);
    const testing::LayoutRun got = testing::run_parallel_trainer(kCfg, train_config(c.sp), c.layout);
    REQUIRE(got.steps.size() == ref.steps.size());
    for (size_t s = 0; s < ref.steps.size(); ++s) {
      const StepResult &a = got.steps[s], &b = ref.steps[s];
      INFO("step " << s << ": loss " << a.loss << " vs " << b.loss << ", aux " << a.moe_aux_loss << " vs "
                   << b.moe_aux_loss << ", dropped " << a.moe_dropped_fraction << " vs " << b.moe_dropped_fraction);
      CHECK(std::abs(a.loss - b.loss) <= 1e-5 * std::abs(b.loss));
      CHECK(std::abs(a.moe_aux_loss - b.moe_aux_loss) <= 1e-5 * b.moe_aux_loss);
      CHECK(std::abs(a.moe_dropped_fraction - b.moe_dropped_fraction) <= 1e-5);
    }
    const double worst = testing::max_abs_diff(got.params, ref.params);
    INFO("max |param diff| " << worst << " of max |param| " << scale);
    // Sequence parallelism: 5e-5 as in worker_parallel_sp (the layernorm, expert and router gradients are summed per
    // rank's rows, then over tp, and AdamW's normalised update makes a last-bit difference of a near-zero gradient
    // visible). Measured 1.2e-5 (tp=2 + sp) and below 1e-5 (pp=2), 5 steps.
    CHECK(worst <= (c.sp ? 5e-5 : 1e-5) * scale);
  }
}
