// Mixture-of-experts MLP: the double-precision analytic gradient of every tensor (experts, router, and the
// load-balancing loss) against central finite differences, with and without capacity drops; the dispatch
// accounting; recomputation with experts bitwise unchanged; and a training smoke test through the Trainer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker/model/gpt.h"
#include "worker/train/trainer.h"
#include "worker_test_util.h"

using namespace railyard::worker;

namespace {

GptConfig moe_config(int experts, int top_k, double cf, double aux, int L = 1, int C = 16) {
  GptConfig c = make_gpt_config(L, C, /*NH=*/2, /*maxT=*/8, /*V=*/64);
  c.moe = make_moe_config(experts, top_k, cf, aux);
  return c;
}

struct Batch {
  std::vector<int32_t> in, tgt;
};

Batch batch(int n, uint32_t seed) {
  Batch b;
  std::mt19937 rng(seed);
  for (int i = 0; i < n; ++i) {
    b.in.push_back(static_cast<int32_t>(rng() % 64));
    b.tgt.push_back(static_cast<int32_t>(rng() % 64));
  }
  return b;
}

// GPT-2 init, then non-trivial biases/LayerNorms and a router of scale 1, so that routing decisions are far from
// ties (a finite difference must not flip a token's top-k).
void init(Gpt<double>& m, uint64_t seed) {
  const GptConfig& c = m.config();
  init_gpt2_weights(m.params(), c, seed);
  auto t = split_tensors(m.params(), c);
  auto sizes = param_sizes(c);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> n(0, 0.1);
  for (int i = 0; i < kNumParamTensors; ++i) {
    const auto name = kParamNames[i];
    if (name.back() == 'b' || name == "ln1w" || name == "ln2w" || name == "lnfw") {
      for (size_t j = 0; j < sizes[i]; ++j) t[i][j] += n(rng);
    }
  }
  std::normal_distribution<double> r(0, 1.0);
  double* router = m.params() + router_offset(c);
  for (size_t j = 0; j < router_size(c); ++j) router[j] = r(rng);
}

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  const double den = std::max(std::sqrt(na), std::sqrt(nb));
  return den == 0 ? 0 : std::sqrt(d) / den;
}

// Analytic vs central differences on up to 160 elements of each tensor (all of the small ones), the router included.
void gradcheck(const GptConfig& cfg, MoeStats* stats_out) {
  const int B = 2, T = 8;
  const Batch b = batch(B * T, 3);
  ThreadPool pool(1);
  Gpt<double> m(cfg, B, T, pool);
  init(m, 42);
  m.zero_grad();
  m.forward(b.in.data(), b.tgt.data(), Gpt<double>::Mode::kTrain);
  m.backward();
  *stats_out = m.moe_stats();
  CHECK(m.moe_stats().aux_loss > 0);
  const std::vector<double> analytic(m.grads(), m.grads() + m.num_params());
  struct Span {
    std::string name;
    size_t offset, size;
  };
  std::vector<Span> spans;
  {
    size_t off = 0;
    auto sizes = param_sizes(cfg);
    for (int i = 0; i < kNumParamTensors; ++i) {
      spans.push_back({std::string(kParamNames[i]), off, sizes[i]});
      off += sizes[i];
    }
    spans.push_back({"routerw", router_offset(cfg), router_size(cfg)});
  }
  const double h = 1e-5;
  double worst = 0;
  std::mt19937 pick(5);
  for (const Span& s : spans) {
    CAPTURE(s.name);
    std::vector<size_t> idx;
    if (s.size <= 160) {
      for (size_t i = 0; i < s.size; ++i) idx.push_back(s.offset + i);
    } else {
      for (int i = 0; i < 160; ++i) idx.push_back(s.offset + pick() % s.size);
    }
    std::vector<double> num, ana;
    for (size_t i : idx) {
      const double saved = m.params()[i];
      m.params()[i] = saved + h;
      const double up = m.forward(b.in.data(), b.tgt.data(), Gpt<double>::Mode::kEval);
      m.params()[i] = saved - h;
      const double down = m.forward(b.in.data(), b.tgt.data(), Gpt<double>::Mode::kEval);
      m.params()[i] = saved;
      num.push_back((up - down) / (2 * h));
      ana.push_back(analytic[i]);
    }
    double norm = 0;
    for (double x : ana) norm += x * x;
    if (s.name == "wpe" || norm == 0) continue;  // rows >= T are 0 both ways; padded wte rows too
    const double e = rel_err(num, ana);
    CHECK(e < 1e-6);
    worst = std::max(worst, e);
  }
  MESSAGE("worst per-tensor relative error vs finite differences: " << worst);
}

}  // namespace

