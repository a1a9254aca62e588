// Expert parallelism and the hierarchical all_to_all over real Gloo sockets (every rank a thread with its own TCP
// communicator). MoE model L2 C32 NH4 V128, E=4 top-2, capacity factor 1.0 (choices are dropped), B=2 T=16, 4
// micro-batches per step: one process accumulating the 4 micro-batches vs 4 data-parallel ranks with expert
// parallelism 1, 2 and 4 (flat all_to_all) and 4 (hierarchical, 2 simulated nodes x 2 local ranks).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/all_to_all.h"
#include "worker/comm/local_world.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/expert_parallel.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

namespace {

GptConfig moe_config() {
  GptConfig c = make_gpt_config(/*L=*/2, /*C=*/32, /*NH=*/4, /*maxT=*/16, /*V=*/128);
  c.moe = make_moe_config(/*E=*/4, /*top_k=*/2, /*cf=*/1.0, /*aux=*/0.01);
  return c;
}
constexpr int kB = 2, kT = 16, kMicro = 4, kSteps = 6, kWorld = 4;

TrainConfig train_config() {
  TrainConfig tc = testing::small_train_config(kSteps, kB, kT, kMicro, /*lr=*/3e-3, /*warmup_steps=*/1);
  tc.grad_clip = 1.0;
  return tc;
}

struct Run {
  std::vector<double> losses, dropped, aux;
  std::vector<float> params;
};

void record(Run& out, const StepResult& r) {
  out.losses.push_back(r.loss);
  out.dropped.push_back(r.moe_dropped_fraction);
  out.aux.push_back(r.moe_aux_loss);
}

Run single_process() {
  const testing::LayoutRun r = testing::run_single_trainer(moe_config(), train_config());
  Run out;
  for (const StepResult& s : r.steps) record(out, s);
  out.params = r.params;
  return out;
}

std::vector<Run> expert_parallel(const ExpertParallelOptions& o, int zero = 0, Recompute recompute = Recompute::kNone) {
  std::vector<Run> runs(kWorld);
  comm::run_local_world(kWorld, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    const GptConfig cfg = moe_config();
    testing::StreamSource src(c.rank(), kWorld, kB, kT, cfg.vocab_size);
    TrainConfig tc = train_config();
    tc.recompute.mode = recompute;  // full: backward reruns each layer's forward, all_to_alls included
    DataParallelOptions dpo;
    dpo.zero_stage = zero;
    // Small buckets: the reducer thread all-reduces finished layers while backward's all_to_alls still run.
    dpo.bucket_bytes = 16 << 10;
    auto sync = gpt_data_parallel(&c, cfg, tc, pool, dpo);
    ExpertParallel ep(c, o);
    Trainer tr(cfg, tc, pool, src, nullptr, sync.get());
    ep.attach(tr.model());
    Run& out = runs[c.rank()];
    for (int s = 0; s < kSteps; ++s) record(out, tr.step());
    out.params.assign(tr.model().params(), tr.model().params() + tr.model().num_params());
  });
  return runs;
}

