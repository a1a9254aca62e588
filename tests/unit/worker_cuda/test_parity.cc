// Every CUDA kernel against its CPU twin (worker/kernels/cpu) on random inputs. GPU hosts only: without a usable GPU
// the binary prints why and exits 77, which CTest reports as Skipped. Tolerances: |gpu - cpu| <= tol * (|cpu| + mean
// |cpu|) elementwise, tol 1e-5 for fp32 kernels, 1e-3 for the bf16 GEMMs (whose CPU reference runs in fp32 on the
// same bf16-rounded operands). Shapes are small but odd (T not a multiple of the tiles, head size not of 32).
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "worker/comm/bf16.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/gemm.h"
#include "worker/kernels/cuda/kernels.h"
#include "worker/kernels/cuda/launch.h"

namespace cpu = railyard::worker::cpu;
namespace gpu = railyard::worker::cuda;
using railyard::worker::ThreadPool;

namespace {

void skip_without_gpu() {
  if (gpu::device_count() > 0) return;
  std::fprintf(stderr,
               "worker_cuda_parity: SKIPPED: no usable CUDA device on this host (run tests/gpu/run.sh on a GPU "
               "machine)\n");
  std::exit(77);
}

template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    RAILYARD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T)));
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  ~Dev() { cudaFree(p_); }
  Dev(Dev&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev& operator=(Dev&&) = delete;
  void upload(const std::vector<T>& h) {
    RAILYARD_CUDA_CHECK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    RAILYARD_CUDA_CHECK(cudaDeviceSynchronize());
    RAILYARD_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> random_tokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (float w : want) scale += std::fabs(w);
  scale = want.empty() ? 0 : scale / static_cast<double>(want.size());
  size_t bad = 0, worst = 0;
  double worst_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]) / (std::fabs(want[i]) + scale + 1e-30);
    if (!(err <= tol)) ++bad;
    if (!(err <= worst_err)) {
      worst_err = err;
      worst = i;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements off; worst at " << worst << ": gpu " << got[worst]
            << " cpu " << want[worst] << " (relative " << worst_err << ", tolerance " << tol << ")");
  CHECK(bad == 0);
}

std::vector<float> round_bf16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = railyard::worker::comm::bf16_to_float(railyard::worker::comm::float_to_bf16(v[i]));
  return r;
}

Dev<gpu::bf16> to_device_bf16(const std::vector<float>& v) {
  Dev<float> f(v);
  Dev<gpu::bf16> b(v.size());
  gpu::to_bf16(b.get(), f.get(), v.size(), nullptr);
  RAILYARD_CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

constexpr double kFp32Tol = 1e-5;
constexpr double kBf16Tol = 1e-3;
constexpr int B = 2, Tn = 45, C = 96, NH = 3, V = 301, Vp = 320;
constexpr size_t N = static_cast<size_t>(B) * Tn;

}  // namespace

TEST_CASE("encoder forward and backward") {
  skip_without_gpu();
  ThreadPool pool(2);
  auto wte = random_vec(static_cast<size_t>(Vp) * C, 1), wpe = random_vec(static_cast<size_t>(Tn) * C, 2);
  auto inp = random_tokens(N, V, 3);
  auto dout = random_vec(N * C, 4);
  std::vector<float> out(N * C), dwte = random_vec(wte.size(), 5), dwpe = random_vec(wpe.size(), 6);
  Dev<float> d_wte(wte), d_wpe(wpe), d_out(N * C), d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
  Dev<int32_t> d_inp(inp);
  cpu::encoder_forward(pool, out.data(), inp.data(), wte.data(), wpe.data(), B, Tn, C);
  gpu::encoder_forward(d_out.get(), d_inp.get(), d_wte.get(), d_wpe.get(), B, Tn, C, nullptr);
  expect_close(d_out.download(), out, kFp32Tol, "encoder_forward");
  cpu::encoder_backward(pool, dwte.data(), dwpe.data(), dout.data(), inp.data(), B, Tn, C);
  gpu::TokenRows tr;
  gpu::token_rows(inp.data(), N, tr);
  Dev<int32_t> d_rows(tr.rows), d_tokens(tr.tokens), d_starts(tr.starts);
  gpu::encoder_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_rows.get(), d_tokens.get(), d_starts.get(),
                        tr.tokens.size(), B, Tn, C, nullptr);
  // each token's rows added in row order, as the CPU loop does: the same bits
  expect_close(d_dwte.download(), dwte, 0, "encoder_backward dwte");
  expect_close(d_dwpe.download(), dwpe, kFp32Tol, "encoder_backward dwpe");
}

