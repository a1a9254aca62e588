// Activation recomputation in the single-process model: training with --recompute selective/full (all layers or the
// first K) gives bitwise the losses and parameters of no recomputation, and the activation bytes the model allocates
// drop as the planner's memory model predicts on gpt2-124m shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "tests/unit/worker/planner_fixture.h"
#include "worker/model/gpt.h"
#include "worker/train/trainer.h"
#include "worker_test_util.h"

using namespace railyard::worker;
using railyard::worker::testing::WindowSource;

namespace {

const GptConfig kCfg = make_gpt_config(/*L=*/3, /*C=*/32, /*NH=*/4, /*maxT=*/16, /*V=*/100);

std::vector<int32_t> corpus() {
  // A learnable stream: a repeating pattern with occasional noise.
  std::mt19937 rng(5);
  std::vector<int32_t> t(4096);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = rng() % 8 == 0 ? static_cast<int32_t>(rng() % kCfg.vocab_size) : static_cast<int32_t>(i % 13 * 7);
  }
  return t;
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<float> params;
  size_t activation_bytes = 0;
};

// 4 AdamW steps of 2 micro-batches (B2 T16) through the real Trainer, 2 threads.
Run train(const RecomputeSpec& r) {
  ThreadPool pool(2);
  WindowSource src(corpus(), 2, 16, 3);
  TrainConfig tc;
  tc.steps = 4;
  tc.batch = 2;
  tc.seq_len = 16;
  tc.global_batch_tokens = 2 * 2 * 16;
  tc.lr = 1e-2;
  tc.quiet = true;
  tc.peak_flops = 1e9;
  tc.recompute = r;
  Trainer t(kCfg, tc, pool, src);
  Run out;
  for (int s = 0; s < tc.steps; ++s) {
    const StepResult sr = t.step();
    out.losses.push_back(sr.loss);
    out.norms.push_back(sr.grad_norm);
  }
  out.params.assign(t.model().params(), t.model().params() + t.model().num_params());
  out.activation_bytes = t.model().activation_bytes();
  return out;
}

}  // namespace

TEST_CASE("recomputation leaves losses, grad norms and parameters bitwise unchanged") {
  const Run base = train({});
  REQUIRE(base.losses.size() == 4);
  CHECK(base.losses.back() < base.losses.front());  // it trains
  struct Case {
    RecomputeSpec spec;
    const char* name;
  };
  const Case cases[] = {{{Recompute::kSelective, -1}, "selective all"},
                        {{Recompute::kFull, -1}, "full all"},
                        {{Recompute::kFull, 2}, "full first 2"},
                        {{Recompute::kSelective, 2}, "selective first 2"}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Run r = train(c.spec);
    CHECK(r.losses == base.losses);  // exact double equality
    CHECK(r.norms == base.norms);
    REQUIRE(r.params.size() == base.params.size());
    CHECK(std::memcmp(r.params.data(), base.params.data(), r.params.size() * sizeof(float)) == 0);
    CHECK(r.activation_bytes < base.activation_bytes);
    CHECK(r.activation_bytes == activation_bytes(kCfg, 2, 16, 2, c.spec));  // what the constructor allocated
  }
}

TEST_CASE("double precision: recomputed gradients equal the stored-activation ones bitwise") {
  ThreadPool pool(1);
  std::mt19937 rng(9);
  std::vector<int32_t> in(2 * 16), tgt(2 * 16);
  for (auto& x : in) x = static_cast<int32_t>(rng() % kCfg.vocab_size);
  for (auto& x : tgt) x = static_cast<int32_t>(rng() % kCfg.vocab_size);
  auto grads = [&](const RecomputeSpec& r) {
    Gpt<double> m(kCfg, 2, 16, pool, r);
    m.init_weights(42);
    m.zero_grad();
    m.forward(in.data(), tgt.data(), Gpt<double>::Mode::kTrain);
    m.backward();
    return std::vector<double>(m.grads(), m.grads() + m.num_params());
  };
  const auto base = grads({});
  CHECK(grads({Recompute::kFull, -1}) == base);
  CHECK(grads({Recompute::kSelective, -1}) == base);
}

TEST_CASE("--recompute parsing and its errors") {
  CHECK(parse_recompute("full", -1, kCfg).full(2));
  CHECK(!parse_recompute("full", 2, kCfg).full(2));
  CHECK(parse_recompute("selective", 3, kCfg).layers == -1);  // all 3 layers = all
  CHECK(describe(parse_recompute("full", 2, kCfg)) == "full (layers 0-1)");
  CHECK(describe(parse_recompute("none", -1, kCfg)) == "none");
  CHECK_THROWS_WITH_AS(parse_recompute("attention", -1, kCfg), doctest::Contains("is not none, selective or full"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_recompute("full", 4, kCfg), doctest::Contains("--recompute-layers 4 must be in 0..3"),
                       railyard::ConfigError);
}

// The planner's memory model (planner/cost_model.h, Korthikanti et al. without dropout, fp32 activations)
// against the bytes Gpt<float> allocates (activation_bytes() is what the constructor allocates, checked above), on
// gpt2-124m at the planner's sequence (1024) and micro-batches of 1 and 2, one process.
TEST_CASE("gpt2-124m: allocated activation bytes and their drop match the planner within 15%") {
  namespace plan = railyard::plan;
  const GptConfig g = model_preset("gpt2-124m");
  const plan::Cluster cluster = testing::cpu_cluster();
  const int threads = 2;
  for (int B : {1, 2}) {
    CAPTURE(B);
    const plan::Job job = testing::planner_job("gpt2-124m", g, B);
    auto predicted = [&](plan::Recompute r) {
      plan::Layout l;
      l.micro_batch = B;
      l.recompute = r;
      return plan::estimate(job, cluster, l).memory.activations;
    };
    auto measured = [&](Recompute r) {
      return static_cast<double>(activation_bytes(g, B, g.max_seq_len, threads, RecomputeSpec{r, -1}));
    };
    const double m_none = measured(Recompute::kNone), m_sel = measured(Recompute::kSelective),
                 m_full = measured(Recompute::kFull);
    const double p_none = predicted(plan::Recompute::kNone), p_sel = predicted(plan::Recompute::kSelective),
                 p_full = predicted(plan::Recompute::kFull);
    MESSAGE("B=" << B << " MiB measured none/selective/full " << m_none / 1048576 << " / " << m_sel / 1048576 << " / "
                 << m_full / 1048576 << ", planner " << p_none / 1048576 << " / " << p_sel / 1048576 << " / "
                 << p_full / 1048576);
    CHECK(m_full < m_sel);
    CHECK(m_sel < m_none);
    auto within = [](double got, double want) { return std::fabs(got - want) <= 0.15 * want; };
    CHECK(within(m_none, p_none));
    CHECK(within(m_sel, p_sel));
    CHECK(within(m_full, p_full));
    CHECK(within(m_none - m_full, p_none - p_full));  // what full recomputation saves
    CHECK(within(m_none - m_sel, p_none - p_sel));    // what selective recomputation saves
  }
}
