// Optimizer offload (worker/optim/offload.h) through the real Trainer: with --offload optimizer the losses, grad
// norms, parameters and AdamW moments are bitwise those of the in-memory optimizer, in one process and with data
// parallelism over real Gloo sockets (plain and deterministic); ZeRO and tp/pp are refused naming the flags; the
// device bytes the trainer allocates with and without offload match the planner's memory model, and on gpt2-124m
// shapes the device memory and its drop are within 15% of the planner's prediction.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "tests/unit/worker/planner_fixture.h"
#include "tests/unit/worker_parallel/offload_test_util.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/optim/offload.h"
#include "worker/parallel/data_parallel.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

namespace {

const GptConfig kCfg = make_gpt_config(/*L=*/2, /*C=*/64, /*NH=*/4, /*maxT=*/32, /*V=*/256);
constexpr int kB = 2, kT = 32, kMicro = 4, kSteps = 6;

TrainConfig train_config(OffloadMode offload, int offload_threads = 1) {
  return testing::offload_train_config(kSteps, kB, kT, kMicro, offload, offload_threads);
}

using Run = testing::OffloadRun;
using testing::check_bitwise;

// kSteps steps of testing::train_offload (validation after every other step).
Run train(Trainer& tr, BatchSource* val) { return testing::train_offload(tr, val, kSteps); }

Run single_process(OffloadMode offload, int offload_threads = 1, const GptConfig& cfg = kCfg) {
  ThreadPool pool(2);
  testing::StreamSource src(0, 1, kB, kT, cfg.vocab_size);
  testing::StreamSource val(0, 1, kB, kT, cfg.vocab_size);
  TrainConfig tc = train_config(offload, offload_threads);
  tc.val_steps = 2;
  Trainer tr(cfg, tc, pool, src, &val);
  return train(tr, &val);
}

std::vector<Run> data_parallel(int dp, OffloadMode offload, bool deterministic) {
  std::vector<Run> runs(dp);
  comm::run_local_world(dp, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    testing::StreamSource src(deterministic ? 0 : c.rank(), deterministic ? 1 : dp, kB, kT, kCfg.vocab_size);
    const TrainConfig tc = train_config(offload);
    DataParallelOptions opt;
    opt.bucket_bytes = 64 << 10;  // several buckets, reduced during backward
    opt.deterministic = deterministic;
    auto sync = gpt_data_parallel(&c, kCfg, tc, pool, opt);
    Trainer tr(kCfg, tc, pool, src, nullptr, sync.get());
    runs[c.rank()] = train(tr, nullptr);
  });
  return runs;
}

}  // namespace

TEST_CASE("offload groups cover the flat buffer once, in forward order") {
  GptConfig moe = kCfg;
  moe.moe = make_moe_config(4, 2, 1.25, 0.01);
  for (const GptConfig& c : {kCfg, moe, model_preset("gpt2-124m")}) {
    const auto groups = offload_groups(c);
    REQUIRE(groups.size() == static_cast<size_t>(c.num_layers) + 2);
    std::vector<uint8_t> seen(num_parameters(c), 0);
    for (const auto& g : groups)
      for (const auto& r : g)
        for (size_t i = r.offset; i < r.offset + r.count; ++i) ++seen[i];
    CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<std::ptrdiff_t>(seen.size()));
    // Group 1 + l holds layer l's qkvw slice: the l-th of the stacked (L, 3C, C) tensor.
    const auto sizes = param_sizes(c);
    const size_t qkvw = sizes[0] + sizes[1] + sizes[2] + sizes[3];
    CHECK(groups[2][2].offset == qkvw + sizes[4] / c.num_layers);
    CHECK(groups[2][2].decay);
    CHECK_FALSE(groups[2][3].decay);  // qkvb
  }
}

TEST_CASE("offload equals the in-memory optimizer bitwise in one process (1 and 2 update threads)") {
  const Run base = single_process(OffloadMode::kNone);
  CHECK(base.losses.back() < base.losses.front());  // it trains
  CHECK(base.adam_t == kSteps);
  check_bitwise(single_process(OffloadMode::kOptimizer, 1), base);
  check_bitwise(single_process(OffloadMode::kOptimizer, 2), base);
}

TEST_CASE("offload equals the in-memory optimizer bitwise with mixture-of-experts layers (router slices per group)") {
  GptConfig moe = kCfg;
  moe.moe = make_moe_config(/*experts=*/4, /*top_k=*/2, /*capacity_factor=*/1.25, /*aux_coef=*/0.01);
  const Run base = single_process(OffloadMode::kNone, 1, moe);
  CHECK(base.losses.back() < base.losses.front());
  check_bitwise(single_process(OffloadMode::kOptimizer, 1, moe), base);
}

TEST_CASE("offload equals the in-memory optimizer bitwise with data parallelism (dp=2, plain and deterministic)") {
  for (bool det : {false, true}) {
    INFO("deterministic " << det);
    const auto base = data_parallel(2, OffloadMode::kNone, det);
    const auto off = data_parallel(2, OffloadMode::kOptimizer, det);
    check_bitwise(off[0], base[0]);
    check_bitwise(off[1], base[1]);
  }
}