TEST_CASE("layernorm forward and backward") {
  skip_without_gpu();
  ThreadPool pool(2);
  const size_t rows = 200;  // more than one chunk of kLayernormRowsPerChunk, last one partial
  auto inp = random_vec(rows * C, 10, -2.0f, 3.0f), w = random_vec(C, 11), b = random_vec(C, 12);
  auto dout = random_vec(rows * C, 13);
  std::vector<float> out(rows * C), mean(rows), rstd(rows);
  auto dinp = random_vec(rows * C, 14), dw = random_vec(C, 15), db = random_vec(C, 16);
  Dev<float> d_inp(inp), d_w(w), d_b(b), d_out(rows * C), d_mean(rows), d_rstd(rows), d_dout(dout), d_dinp(dinp),
      d_dw(dw), d_db(db), d_scratch(gpu::layernorm_backward_plan(rows, C).scratch_floats);
  cpu::layernorm_forward(pool, out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), rows, C);
  gpu::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), d_b.get(), rows, C, nullptr);
  expect_close(d_out.download(), out, kFp32Tol, "layernorm_forward out");
  expect_close(d_mean.download(), mean, kFp32Tol, "layernorm_forward mean");
  expect_close(d_rstd.download(), rstd, kFp32Tol, "layernorm_forward rstd");
  cpu::layernorm_backward(pool, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                          rstd.data(), rows, C);
  gpu::layernorm_backward(d_dinp.get(), d_dw.get(), d_db.get(), d_scratch.get(), d_dout.get(), d_inp.get(), d_w.get(),
                          d_mean.get(), d_rstd.get(), rows, C, nullptr);
  expect_close(d_dinp.download(), dinp, kFp32Tol, "layernorm_backward dinp");
  expect_close(d_dw.download(), dw, kFp32Tol, "layernorm_backward dw");
  expect_close(d_db.download(), db, kFp32Tol, "layernorm_backward db");
}

TEST_CASE("fused residual + layernorm equals residual_forward then layernorm_forward") {
  skip_without_gpu();
  ThreadPool pool(2);
  const size_t rows = 77;
  auto a = random_vec(rows * C, 17), b = random_vec(rows * C, 18, -2.0f, 2.0f), w = random_vec(C, 19);
  auto bias = random_vec(C, 22);
  std::vector<float> res(rows * C), out(rows * C), mean(rows), rstd(rows);
  cpu::residual_forward(pool, res.data(), a.data(), b.data(), rows * C);
  cpu::layernorm_forward(pool, out.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), rows, C);
  Dev<float> d_a(a), d_b(b), d_w(w), d_bias(bias), d_res(rows * C), d_out(rows * C), d_mean(rows), d_rstd(rows);
  gpu::residual_layernorm_forward(d_res.get(), d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(), d_b.get(), d_w.get(),
                                  d_bias.get(), rows, C, nullptr);
  expect_close(d_res.download(), res, kFp32Tol, "residual_layernorm_forward residual");
  expect_close(d_out.download(), out, kFp32Tol, "residual_layernorm_forward out");
  expect_close(d_mean.download(), mean, kFp32Tol, "residual_layernorm_forward mean");
  expect_close(d_rstd.download(), rstd, kFp32Tol, "residual_layernorm_forward rstd");
}

TEST_CASE("causal attention forward and backward") {
  skip_without_gpu();
  ThreadPool pool(2);
  const gpu::AttentionPlan plan = gpu::attention_plan(B, Tn, C, NH);
  auto qkv = random_vec(N * 3 * C, 20), dout = random_vec(N * C, 21);
  std::vector<float> out(N * C), att(static_cast<size_t>(B) * NH * Tn * Tn), dqkv(N * 3 * C);
  std::vector<float> scratch(static_cast<size_t>(pool.size()) * Tn * Tn);
  Dev<float> d_qkv(qkv), d_out(N * C), d_lse(plan.lse_floats), d_dout(dout), d_dqkv(N * 3 * C),
      d_scratch(plan.scratch_floats);
  cpu::attention_forward(pool, out.data(), att.data(), qkv.data(), B, Tn, C, NH);
  gpu::attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), B, Tn, C, NH, nullptr);
  expect_close(d_out.download(), out, kFp32Tol, "attention_forward out");
  // lse against the CPU's probabilities: att[t, t] = exp(score[t,t] - lse[t]).
  const auto lse = d_lse.download();
  const int hs = C / NH;
  std::vector<float> want_diag, got_diag;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < Tn; ++t) {
        const float* q = qkv.data() + (static_cast<size_t>(b) * Tn + t) * 3 * C + h * hs;
        double score = 0;
        for (int d = 0; d < hs; ++d) score += static_cast<double>(q[d]) * q[C + d];
        score /= std::sqrt(static_cast<double>(hs));
        const size_t r = (static_cast<size_t>(b) * NH + h) * Tn + t;
        want_diag.push_back(att[r * Tn + t]);
        got_diag.push_back(static_cast<float>(std::exp(score - lse[r])));
      }
  expect_close(got_diag, want_diag, 1e-4, "attention_forward lse (via the softmax diagonal)");
  cpu::attention_backward(pool, dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, Tn, C, NH);
  gpu::attention_backward(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(), B, Tn, C,
                          NH, nullptr);
  expect_close(d_dqkv.download(), dqkv, kFp32Tol, "attention_backward dqkv");
}

