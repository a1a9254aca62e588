// Kernel-level checks: the fast float exp/tanh paths against the double reference, NaN propagation, the pool's
// work split, the split GEMM, config parsing, the LR schedule and the clipping factor.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/error.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/model/gpt_config.h"
#include "worker/optim/adamw.h"
#include "worker/train/perf.h"

using namespace railyard::worker;

TEST_CASE("fp32 GELU and cross entropy match the double path, and NaN propagates") {
  ThreadPool pool(2);
  const size_t n = 20001;
  std::vector<float> xf(n), yf(n), gf(n), onesf(n, 1.0f);
  std::vector<double> xd(n), yd(n), gd(n), onesd(n, 1.0);
  for (size_t i = 0; i < n; ++i) xd[i] = xf[i] = -12.0f + 24.0f * static_cast<float>(i) / (n - 1);
  cpu::gelu_forward(pool, yf.data(), xf.data(), n);
  cpu::gelu_forward(pool, yd.data(), xd.data(), n);
  cpu::gelu_backward(pool, gf.data(), xf.data(), onesf.data(), n);
  cpu::gelu_backward(pool, gd.data(), xd.data(), onesd.data(), n);
  double max_y = 0, max_g = 0;
  for (size_t i = 0; i < n; ++i) {
    max_y = std::max(max_y, std::abs(yf[i] - yd[i]) / std::max(1.0, std::abs(yd[i])));
    max_g = std::max(max_g, std::abs(gf[i] - gd[i]));
  }
  MESSAGE("gelu max err " << max_y << ", gelu' max abs err " << max_g);
  CHECK(max_y < 1e-6);
  CHECK(max_g < 5e-6);  // tanh error ~1e-7 is amplified by x * du/dx (up to ~20 at |x| = 12)

  // cross entropy over a wide logit range, Vp padding included
  const int rows = 64, V = 1000, Vp = 1024;
  std::mt19937 rng(1);
  std::normal_distribution<double> nd(0, 8);
  std::vector<float> lf(rows * Vp);
  std::vector<double> ld(rows * Vp);
  std::vector<int32_t> tg(rows);
  for (int i = 0; i < rows * Vp; ++i) ld[i] = lf[i] = static_cast<float>(nd(rng));
  for (int r = 0; r < rows; ++r) tg[r] = static_cast<int32_t>(rng() % V);
  std::vector<float> lossf(rows);
  std::vector<double> lossd(rows);
  cpu::crossentropy_forward(pool, lossf.data(), lf.data(), tg.data(), rows, V, Vp);
  cpu::crossentropy_forward(pool, lossd.data(), ld.data(), tg.data(), rows, V, Vp);
  for (int r = 0; r < rows; ++r) CHECK(std::abs(lossf[r] - lossd[r]) / lossd[r] < 2e-6);
  // the fused gradient rows sum to 0 (softmax minus one-hot) and the padding gets 0
  cpu::crossentropy_fused_backward(pool, lossf.data(), lf.data(), tg.data(), rows, V, Vp, 1.0f);
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    for (int v = 0; v < V; ++v) s += lf[r * Vp + v];
    CHECK(std::abs(s) < 1e-5);
    CHECK(lf[r * Vp + V] == 0.0f);
  }

  float nan_in = std::nanf(""), nan_out = 0;
  cpu::gelu_forward(pool, &nan_out, &nan_in, 1);
  CHECK(std::isnan(nan_out));
  std::vector<float> z(128, 0.5f);
  z[7] = std::nanf("");
  int32_t t0 = 3;
  float loss = 0;
  cpu::crossentropy_forward(pool, &loss, z.data(), &t0, 1, 100, 128);
  CHECK(std::isnan(loss));
}

TEST_CASE("the pool splits work exactly once per index, and the split GEMM equals the serial one") {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
    }
  }
  const int M = 70, N = 150, K = 33;
  std::vector<float> A(M * K), B(N * K), C1(M * N), C2(M * N);
  std::mt19937 rng(2);
  for (auto& a : A) a = static_cast<float>(rng() % 100) / 50.0f - 1.0f;
  for (auto& b : B) b = static_cast<float>(rng() % 100) / 50.0f - 1.0f;
  ThreadPool one(1), two(2);
  cpu::gemm<float>(one, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C1.data(), N);
  cpu::gemm<float>(two, false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C2.data(), N);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += double(A[i * K + k]) * B[j * K + k];
      CHECK(std::abs(C1[i * N + j] - ref) < 1e-4);
      CHECK(std::abs(C2[i * N + j] - ref) < 1e-4);
    }
  }
}