TEST_CASE("the next forward waits for exactly the group it reads") {
  // A model big enough that its update takes milliseconds: wait_group(0) must not return before group 0 is written.
  const GptConfig c = make_gpt_config(4, 256, 4, 64, 512);
  const size_t n = num_parameters(c);
  std::vector<float> p0(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    g[i] = 0.001f * static_cast<float>(i % 31) - 0.015f;
  }
  ThreadPool pool(1);
  AdamW ref(c, AdamWHyper{}, pool);
  std::vector<float> want = p0;
  ref.update(want.data(), g.data(), 1e-3f, 0.5f);
  OffloadAdamW off(c, AdamWHyper{}, 1);
  std::vector<float> got = p0;
  off.start(got.data(), g.data(), 1e-3f, 0.5f);
  const auto groups = offload_groups(c);
  for (size_t k = 0; k < groups.size(); ++k) {
    off.wait_group(static_cast<int>(k));
    for (const auto& r : groups[k])
      CHECK(std::memcmp(got.data() + r.offset, want.data() + r.offset, r.count * sizeof(float)) == 0);
  }
  off.wait_all();
  CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(off.m(), ref.m(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(off.v(), ref.v(), n * sizeof(float)) == 0);
  CHECK(off.t() == 1);
  CHECK(off.last_update_seconds() > 0);
}

TEST_CASE("offload refuses ZeRO and parameter offload with the flag named") {
  CHECK_THROWS_WITH_AS(parse_offload("optimizer,params"), doctest::Contains("not implemented"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_offload("gpu"), doctest::Contains("--offload 'gpu'"), railyard::ConfigError);
  CHECK(parse_offload("optimizer") == OffloadMode::kOptimizer);
  ThreadPool pool(1);
  testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
  DataParallelOptions z;
  z.zero_stage = 1;
  auto sync = gpt_data_parallel(nullptr, kCfg, train_config(OffloadMode::kOptimizer), pool, z);
  CHECK_THROWS_WITH_AS(Trainer(kCfg, train_config(OffloadMode::kOptimizer), pool, src, nullptr, sync.get()),
                       doctest::Contains("--zero 1"), railyard::ConfigError);
  TrainConfig bad = train_config(OffloadMode::kOptimizer);
  bad.offload_threads = 0;
  CHECK_THROWS_WITH_AS(bad.validate(kCfg), doctest::Contains("--offload-threads"), railyard::ConfigError);
}

TEST_CASE("the trainer allocates what memory_budget() says, with and without offload") {
  ThreadPool pool(2);
  testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
  for (OffloadMode mode : {OffloadMode::kNone, OffloadMode::kOptimizer}) {
    Trainer tr(kCfg, train_config(mode), pool, src);
    const MemoryBudget want = tr.memory_budget(), got = tr.allocated_memory();
    CHECK(got.params == want.params);
    CHECK(got.grads == want.grads);
    CHECK(got.adam == want.adam);
    CHECK(got.activations == want.activations);
    CHECK(got.host == want.host);
    const size_t n = num_parameters(kCfg);
    CHECK(got.adam == (mode == OffloadMode::kNone ? 8 * n : 0));
    CHECK(got.host == (mode == OffloadMode::kNone ? 0 : offload_host_bytes(kCfg)));
  }
}

// The planner's memory model (planner/cost_model.h, cpu profile: fp32 weights, gradients, AdamW m and v,
// activations) against the worker's device arena on gpt2-124m at the planner's sequence (1024), micro-batch 1 and 2:
// the device bytes with and without offload and what offload saves. (The test above ties the worker's numbers to
// the buffers a Trainer really allocates; tests/bench/worker/bench_offload.cc allocates gpt2-124m for real.)
TEST_CASE("gpt2-124m: device memory with and without offload, and its drop, match the planner within 15%") {
  namespace plan = railyard::plan;
  const GptConfig g = model_preset("gpt2-124m");
  const plan::Cluster cluster = testing::cpu_cluster();
  for (int B : {1, 2}) {
    CAPTURE(B);
    const plan::Job job = testing::planner_job("gpt2-124m", g, B);
    auto predicted = [&](bool offload) {
      plan::Layout l;
      l.micro_batch = B;
      l.offload = offload;
      const plan::MemoryBreakdown m = plan::estimate(job, cluster, l).memory;
      return m.params + m.grads + m.optimizer + m.activations;  // the workspace is not a model buffer
    };
    auto measured = [&](OffloadMode mode) {
      MemoryBudget m = memory_budget(g, B, g.max_seq_len, 2);
      if (mode != OffloadMode::kNone) m.adam = 0;  // as Trainer::memory_budget(), checked against allocation above
      return static_cast<double>(m.total());
    };
    const double m_in = measured(OffloadMode::kNone), m_off = measured(OffloadMode::kOptimizer);
    const double p_in = predicted(false), p_off = predicted(true);
    MESSAGE("B=" << B << " device MiB in-memory / offload: measured " << m_in / 1048576 << " / " << m_off / 1048576
                 << ", planner " << p_in / 1048576 << " / " << p_off / 1048576);
    auto within = [](double got, double want) { return std::fabs(got - want) <= 0.15 * want; };
    CHECK(m_off < m_in);
    CHECK(within(m_in, p_in));
    CHECK(within(m_off, p_off));
    CHECK(within(m_in - m_off, p_in - p_off));
  }
}
