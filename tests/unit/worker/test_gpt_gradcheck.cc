// Gradient check: the analytic backward of every parameter tensor against central finite differences, computed
// in double precision (Gpt<double>) so that the comparison is not drowned in fp32 rounding; then the fp32 path's
// gradients against the double ones.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "worker/model/gpt.h"

using namespace railyard::worker;

namespace {

// Norm-wise relative error ||a - b|| / max(||a||, ||b||), per tensor.
template <typename A, typename B>
double rel_err(const A* a, const B* b, size_t n) {
  double d = 0, na = 0, nb = 0;
  for (size_t i = 0; i < n; ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    na += double(a[i]) * double(a[i]);
    nb += double(b[i]) * double(b[i]);
  }
  const double den = std::max(std::sqrt(na), std::sqrt(nb));
  return den == 0 ? 0 : std::sqrt(d) / den;
}

struct Fixture {
  GptConfig cfg = make_gpt_config(/*L=*/2, /*C=*/32, /*NH=*/4, /*maxT=*/8, /*V=*/64);  // Vp = 128
  int B = 2, T = 8;
  std::vector<int32_t> inputs, targets;
  Fixture() {
    std::mt19937 rng(7);
    for (int i = 0; i < B * T; ++i) {
      inputs.push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
      targets.push_back(static_cast<int32_t>(rng() % cfg.vocab_size));
    }
  }
  // GPT-2 init, then non-trivial biases and LayerNorm parameters so that every tensor's gradient is exercised.
  void init(double* p) const {
    init_gpt2_weights(p, cfg, 42);
    auto t = split_tensors(p, cfg);
    auto sizes = param_sizes(cfg);
    std::mt19937_64 rng(9);
    std::normal_distribution<double> n(0, 0.1);
    for (int i = 0; i < kNumParamTensors; ++i) {
      const auto name = kParamNames[i];
      const bool bias_or_ln = name.back() == 'b' || name == "ln1w" || name == "ln2w" || name == "lnfw";
      if (!bias_or_ln || name == "wte") continue;
      for (size_t j = 0; j < sizes[i]; ++j) t[i][j] += n(rng);
    }
  }
};

}  // namespace

TEST_CASE("double-precision analytic gradients match central finite differences for every tensor") {
  Fixture f;
  ThreadPool pool(1);
  Gpt<double> m(f.cfg, f.B, f.T, pool);
  f.init(m.params());
  m.zero_grad();
  m.forward(f.inputs.data(), f.targets.data(), Gpt<double>::Mode::kTrain);
  m.backward();
  const std::vector<double> analytic(m.grads(), m.grads() + m.num_params());

  const double h = 1e-4;
  std::vector<double> numeric(m.num_params());
  for (size_t i = 0; i < m.num_params(); ++i) {
    const double saved = m.params()[i];
    m.params()[i] = saved + h;
    const double up = m.forward(f.inputs.data(), f.targets.data(), Gpt<double>::Mode::kEval);
    m.params()[i] = saved - h;
    const double down = m.forward(f.inputs.data(), f.targets.data(), Gpt<double>::Mode::kEval);
    m.params()[i] = saved;
    numeric[i] = (up - down) / (2 * h);
  }
  // Bound: central differences in double have truncation error O(h^2 * f''') ~ 1e-8 and rounding ~ 1e-16 / h
  // ~ 1e-12 (relative errors of 1e-9..1e-7 measured); 1e-6 leaves room for small tensors and still catches any real bug
  // (a wrong term typically gives 1e-2 or worse).
  auto sizes = param_sizes(f.cfg);
  size_t off = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const double err = rel_err(analytic.data() + off, numeric.data() + off, sizes[i]);
    double norm = 0;
    for (size_t j = 0; j < sizes[i]; ++j) norm += analytic[off + j] * analytic[off + j];
    MESSAGE("tensor " << kParamNames[i] << " rel err " << err << " grad norm " << std::sqrt(norm));
    CHECK(std::sqrt(norm) > 0);  // every tensor actually receives gradient
    CHECK(err < 1e-6);
    off += sizes[i];
  }
}

TEST_CASE("fp32 gradients match the double-precision gradients (2 threads)") {
  Fixture f;
  ThreadPool pool(2);
  Gpt<double> md(f.cfg, f.B, f.T, pool);
  Gpt<float> mf(f.cfg, f.B, f.T, pool);
  f.init(md.params());
  for (size_t i = 0; i < md.num_params(); ++i) mf.params()[i] = static_cast<float>(md.params()[i]);
  md.zero_grad();
  mf.zero_grad();
  const double ld = md.forward(f.inputs.data(), f.targets.data(), Gpt<double>::Mode::kTrain);
  const double lf = mf.forward(f.inputs.data(), f.targets.data(), Gpt<float>::Mode::kTrain);
  CHECK(std::abs(ld - lf) / ld < 1e-6);
  md.backward();
  mf.backward();
  auto sizes = param_sizes(f.cfg);
  size_t off = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const double err = rel_err(mf.grads() + off, md.grads() + off, sizes[i]);
    MESSAGE("tensor " << kParamNames[i] << " fp32 vs fp64 rel err " << err);
    CHECK(err < 1e-5);  // fp32 epsilon is 6e-8; a few hundred accumulations stay well inside 1e-5
    off += sizes[i];
  }
}

TEST_CASE("backward(accumulate=false) over stale gradients equals zero_grad() + backward()") {
  Fixture f;
  ThreadPool pool(2);
  Gpt<float> m(f.cfg, f.B, f.T, pool);
  m.init_weights(3);
  m.zero_grad();
  m.forward(f.inputs.data(), f.targets.data(), Gpt<float>::Mode::kTrain);
  m.backward();
  const std::vector<float> ref(m.grads(), m.grads() + m.num_params());
  for (size_t i = 0; i < m.num_params(); ++i) m.grads()[i] = std::nanf("");  // stale garbage must not leak in
  m.forward(f.inputs.data(), f.targets.data(), Gpt<float>::Mode::kTrain);
  m.backward(/*accumulate=*/false);
  CHECK(std::memcmp(ref.data(), m.grads(), ref.size() * sizeof(float)) == 0);
}