// --deterministic: every rank reads the job's whole sequence and keeps its own leaves (virtual micro-batches).
std::vector<Run> deterministic(int world, int ep) {
  std::vector<Run> runs(world);
  comm::run_local_world(world, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    const GptConfig cfg = moe_config();
    testing::StreamSource src(0, 1, kB, kT, cfg.vocab_size);
    const TrainConfig tc = train_config();
    DataParallelOptions dpo;
    dpo.deterministic = true;
    auto sync = gpt_data_parallel(&c, cfg, tc, pool, dpo);
    ExpertParallel epx(c, {ep, "flat", 0, true});
    Trainer tr(cfg, tc, pool, src, nullptr, sync.get());
    epx.attach(tr.model());
    Run& out = runs[c.rank()];
    for (int s = 0; s < kSteps; ++s) record(out, tr.step());
    out.params.assign(tr.model().params(), tr.model().params() + tr.model().num_params());
  });
  return runs;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("expert parallelism 1, 2 and 4 train like one process (losses, drops, parameters)") {
  const Run ref = single_process();
  // Drops must happen, or capacity and the global drop count are not exercised.
  REQUIRE(ref.dropped[0] > 0);
  std::vector<Run> flat4;
  for (const int ep : {1, 2, 4}) {
    CAPTURE(ep);
    const std::vector<Run> runs = expert_parallel({ep, "flat", 0});
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      // Every rank holds the same replica: bitwise equal to rank 0.
      CHECK(runs[r].params == runs[0].params);
      CHECK(runs[r].losses == runs[0].losses);
    }
    // Step 0 starts from the same weights: routing, capacity and drops are the same decisions, so the global drop
    // fraction is exactly the single process's; the loss differs at most by the order of the dp loss sum.
    CHECK(runs[0].dropped[0] == ref.dropped[0]);
    for (int s = 0; s < kSteps; ++s) {
      CAPTURE(s);
      CHECK(runs[0].losses[s] == doctest::Approx(ref.losses[s]).epsilon(2e-5));
      CHECK(runs[0].aux[s] == doctest::Approx(ref.aux[s]).epsilon(2e-5));
      CHECK(runs[0].dropped[s] == doctest::Approx(ref.dropped[s]).epsilon(1e-9));
    }
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) worst = std::max(worst, std::fabs(runs[0].losses[s] / ref.losses[s] - 1));
    MESSAGE("ep=", ep, ": worst loss relative difference ", worst, ", parameters max |diff| / max |p| ",
            max_rel(runs[0].params, ref.params), ", step-0 loss bitwise equal: ", runs[0].losses[0] == ref.losses[0]);
    CHECK(max_rel(runs[0].params, ref.params) < 1e-5);
    if (ep == 4) flat4 = runs;
  }
  // The hierarchical exchange moves the same bytes to the same places: bitwise the flat run.
  const std::vector<Run> hier = expert_parallel({4, "hierarchical", 2});
  CHECK(hier[0].losses == flat4[0].losses);
  CHECK(hier[0].params == flat4[0].params);
  // Full recomputation reruns the dispatch and combine in backward: bitwise the same run.
  const std::vector<Run> rec = expert_parallel({4, "flat", 0}, 0, Recompute::kFull);
  CHECK(rec[0].losses == flat4[0].losses);
  CHECK(rec[0].params == flat4[0].params);
  // ZeRO-1/2 shard the optimizer over dp; the experts' zero gradients from non-owners reduce-scatter like any other.
  for (const int zero : {1, 2}) {
    CAPTURE(zero);
    const std::vector<Run> z = expert_parallel({2, "flat", 0}, zero);
    CHECK(z[1].params == z[0].params);
    for (int s = 0; s < kSteps; ++s) CHECK(z[0].losses[s] == doctest::Approx(ref.losses[s]).epsilon(2e-5));
    CHECK(max_rel(z[0].params, ref.params) < 1e-5);
  }
}

TEST_CASE("--deterministic: expert parallelism 1, 2 and 4 are bitwise equal to one process (the fixed tree)") {
  const Run ref = deterministic(1, 1)[0];
  REQUIRE(ref.dropped[0] > 0);
  for (auto [world, ep] : {std::pair{4, 1}, std::pair{4, 2}, std::pair{4, 4}, std::pair{2, 2}}) {
    CAPTURE(world);
    CAPTURE(ep);
    const std::vector<Run> runs = deterministic(world, ep);
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(runs[r].losses == ref.losses);
      CHECK(runs[r].dropped == ref.dropped);
      CHECK(runs[r].aux == ref.aux);
      CHECK(runs[r].params == ref.params);
    }
  }
}