TEST_CASE("GELU, residual, bias backward, bf16 conversion") {
  skip_without_gpu();
  ThreadPool pool(2);
  const size_t n = 10007;
  auto x = random_vec(n, 30, -4.0f, 4.0f), y = random_vec(n, 31), dout = random_vec(n, 32);
  std::vector<float> out(n), dinp(n);
  Dev<float> d_x(x), d_y(y), d_out(n), d_dout(dout), d_dinp(n);
  cpu::gelu_forward(pool, out.data(), x.data(), n);
  gpu::gelu_forward(d_out.get(), d_x.get(), n, nullptr);
  expect_close(d_out.download(), out, kFp32Tol, "gelu_forward");
  cpu::gelu_backward(pool, dinp.data(), x.data(), dout.data(), n);
  gpu::gelu_backward(d_dinp.get(), d_x.get(), d_dout.get(), n, nullptr);
  expect_close(d_dinp.download(), dinp, kFp32Tol, "gelu_backward");
  cpu::residual_forward(pool, out.data(), x.data(), y.data(), n);
  gpu::residual_forward(d_out.get(), d_x.get(), d_y.get(), n, nullptr);
  expect_close(d_out.download(), out, kFp32Tol, "residual_forward");

  const int OC = 77;        // two full blocks of 32 columns and a partial one
  const size_t rows = 130;  // not a multiple of the 16 row lanes
  auto g = random_vec(rows * OC, 33), dbias = random_vec(OC, 34);
  Dev<float> d_g(g), d_dbias(dbias);
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < OC; ++c) dbias[c] += g[r * OC + c];
  gpu::bias_backward(d_dbias.get(), d_g.get(), rows, OC, nullptr);
  expect_close(d_dbias.download(), dbias, kFp32Tol, "bias_backward");

  Dev<gpu::bf16> d_b16 = to_device_bf16(x);
  std::vector<uint16_t> bits(n);
  RAILYARD_CUDA_CHECK(cudaMemcpy(bits.data(), d_b16.get(), n * 2, cudaMemcpyDeviceToHost));
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) mismatches += bits[i] != railyard::worker::comm::float_to_bf16(x[i]);
  CHECK(mismatches == 0);
}

TEST_CASE("cross entropy forward and fused backward") {
  skip_without_gpu();
  ThreadPool pool(2);
  auto logits = random_vec(N * Vp, 40, -5.0f, 5.0f);
  auto targets = random_tokens(N, V, 41);
  std::vector<float> losses(N), losses2(N);
  Dev<float> d_logits(logits), d_losses(N);
  Dev<int32_t> d_targets(targets);
  cpu::crossentropy_forward(pool, losses.data(), logits.data(), targets.data(), N, V, Vp);
  gpu::crossentropy_forward(d_losses.get(), d_logits.get(), d_targets.get(), N, V, Vp, nullptr);
  expect_close(d_losses.download(), losses, kFp32Tol, "crossentropy_forward");
  expect_close(d_logits.download(), logits, 0.0, "crossentropy_forward leaves logits untouched");
  const float dloss = 1.0f / static_cast<float>(N);
  cpu::crossentropy_fused_backward(pool, losses2.data(), logits.data(), targets.data(), N, V, Vp, dloss);
  gpu::crossentropy_fused_backward(d_losses.get(), d_logits.get(), d_targets.get(), N, V, Vp, dloss, nullptr);
  expect_close(d_losses.download(), losses2, kFp32Tol, "crossentropy_fused_backward losses");
  expect_close(d_logits.download(), logits, kFp32Tol, "crossentropy_fused_backward dlogits");
}