TEST_CASE("thread count comes from RAILYARD_NUM_THREADS, and garbage is refused naming the variable") {
  setenv("RAILYARD_NUM_THREADS", "3", 1);
  CHECK(default_num_threads() == 3);
  setenv("RAILYARD_NUM_THREADS", "two", 1);
  CHECK_THROWS_WITH_AS(default_num_threads(), doctest::Contains("RAILYARD_NUM_THREADS"), railyard::ConfigError);
  unsetenv("RAILYARD_NUM_THREADS");
  CHECK(default_num_threads() >= 1);
}

TEST_CASE("model specs, presets and their errors") {
  const GptConfig g = parse_model_spec("gpt2-124m");
  CHECK(g.num_layers == 12);
  CHECK(g.padded_vocab_size == 50304);
  CHECK(num_parameters(g) == 124475904);
  CHECK(parse_model_spec("gpt2-1.5b").num_heads == 25);
  const GptConfig c = parse_model_spec("l=2,c=64,nh=4,t=128,v=200");
  CHECK(c.padded_vocab_size == 256);
  CHECK_THROWS_WITH_AS(parse_model_spec("gpt3"), doctest::Contains("unknown preset 'gpt3'"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_model_spec("l=2,c=64,nh=5,t=8,v=9"), doctest::Contains("divisible"),
                       railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_model_spec("l=2,c=64,t=8,v=9"), doctest::Contains("lacks nh"), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(parse_model_spec("l=x,c=64,nh=4,t=8,v=9"), doctest::Contains("l='x'"), railyard::ConfigError);
  // 6N + 12 L C T, N without wpe
  CHECK(flops_per_token(g, 64) == doctest::Approx(6.0 * (124475904.0 - 1024 * 768) + 12.0 * 12 * 768 * 64));
}

TEST_CASE("warmup + cosine schedule, and the clipping factor") {
  LrSchedule s{1.0, 10, 110, 0.1};
  CHECK(s.at(0) == doctest::Approx(0.1));
  CHECK(s.at(9) == doctest::Approx(1.0));
  CHECK(s.at(10) == doctest::Approx(1.0));
  CHECK(s.at(60) == doctest::Approx(0.55));
  CHECK(s.at(110) == doctest::Approx(0.1));
  CHECK(s.at(500) == doctest::Approx(0.1));
  CHECK(clip_factor(0.5, 1.0) == 1.0f);
  CHECK(clip_factor(4.0, 1.0) == doctest::Approx(0.25).epsilon(1e-5));
  CHECK(clip_factor(4.0, 0.0) == 1.0f);
  CHECK(decays(0));    // wte
  CHECK(decays(4));    // qkvw
  CHECK(!decays(5));   // qkvb
  CHECK(!decays(14));  // lnfw
}

TEST_CASE("the GEMM-rate measurement fits its operands in the borrowed gradient buffer, in row blocks when needed") {
  const GptConfig c = model_preset("gpt2-124m");
  const size_t grads = num_parameters(c);
  // B=4, T=64: the 256 rows' operands fit in the gradients (no memory beyond the budget).
  CHECK(gemm_rate_rows(c, 256, grads) == 256);
  // B=16, T=64: the LM head's 1024 x 50304 output alone is 51.5 M floats; 512-row blocks fit, 1024 do not. (Before,
  // the measurement allocated 0.93 GB of its own here: peak RSS 36 % over the printed budget.)
  CHECK(gemm_rate_scratch(c, 1024) > grads);
  CHECK(gemm_rate_rows(c, 1024, grads) == 512);
  for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, size_t{65536}}) {
    const size_t rows = gemm_rate_rows(c, n, grads);
    CAPTURE(n);
    REQUIRE(rows > 0);
    CHECK(gemm_rate_scratch(c, rows) <= grads);
    CHECK((rows == n || gemm_rate_scratch(c, 2 * rows) > grads));  // the largest halving that fits
  }
  // Not one row fits: 0 (the measurement then allocates, as for a tiny model's small operands).
  CHECK(gemm_rate_rows(c, 256, gemm_rate_scratch(c, 1) - 1) == 0);
  // Measured in blocks, the rate is still a rate of the same FLOPs: positive and finite.
  const GptConfig tiny = model_preset("tiny");
  ThreadPool pool(1);
  std::vector<float> scratch(gemm_rate_scratch(tiny, 16));
  const double rate = measure_gemm_rate(pool, tiny, 4, 16, 1, scratch.data(), scratch.size());
  CHECK(gemm_rate_rows(tiny, 64, scratch.size()) == 16);
  CHECK(std::isfinite(rate));
  CHECK(rate > 0);
}