TEST_CASE("hierarchical all_to_all equals the flat one (2 nodes x 2, 2 x 4, 4 x 2 local ranks)") {
  for (auto [world, local] : {std::pair{4, 2}, std::pair{8, 4}, std::pair{8, 2}, std::pair{4, 1}, std::pair{4, 4}}) {
    CAPTURE(world);
    CAPTURE(local);
    comm::run_local_world(world, [&, world = world, local = local](comm::Communicator& c) {
      comm::FlatAllToAll flat(c);
      comm::HierarchicalAllToAll hier(c, local);
      CHECK(hier.nodes() == world / local);
      for (const size_t count : {size_t{1}, size_t{7}, size_t{1000}}) {
        // in[j][i] = (rank, j, i) encoded exactly in a float; after the exchange out[j][i] must be (j, rank, i).
        std::vector<float> in(count * world), a(in.size(), -1), b(in.size(), -2);
        for (int j = 0; j < world; ++j) {
          for (size_t i = 0; i < count; ++i) in[j * count + i] = static_cast<float>(c.rank() * 10000 + j * 1000 + i);
        }
        flat.run(in.data(), a.data(), count, comm::DType::kFloat32);
        hier.run(in.data(), b.data(), count, comm::DType::kFloat32);
        CHECK(a == b);
        bool ok = true;
        for (int j = 0; j < world; ++j) {
          for (size_t i = 0; i < count; ++i)
            ok &= b[j * count + i] == static_cast<float>(j * 10000 + c.rank() * 1000 + i);
        }
        CHECK(ok);
      }
    });
  }
}

TEST_CASE("expert parallelism refuses what it does not support, naming the flag") {
  const GptConfig moe = moe_config();
  const GptConfig dense = make_gpt_config(2, 32, 4, 16, 128);
  auto check = [&](const GptConfig& m, ExpertParallelOptions o, int dp, int tp, int pp, int zero, bool det, bool uneven,
                   const char* what) {
    CHECK_THROWS_WITH_AS(validate_expert_parallel(m, o, dp, tp, pp, zero, det, uneven), doctest::Contains(what),
                         railyard::ConfigError);
  };
  check(dense, {2, "flat", 0}, 2, 1, 1, 0, false, false, "--ep 2 needs a mixture-of-experts model");
  check(moe, {3, "flat", 0}, 3, 1, 1, 0, false, false, "--moe-experts 4 is not divisible");
  check(moe, {2, "flat", 0}, 3, 1, 1, 0, false, false, "data-parallel degree 3");
  // with tp/pp: composes (worker_parallel_moe_stage), but not with the deterministic mode's gradient return
  CHECK_NOTHROW(validate_expert_parallel(moe, {2, "flat", 0}, 2, 2, 1, 0, false, false));
  check(moe, {2, "flat", 0}, 2, 1, 2, 0, true, false, "--deterministic and --tp/--pp");
  CHECK_NOTHROW(validate_expert_parallel(moe, {2, "flat", 0}, 2, 1, 1, 2, false, false));
  CHECK_NOTHROW(validate_expert_parallel(moe, {2, "flat", 0}, 2, 1, 1, 0, true, false));
  check(moe, {2, "flat", 0}, 2, 1, 1, 0, false, true, "uneven");
  check(moe, {2, "ring", 0}, 2, 1, 1, 0, false, false, "--ep-a2a ring");
  CHECK_NOTHROW(validate_expert_parallel(moe, {4, "hierarchical", 2}, 8, 1, 1, 0, false, false));
  CHECK(ep_group_ranks(8, 2, 5) == std::vector<int>{4, 5});
  CHECK(ep_group_ranks(8, 4, 5) == std::vector<int>{4, 5, 6, 7});
  // A local size that does not divide the group is refused by the constructor, collectively.
  comm::run_local_world(4, [](comm::Communicator& c) {
    CHECK_THROWS_WITH_AS(comm::make_all_to_all(c, "hierarchical", 3), doctest::Contains("3 ranks per node"),
                         railyard::ConfigError);
  });
}

namespace {

// The global buffer (all E experts) from the local buffers of shards 0..P-1 (expert_shard_config): dense tensors and
// the router from shard 0, each layer's experts from their shard.
std::vector<float> assemble(const GptConfig& global, const std::vector<std::vector<float>>& shard) {
  const size_t P = shard.size(), L = global.num_layers, E = global.moe.experts, el = E / P;
  const GptConfig local = expert_shard_config(global, static_cast<int>(P), 0);
  const auto gs = param_sizes(global), ls = param_sizes(local);
  std::vector<float> out(num_parameters(global));
  size_t go = 0, lo = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    if (i >= 10 && i <= 13) {
      const size_t per = gs[i] / (L * E);
      for (size_t l = 0; l < L; ++l)
        for (size_t p = 0; p < P; ++p)
          std::copy_n(shard[p].begin() + static_cast<long>(lo + l * el * per), el * per,
                      out.begin() + static_cast<long>(go + (l * E + p * el) * per));
    } else {
      std::copy_n(shard[0].begin() + static_cast<long>(lo), gs[i], out.begin() + static_cast<long>(go));
    }
    go += gs[i];
    lo += ls[i];
  }
  std::copy_n(shard[0].begin() + static_cast<long>(lo), router_size(global), out.begin() + static_cast<long>(go));
  return out;
}