TEST_CASE("AdamW with fp32 master weights") {
  skip_without_gpu();
  const size_t n = 5003;
  auto p = random_vec(n, 50), g = random_vec(n, 51), m = random_vec(n, 52, -0.1f, 0.1f),
       v = random_vec(n, 53, 0, 0.01f);
  Dev<float> d_p(p), d_g(g), d_m(m), d_v(v);
  Dev<gpu::bf16> d_pb(n);
  const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, scale = 0.7f;
  for (int64_t t = 1; t <= 3; ++t) {
    // The CPU optimizer's per-element arithmetic (worker/optim/adamw.cc), through the shared constants.
    const gpu::AdamWConstants k = gpu::adamw_constants(lr, b1, b2, wd, t);
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] * scale;
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      p[i] = p[i] * k.decay - k.step_size * m[i] / (std::sqrt(v[i]) / k.bc2_sqrt + eps);
    }
    gpu::adamw_update(d_p.get(), d_pb.get(), d_g.get(), d_m.get(), d_v.get(), n, lr, b1, b2, eps, wd, t, scale,
                      nullptr);
  }
  expect_close(d_p.download(), p, kFp32Tol, "adamw params");
  expect_close(d_m.download(), m, kFp32Tol, "adamw m");
  expect_close(d_v.download(), v, kFp32Tol, "adamw v");
  std::vector<uint16_t> bits(n);
  RAILYARD_CUDA_CHECK(cudaMemcpy(bits.data(), d_pb.get(), n * 2, cudaMemcpyDeviceToHost));
  const auto gp = d_p.download();
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i) mismatches += bits[i] != railyard::worker::comm::float_to_bf16(gp[i]);
  CHECK(mismatches == 0);
}

TEST_CASE("cuBLASLt matmul forward (bias, GELU+bias) and backward against the CPU in fp32 on bf16 operands") {
  skip_without_gpu();
  ThreadPool pool(2);
  gpu::BlasLt lt;
  const int IC = 96, OC = 136;
  const size_t rows = 90;
  auto inp = round_bf16(random_vec(rows * IC, 60)), w = round_bf16(random_vec(static_cast<size_t>(OC) * IC, 61));
  auto bias = random_vec(OC, 62);
  auto dout = round_bf16(random_vec(rows * OC, 63));
  Dev<gpu::bf16> d_inp = to_device_bf16(inp), d_w = to_device_bf16(w), d_dout_b = to_device_bf16(dout);
  Dev<float> d_bias(bias), d_out(rows * OC), d_dout(dout);

  std::vector<float> out(rows * OC);
  cpu::matmul_forward(pool, out.data(), inp.data(), w.data(), bias.data(), rows, IC, OC);
  gpu::matmul_forward(lt, d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), rows, IC, OC, false, nullptr);
  expect_close(d_out.download(), out, kBf16Tol, "matmul_forward + bias");
  std::vector<float> act(out.size());
  cpu::gelu_forward(pool, act.data(), out.data(), out.size());
  gpu::matmul_forward(lt, d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), rows, IC, OC, true, nullptr);
  expect_close(d_out.download(), act, kBf16Tol, "matmul_forward + GELU_BIAS epilogue");
  Dev<float> d_pre(rows * OC);
  gpu::matmul_forward(lt, d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), rows, IC, OC, true, nullptr, d_pre.get());
  expect_close(d_out.download(), act, kBf16Tol, "matmul_forward + GELU_AUX_BIAS epilogue: output");
  expect_close(d_pre.download(), out, kBf16Tol, "matmul_forward + GELU_AUX_BIAS epilogue: pre-activation");

  std::vector<float> dinp = random_vec(rows * IC, 64), dw = random_vec(static_cast<size_t>(OC) * IC, 65),
                     dbias = random_vec(OC, 66);
  Dev<float> d_dinp(dinp), d_dw(dw), d_dbias(dbias);
  cpu::matmul_backward(pool, dinp.data(), true, dw.data(), dbias.data(), dout.data(), inp.data(), w.data(), rows, IC,
                       OC, true);
  gpu::matmul_backward(lt, d_dinp.get(), true, d_dw.get(), d_dbias.get(), d_dout_b.get(), d_dout.get(), d_inp.get(),
                       d_w.get(), rows, IC, OC, true, nullptr);
  expect_close(d_dinp.download(), dinp, kBf16Tol, "matmul_backward dinp (accumulate)");
  expect_close(d_dw.download(), dw, kBf16Tol, "matmul_backward dw (accumulate)");
  expect_close(d_dbias.download(), dbias, kFp32Tol, "matmul_backward dbias");
}
