// The mixture-of-experts kernels of the device interface (the moe_* functions of worker/device/kernels.h): CudaKernels
// against CpuKernels<float> (worker/kernels/cpu/moe.cc, what the CPU trainer runs on every CI run), kernel by kernel,
// then a whole Gpt<float> with experts on each device. GPU hosts only: exits 77 without a GPU (a CTest skip).
// Tolerances: copies and single products are exact; sums 1e-5 elementwise against |cpu| + mean |cpu| (the GPU fuses
// multiply-adds and sums a warp's lanes in another order). The whole model: its router GEMM runs in bf16 on CUDA, so
// a token whose two best experts are within bf16 rounding may pick another expert; the bounds (loss 2e-2, gradients
// 1e-1 relative L2) are set a priori from that, not observed on a GPU yet.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "tests/unit/worker_cuda/gpt_on_both.h"
#include "tests/unit/worker_cuda/parity_util.h"
#include "worker/device/cpu_kernels.h"
#include "worker/kernels/cuda/cuda_device.h"
#include "worker/model/gpt.h"
#include "worker/model/moe_math.h"
#include "worker/optim/adamw.h"

using namespace railyard::worker;
using namespace railyard::worker::testing;

namespace {

constexpr size_t N = 90, E = 6, K = 2, C = 96, kCap = 24;  // capacity 24 of the 30 rows per expert on average
constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE("MoE kernels: CudaKernels against CpuKernels<float> (route, gather, gates, combine, router backward)") {
  skip_without_gpu();
  ThreadPool pool(2);
  CpuKernels<float> c(pool);
  cuda::CudaKernels g;
  Both<float> probs(c, g, rnd(N * E, 41));
  Both<int32_t> choice(c, g, std::vector<int32_t>(N * K, -7));
  c.moe_route(probs.cpu.data(), choice.cpu.data(), N, E, K);
  g.moe_route(probs.gpu.data(), choice.gpu.data(), N, E, K);
  expect_close(probs.gpu_host(), probs.cpu_host(), kTol, "moe_route probs");
  CHECK(choice.gpu_host() == choice.cpu_host());  // random logits: no ties within rounding

  // the dispatch of the CPU's choices on the host, as the model does; both devices get its rows and tokens
  const std::vector<int32_t> ch = choice.cpu_host();
  std::vector<int32_t> row(N * K), count(E), token(E * kCap);
  const size_t dropped = moe::dispatch(ch.data(), N, K, E, kCap, nullptr, row.data(), count.data(), token.data());
  CHECK(dropped > 0);  // some choices over capacity: the -1 rows are exercised
  const std::vector<float> p = probs.cpu_host();
  Both<float> probs2(c, g, p), x(c, g, rnd(N * C, 42)), y(c, g, rnd(E * kCap * C, 43));
  Both<int32_t> choice2(c, g, ch), rows(c, g, row), toks(c, g, token);

  for (size_t e = 0; e < E; ++e) {
    const size_t n = count[e];
    Both<float> xe(c, g, std::vector<float>(n * C)), dy(c, g, std::vector<float>(n * C));
    c.moe_gather_rows(xe.cpu.data(), x.cpu.data(), toks.cpu.data() + e * kCap, n, C);
    g.moe_gather_rows(xe.gpu.data(), x.gpu.data(), toks.gpu.data() + e * kCap, n, C);
    expect_close(xe.gpu_host(), xe.cpu_host(), 0, "moe_gather_rows");  // copies: exact
    c.moe_gate_rows(dy.cpu.data(), x.cpu.data(), probs2.cpu.data(), toks.cpu.data() + e * kCap, e, E, n, C);
    g.moe_gate_rows(dy.gpu.data(), x.gpu.data(), probs2.gpu.data(), toks.gpu.data() + e * kCap, e, E, n, C);
    expect_close(dy.gpu_host(), dy.cpu_host(), 0, "moe_gate_rows");  // one product per element: exact
  }

  Both<float> out(c, g, rnd(N * C, 44));
  c.moe_combine(out.cpu.data(), probs2.cpu.data(), choice2.cpu.data(), rows.cpu.data(), y.cpu.data(), N, E, K, C);
  g.moe_combine(out.gpu.data(), probs2.gpu.data(), choice2.gpu.data(), rows.gpu.data(), y.gpu.data(), N, E, K, C);
  expect_close(out.gpu_host(), out.cpu_host(), kTol, "moe_combine");

  const std::vector<double> f = moe::choice_shares(ch.data(), N, K, E);
  const MoeConfig mc = make_moe_config(static_cast<int>(E), static_cast<int>(K), 1.0, 0.01);
  Both<float> aux(c, g, moe::aux_grads<float>(f, static_cast<double>(N), mc)), dout(c, g, rnd(N * C, 45));
  Both<float> dprobs(c, g, rnd(N * E, 46));
  c.moe_router_backward(dprobs.cpu.data(), probs2.cpu.data(), choice2.cpu.data(), rows.cpu.data(), y.cpu.data(),
                        dout.cpu.data(), aux.cpu.data(), 0.5f, N, E, K, C);
  g.moe_router_backward(dprobs.gpu.data(), probs2.gpu.data(), choice2.gpu.data(), rows.gpu.data(), y.gpu.data(),
                        dout.gpu.data(), aux.gpu.data(), 0.5f, N, E, K, C);
  expect_close(dprobs.gpu_host(), dprobs.cpu_host(), kTol, "moe_router_backward");

  Both<float> dx(c, g, rnd(N * C, 47));
  c.moe_combine_input_grads(dx.cpu.data(), rows.cpu.data(), y.cpu.data(), N, K, C);
  g.moe_combine_input_grads(dx.gpu.data(), rows.gpu.data(), y.gpu.data(), N, K, C);
  expect_close(dx.gpu_host(), dx.cpu_host(), 0, "moe_combine_input_grads");  // k adds in choice order: exact
}

TEST_CASE("a Gpt<float> with experts on CUDA against the CPU: forward/backward, then three steps") {
  skip_without_gpu();
  constexpr int B = 2, Tn = 45, NH = 3, V = 301;
  GptConfig moe_cfg = make_gpt_config(2, static_cast<int>(C), NH, 64, V);
  moe_cfg.moe = make_moe_config(4, 2, 1.25, 0.01);
  GptOnBoth both(moe_cfg, B, Tn, /*seed=*/9);
  auto& [pool, g, cfg, on_cpu, on_gpu] = both;
  AdamW opt_cpu(cfg, AdamWHyper{}, pool), opt_gpu(cfg, AdamWHyper{}, pool, &g);
  const auto in = tokens(B * Tn, V, 50), tg = tokens(B * Tn, V, 51);
  std::vector<float> losses_gpu;
  for (int step = 0; step < 3; ++step) {
    const float l_cpu = on_cpu.forward(in.data(), tg.data(), Gpt<float>::Mode::kTrain);
    const float l_gpu = on_gpu.forward(in.data(), tg.data(), Gpt<float>::Mode::kTrain);
    INFO("step " << step << ": loss cpu " << l_cpu << " cuda " << l_gpu);
    CHECK(std::fabs(l_gpu - l_cpu) <= 2e-2 * std::fabs(l_cpu));
    CHECK(on_gpu.moe_stats().assignments == on_cpu.moe_stats().assignments);
    on_cpu.backward(false);
    on_gpu.backward(false);
    if (step == 0) {
      const size_t P = on_cpu.num_params();
      const std::vector<float> g_gpu = both.gpu_grads();
      const double err = rel_l2(g_gpu.data(), on_cpu.grads(), P);
      INFO("gradient relative L2 error " << err);
      CHECK(err <= 1e-1);
      // the router's own gradient: nonzero on both, and close
      const size_t r0 = router_offset(cfg), rn = router_size(cfg);
      CHECK(rel_l2(g_gpu.data() + r0, on_cpu.grads() + r0, rn) <= 1e-1);
    }
    opt_cpu.update(on_cpu.params(), on_cpu.grads(), 1e-2f, 1.0f);
    opt_gpu.update(on_gpu.params(), on_gpu.grads(), 1e-2f, 1.0f);
    losses_gpu.push_back(l_gpu);
  }
  CHECK(losses_gpu.back() < losses_gpu.front());  // it trains on the GPU
}

TEST_CASE("expert parallelism on CUDA is refused naming --ep and the fix") {
  skip_without_gpu();
  ThreadPool pool(2);
  cuda::CudaKernels g;
  GptConfig cfg = make_gpt_config(2, static_cast<int>(C), 3, 64, 301);
  cfg.moe = make_moe_config(4, 2, 1.25, 0.01);
  CHECK_THROWS_WITH_AS(Gpt<float>(expert_shard_config(cfg, 2, 0), 2, 45, pool, {}, &g), doctest::Contains("--ep 1"),
                       railyard::ConfigError);
}