// Expert-parallel storage: rank r builds its model, optimizer and reducer on E/ep experts per layer.
std::vector<Run> expert_storage(int ep, std::vector<size_t>* local_sizes, const std::string& a2a = "flat",
                                int node = 0) {
  std::vector<Run> runs(kWorld);
  if (local_sizes != nullptr) local_sizes->assign(kWorld, 0);
  comm::run_local_world(kWorld, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    const GptConfig global = moe_config();
    testing::StreamSource src(c.rank(), kWorld, kB, kT, global.vocab_size);
    const TrainConfig tc = train_config();
    ExpertParallel epx(c, {ep, a2a, node});
    const GptConfig local = epx.local_config(global);
    DataParallelOptions dpo;
    dpo.bucket_bytes = 16 << 10;  // buckets that straddle the dense/expert boundary are cut, not mixed
    dpo.group_spans = expert_group_spans(local, &epx.expert_data_parallel(), &epx.group());
    auto sync = gpt_data_parallel(&c, local, tc, pool, dpo);
    Trainer tr(local, tc, pool, src, nullptr, sync.get());
    epx.attach(tr.model());
    if (local_sizes != nullptr) {
      // parameters + gradients + AdamW m, v this rank allocated, in floats
      // (Gpt allocates its gradient buffer with num_params() elements, the same layout)
      (*local_sizes)[c.rank()] = 2 * tr.model().num_params() + 2 * tr.optimizer().size();
    }
    Run& out = runs[c.rank()];
    for (int s = 0; s < kSteps; ++s) record(out, tr.step());
    out.params.assign(tr.model().params(), tr.model().params() + tr.model().num_params());
  });
  return runs;
}

}  // namespace

TEST_CASE("expert-parallel storage: a shard initialises to its slice of the single-process weights") {
  ThreadPool pool(2);
  const GptConfig global = moe_config();
  Gpt<float> full(global, kB, kT, pool);
  full.init_weights(7);
  for (const int P : {2, 4}) {
    CAPTURE(P);
    std::vector<std::vector<float>> shards;
    for (int p = 0; p < P; ++p) {
      Gpt<float> m(expert_shard_config(global, P, p), kB, kT, pool);
      m.init_weights(7);
      shards.emplace_back(m.params(), m.params() + m.num_params());
    }
    CHECK(assemble(global, shards) == std::vector<float>(full.params(), full.params() + full.num_params()));
  }
  // A shard runs only inside its group: without one it refuses to run (instead of reading missing experts).
  Gpt<float> lone(expert_shard_config(global, 2, 0), kB, kT, pool);
  std::vector<int32_t> tok(static_cast<size_t>(kB) * kT, 1);
  CHECK_THROWS_WITH(lone.forward(tok.data(), tok.data(), Gpt<float>::Mode::kEval),
                    doctest::Contains("no expert-parallel group"));
  CHECK_THROWS_WITH(expert_shard_config(global, 3, 0), doctest::Contains("--moe-experts divisible"));
}