TEST_CASE("MoE gradients (experts, router, load-balancing loss) match finite differences in double precision") {
  SUBCASE("E=4 top-2, capacity factor 1.0: some choices dropped") {
    MoeStats st;
    gradcheck(moe_config(4, 2, 1.0, 0.05), &st);
    CHECK(st.assignments == 2 * 8 * 2);
    CHECK(st.dropped > 0);  // the dropped path is exercised
  }
  SUBCASE("E=4 top-1, no capacity limit, two layers") {
    MoeStats st;
    gradcheck(moe_config(4, 1, 0, 0.1, /*L=*/2), &st);
    CHECK(st.dropped == 0);
  }
}

TEST_CASE("MoE: the fp32 path's gradients equal the double ones within 1e-5 (same routing)") {
  const GptConfig cfg = moe_config(4, 2, 1.0, 0.05, /*L=*/2, /*C=*/32);
  const Batch b = batch(16, 3);
  ThreadPool pool(2);
  Gpt<double> d(cfg, 2, 8, pool);
  init(d, 42);
  Gpt<float> f(cfg, 2, 8, pool);
  for (size_t i = 0; i < d.num_params(); ++i) f.params()[i] = static_cast<float>(d.params()[i]);
  d.zero_grad();
  f.zero_grad();
  const double ld = d.forward(b.in.data(), b.tgt.data(), Gpt<double>::Mode::kTrain);
  const float lf = f.forward(b.in.data(), b.tgt.data(), Gpt<float>::Mode::kTrain);
  d.backward();
  f.backward();
  CHECK(std::fabs(lf - ld) <= 1e-5 * std::fabs(ld));
  CHECK(f.moe_stats().dropped == d.moe_stats().dropped);
  std::vector<double> gd(d.grads(), d.grads() + d.num_params()), gf(f.grads(), f.grads() + f.num_params());
  MESSAGE("fp32 vs fp64 MoE gradient relative error " << rel_err(gf, gd));
  CHECK(rel_err(gf, gd) < 1e-5);
}

TEST_CASE("MoE dispatch: capacity, priority of first choices, dropped tokens pass through the residual") {
  // E=2 top-1 with capacity factor 0.25: each expert takes ceil(0.25 * 16 / 2) = 2 tokens of N = 16.
  const GptConfig cfg = moe_config(2, 1, 0.25, 0.01);
  CHECK(moe_capacity(cfg.moe, 16) == 2);
  CHECK(moe_capacity(moe_config(2, 1, 0, 0.01).moe, 16) == 16);
  CHECK(moe_capacity(moe_config(8, 2, 1.25, 0.01).moe, 16) == 5);  // ceil(1.25 * 2 * 16 / 8)
  ThreadPool pool(1);
  Gpt<double> m(cfg, 2, 8, pool);
  init(m, 7);
  const Batch b = batch(16, 9);
  m.forward(b.in.data(), b.tgt.data(), Gpt<double>::Mode::kEval);
  const MoeStats st = m.moe_stats();
  CHECK(st.assignments == 16);
  CHECK(st.dropped >= 12);                 // at most 2 + 2 kept
  CHECK(st.tokens_dropped == st.dropped);  // top-1: a dropped choice is a dropped token
  // With every expert zeroed the MoE layer adds exactly 0 to the residual stream (kept or dropped): the objective is
  // the dense model's without an MLP plus the load-balancing loss, i.e. the router only gates, never leaks.
  Gpt<double> z(cfg, 2, 8, pool);
  init(z, 7);
  auto t = split_tensors(z.params(), cfg);
  auto sizes = param_sizes(cfg);
  for (int i : {10, 11, 12, 13}) std::fill(t[i], t[i] + sizes[i], 0.0);
  const double with_zero_experts = z.forward(b.in.data(), b.tgt.data(), Gpt<double>::Mode::kEval);
  const double aux = z.moe_stats().aux_loss;
  // The same model without its MLP: a dense model whose MLP weights are 0 (its output is 0 too).
  GptConfig dense = cfg;
  dense.moe = MoeConfig{};
  Gpt<double> d(dense, 2, 8, pool);
  {
    auto dt = split_tensors(d.params(), dense);
    auto ds = param_sizes(dense);
    for (int i = 0; i < kNumParamTensors; ++i) {
      if (i >= 10 && i <= 13) {
        std::fill(dt[i], dt[i] + ds[i], 0.0);
      } else {
        std::memcpy(dt[i], t[i], ds[i] * sizeof(double));
      }
    }
  }
  const double dense_loss = d.forward(b.in.data(), b.tgt.data(), Gpt<double>::Mode::kEval);
  CHECK(with_zero_experts - aux == doctest::Approx(dense_loss).epsilon(1e-12));
}