TEST_CASE("expert-parallel storage: E/ep experts per rank train like one process") {
  const Run ref = single_process();
  const GptConfig global = moe_config();
  const size_t C = global.channels, L = global.num_layers, E = global.moe.experts, expert = 8 * C * C + 5 * C;
  for (const int ep : {2, 4}) {
    CAPTURE(ep);
    std::vector<size_t> sizes;
    const std::vector<Run> runs = expert_storage(ep, &sizes);
    // The buffers hold E/ep experts per layer: params, grads and both moments are smaller by the others' experts.
    const size_t local = num_parameters(global) - L * (E - E / ep) * expert;
    for (int r = 0; r < kWorld; ++r) {
      CAPTURE(r);
      CHECK(runs[r].params.size() == local);
      CHECK(sizes[r] == 4 * local);
      // Ranks at the same position of every ep group hold the same experts: bitwise equal replicas.
      CHECK(runs[r].params == runs[r % ep].params);
      CHECK(runs[r].losses == runs[0].losses);
    }
    std::vector<std::vector<float>> shards;
    for (int p = 0; p < ep; ++p) shards.push_back(runs[p].params);
    const std::vector<float> params = assemble(global, shards);
    CHECK(runs[0].dropped[0] == ref.dropped[0]);
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      CAPTURE(s);
      CHECK(runs[0].losses[s] == doctest::Approx(ref.losses[s]).epsilon(2e-5));
      CHECK(runs[0].aux[s] == doctest::Approx(ref.aux[s]).epsilon(2e-5));
      worst = std::max(worst, std::fabs(runs[0].losses[s] / ref.losses[s] - 1));
    }
    if (ep == 4) {
      // The hierarchical exchange moves the same rows to the same ranks: bitwise the flat run here too.
      const std::vector<Run> hier = expert_storage(4, nullptr, "hierarchical", 2);
      CHECK(hier[0].losses == runs[0].losses);
      CHECK(hier[3].params == runs[3].params);
    }
    MESSAGE("sharded ep=", ep, ": ", local, " of ", num_parameters(global), " params per rank; worst loss relative ",
            "difference ", worst, ", parameters max |diff| / max |p| ", max_rel(params, ref.params));
    CHECK(max_rel(params, ref.params) < 1e-5);
  }
}

TEST_CASE("group spans: a span reduces over its sub-group (sum / D), the rest over dp (mean); the norm adds parts") {
  // 4 dp ranks, buffer of 10 elements: [3, 7) belongs to sub-groups {0, 2} and {1, 3} (what the expert-data-parallel
  // group is for expert parallelism), its norm part summed over {0, 1} and {2, 3}.
  constexpr size_t n = 10;
  comm::run_local_world(4, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    const int r = c.rank();
    auto sub = c.split(expert_dp_ranks(4, 2, r), "sub");
    auto norm = c.split(ep_group_ranks(4, 2, r), "norm");
    DataParallelOptions o;
    o.bucket_bytes = 4 * sizeof(float);  // buckets [0,4) [4,8) [8,10): the first two straddle the span
    o.group_spans = {{3, 4, sub.get(), norm.get()}};
    DataParallel dp(&c, n, {{0, n, false}}, AdamWHyper{}, pool, o);
    CHECK(dp.owns_grad_norm());
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((r + 1) * 10 + static_cast<int>(i));
    dp.arm(g.data());
    dp.grads_ready(0, n);
    dp.finish(g.data());
    for (size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      const bool span = i >= 3 && i < 7;
      // Outside: mean of (k+1)*10 + i over k = 0..3 = 25 + i. Inside: sum over this rank's sub-group / 4.
      const float other = static_cast<float>((((r + 2) % 4) + 1) * 10 + static_cast<int>(i));
      const float own = static_cast<float>((r + 1) * 10 + static_cast<int>(i));
      CHECK(g[i] == doctest::Approx(span ? (own + other) / 4 : 25.0 + static_cast<double>(i)).epsilon(1e-6));
    }
    // Norm: the dense elements once, the span elements of both norm-group members (different sub-groups).
    double want = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i >= 3 && i < 7) continue;
      want += (25.0 + i) * (25.0 + i);
    }
    const int first = r / 2 * 2;
    for (int m = first; m < first + 2; ++m) {
      for (size_t i = 3; i < 7; ++i) {
        const double a = ((m % 2) + 1) * 10 + static_cast<double>(i), b = ((m % 2) + 3) * 10 + static_cast<double>(i);
        want += (a + b) / 4 * (a + b) / 4;
      }
    }
    CHECK(dp.grad_norm(g.data()) == doctest::Approx(std::sqrt(want)).epsilon(1e-6));
  });
  // ZeRO and the deterministic tree refuse spans (they keep every replica's buffer whole).
  ThreadPool pool(1);
  DataParallelOptions z;
  z.zero_stage = 1;
  z.group_spans = {{0, 1, nullptr, nullptr}};
  CHECK_THROWS_WITH(DataParallel(nullptr, 4, {{0, 4, false}}, AdamWHyper{}, pool, z),
                    doctest::Contains("plain data parallelism only"));
}