TEST_CASE("MoE config errors name the flag") {
  CHECK_THROWS_WITH_AS(make_moe_config(1, 1, 1.0, 0.01), doctest::Contains("--moe-experts 1 must be in 2..1024"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(make_moe_config(4, 5, 1.0, 0.01), doctest::Contains("--moe-top-k 5 must be in 1..4"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(make_moe_config(4, 1, 1.0, -1), doctest::Contains("--moe-aux-coef"), railyard::ConfigError);
}

namespace {

std::vector<int32_t> pattern_corpus() {
  std::mt19937 rng(5);
  std::vector<int32_t> t(8192);
  for (size_t i = 0; i < t.size(); ++i) {
    t[i] = rng() % 8 == 0 ? static_cast<int32_t>(rng() % 64) : static_cast<int32_t>(i % 13 * 4);
  }
  return t;
}

struct SmokeRun {
  std::vector<double> losses;
  double step_aux = 0, step_dropped = -1;
  std::vector<float> params;
  MoeStats last;
};

SmokeRun smoke(const GptConfig& cfg, int steps, const RecomputeSpec& rc) {
  ThreadPool pool(2);
  railyard::worker::testing::WindowSource src(pattern_corpus(), 4, 8, 3);
  TrainConfig tc;
  tc.steps = steps;
  tc.batch = 4;
  tc.seq_len = 8;
  tc.lr = 1e-2;
  tc.quiet = true;
  tc.peak_flops = 1e9;
  tc.recompute = rc;
  Trainer t(cfg, tc, pool, src);
  SmokeRun r;
  for (int s = 0; s < steps; ++s) {
    const StepResult sr = t.step();
    r.losses.push_back(sr.loss);
    r.step_aux = sr.moe_aux_loss;
    r.step_dropped = sr.moe_dropped_fraction;
  }
  r.params.assign(t.model().params(), t.model().params() + t.model().num_params());
  r.last = t.model().moe_stats();
  return r;
}

}  // namespace

TEST_CASE("MoE trains (E=4 top-2) and recomputation with experts is bitwise unchanged") {
  GptConfig cfg = make_gpt_config(/*L=*/2, /*C=*/32, /*NH=*/4, /*maxT=*/8, /*V=*/64);
  cfg.moe = make_moe_config(4, 2, 1.25, 0.01);
  const SmokeRun base = smoke(cfg, 40, {});
  MESSAGE("MoE smoke: loss " << base.losses.front() << " -> " << base.losses.back() << ", aux " << base.last.aux_loss
                             << ", dropped " << base.last.dropped << "/" << base.last.assignments);
  CHECK(base.losses.back() < 0.6 * base.losses.front());  // ln(64) = 4.16 to well below
  CHECK(base.last.aux_loss >= 0.0099 * cfg.num_layers);   // alpha * L at perfect balance is the minimum
  CHECK(base.last.aux_loss < 0.05 * cfg.num_layers);
  CHECK(base.last.assignments == 2u * 32 * 2);
  CHECK(base.step_aux == doctest::Approx(base.last.aux_loss));  // one micro-batch per step: the step reports it
  CHECK(base.step_dropped == doctest::Approx(double(base.last.dropped) / base.last.assignments));
  const SmokeRun full = smoke(cfg, 5, {Recompute::kFull, -1});
  const SmokeRun none = smoke(cfg, 5, {});
  CHECK(full.losses == none.losses);
  CHECK(std::memcmp(full.params.data(), none.params.data(), full.params.size() * sizeof(float)) == 0);
}
