// The device interface (worker/device/kernels.h): its CUDA implementation (CudaKernels) against the CPU one
// (CpuKernels<float>, the very object the CPU trainer runs on every CI run), through the same virtual signatures:
// kernel by kernel, then a whole Gpt<float> forward/backward and AdamW step on each device. GPU hosts only: without a
// usable GPU the binary exits 77 (a CTest skip), as test_parity.cc does.
//
// Tolerances: kernels as test_parity.cc (fp32 1e-5 elementwise against |cpu| + mean |cpu|; GEMMs 1e-3 on operands
// already rounded to bf16, since CudaKernels rounds fp32 operands to bf16 itself). The whole model (bf16 GEMMs in
// every layer) is compared by relative L2 error: loss 1e-2, gradients 5e-2, parameters after one AdamW step 1e-2.
// These model-level bounds are set from the bf16 rounding (2^-8) and not yet observed on a GPU: if the first GPU run
// shows a larger but systematic-free error, revisit them with the numbers, do not just widen them.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/unit/worker_cuda/gpt_on_both.h"
#include "tests/unit/worker_cuda/parity_util.h"
#include "worker/comm/bf16.h"
#include "worker/device/cpu_kernels.h"
#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/cuda_device.h"
#include "worker/model/gpt.h"
#include "worker/optim/adamw.h"

using namespace railyard::worker;
using namespace railyard::worker::testing;

namespace {

constexpr int B = 2, Tn = 45, C = 96, NH = 3, V = 301, Vp = 320;
constexpr size_t N = static_cast<size_t>(B) * Tn;
constexpr double kFp32Tol = 1e-5, kBf16Tol = 1e-3;

}  // namespace

TEST_CASE("device interface: CudaKernels against CpuKernels<float>, kernel by kernel") {
  skip_without_gpu();
  ThreadPool pool(2);
  CpuKernels<float> c(pool);
  cuda::CudaKernels g;
  CHECK(g.kind() == DeviceKind::kCuda);
  CHECK_FALSE(g.host_accessible());

  // layernorm forward + backward (CUDA's scratch sized by the implementation)
  Both<float> inp(c, g, rnd(N * C, 1)), w(c, g, rnd(C, 2)), bias(c, g, rnd(C, 3)), out(c, g, std::vector<float>(N * C));
  Both<float> mean(c, g, std::vector<float>(N)), rstd(c, g, std::vector<float>(N));
  c.layernorm_forward(out.cpu.data(), mean.cpu.data(), rstd.cpu.data(), inp.cpu.data(), w.cpu.data(), bias.cpu.data(),
                      N, C);
  g.layernorm_forward(out.gpu.data(), mean.gpu.data(), rstd.gpu.data(), inp.gpu.data(), w.gpu.data(), bias.gpu.data(),
                      N, C);
  expect_close(out.gpu_host(), out.cpu_host(), kFp32Tol, "layernorm_forward");
  Both<float> dout(c, g, rnd(N * C, 4)), dinp(c, g, rnd(N * C, 5)), dw(c, g, rnd(C, 6)), db(c, g, rnd(C, 7));
  Both<float> scratch(c, g, std::vector<float>(std::max<size_t>(1, g.layernorm_scratch_elems(N, C))));
  c.layernorm_backward(dinp.cpu.data(), dw.cpu.data(), db.cpu.data(), scratch.cpu.data(), dout.cpu.data(),
                       inp.cpu.data(), w.cpu.data(), mean.cpu.data(), rstd.cpu.data(), N, C);
  g.layernorm_backward(dinp.gpu.data(), dw.gpu.data(), db.gpu.data(), scratch.gpu.data(), dout.gpu.data(),
                       inp.gpu.data(), w.gpu.data(), mean.gpu.data(), rstd.gpu.data(), N, C);
  expect_close(dinp.gpu_host(), dinp.cpu_host(), kFp32Tol, "layernorm_backward dinp");
  expect_close(dw.gpu_host(), dw.cpu_host(), kFp32Tol, "layernorm_backward dw");

  // GEMMs on bf16-representable operands: only the accumulation order differs
  const int IC = C, OC = 3 * C;
  Both<float> x(c, g, rnd(N * IC, 8, true)), wt(c, g, rnd(static_cast<size_t>(OC) * IC, 9, true));
  Both<float> bo(c, g, rnd(OC, 10)), y(c, g, std::vector<float>(N * OC));
  c.matmul_forward(y.cpu.data(), x.cpu.data(), wt.cpu.data(), bo.cpu.data(), N, IC, OC);
  g.matmul_forward(y.gpu.data(), x.gpu.data(), wt.gpu.data(), bo.gpu.data(), N, IC, OC);
  expect_close(y.gpu_host(), y.cpu_host(), kBf16Tol, "matmul_forward");
  Both<float> dy(c, g, rnd(N * OC, 11, true)), dx(c, g, rnd(N * IC, 12)), dwt(c, g, rnd(wt.cpu.size(), 13));
  Both<float> dbo(c, g, rnd(OC, 14));
  c.matmul_backward(dx.cpu.data(), true, dwt.cpu.data(), dbo.cpu.data(), dy.cpu.data(), x.cpu.data(), wt.cpu.data(), N,
                    IC, OC, true);
  g.matmul_backward(dx.gpu.data(), true, dwt.gpu.data(), dbo.gpu.data(), dy.gpu.data(), x.gpu.data(), wt.gpu.data(), N,
                    IC, OC, true);
  expect_close(dx.gpu_host(), dx.cpu_host(), kBf16Tol, "matmul_backward dinp");
  expect_close(dwt.gpu_host(), dwt.cpu_host(), kBf16Tol, "matmul_backward dw");
  expect_close(dbo.gpu_host(), dbo.cpu_host(), kFp32Tol, "matmul_backward dbias");

  // attention: each device sizes its own saved state and scratch
  Both<float> qkv(c, g, rnd(N * 3 * C, 15)), att_out(c, g, std::vector<float>(N * C));
  DeviceBuffer<float> saved_c(c, c.attention_saved_elems(B, Tn, C, NH)),
      saved_g(g, g.attention_saved_elems(B, Tn, C, NH));
  DeviceBuffer<float> scr_c(c, c.attention_scratch_elems(B, Tn, C, NH)),
      scr_g(g, g.attention_scratch_elems(B, Tn, C, NH));
  c.attention_forward(att_out.cpu.data(), saved_c.data(), qkv.cpu.data(), B, Tn, C, NH);
  g.attention_forward(att_out.gpu.data(), saved_g.data(), qkv.gpu.data(), B, Tn, C, NH);
  expect_close(att_out.gpu_host(), att_out.cpu_host(), kFp32Tol, "attention_forward");
  Both<float> datt(c, g, rnd(N * C, 16)), dqkv(c, g, std::vector<float>(N * 3 * C));
  c.attention_backward(dqkv.cpu.data(), scr_c.data(), datt.cpu.data(), qkv.cpu.data(), att_out.cpu.data(),
                       saved_c.data(), B, Tn, C, NH);
  g.attention_backward(dqkv.gpu.data(), scr_g.data(), datt.gpu.data(), qkv.gpu.data(), att_out.gpu.data(),
                       saved_g.data(), B, Tn, C, NH);
  expect_close(dqkv.gpu_host(), dqkv.cpu_host(), kFp32Tol, "attention_backward");

  // fused cross entropy
  const auto tg = tokens(N, V, 17);
  Both<int32_t> targets(c, g, tg);
  Both<float> logits(c, g, rnd(N * Vp, 18)), losses(c, g, std::vector<float>(N));
  c.crossentropy_fused_backward(losses.cpu.data(), logits.cpu.data(), targets.cpu.data(), N, V, Vp, 0.5f);
  g.crossentropy_fused_backward(losses.gpu.data(), logits.gpu.data(), targets.gpu.data(), N, V, Vp, 0.5f);
  expect_close(losses.gpu_host(), losses.cpu_host(), kFp32Tol, "crossentropy losses");
  expect_close(logits.gpu_host(), logits.cpu_host(), kFp32Tol, "crossentropy dlogits");

  // AdamW and the global norm
  const size_t n = 70000;  // more than one norm chunk
  Both<float> p(c, g, rnd(n, 19)), gr(c, g, rnd(n, 20)), m(c, g, rnd(n, 21)), v(c, g, std::vector<float>(n, 0.25f));
  CHECK(g.global_norm(gr.gpu.data(), n) == doctest::Approx(c.global_norm(gr.cpu.data(), n)).epsilon(1e-9));
  c.adamw_update(p.cpu.data(), gr.cpu.data(), m.cpu.data(), v.cpu.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7f);
  g.adamw_update(p.gpu.data(), gr.gpu.data(), m.gpu.data(), v.gpu.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.7f);
  expect_close(p.gpu_host(), p.cpu_host(), kFp32Tol, "adamw params");
  expect_close(m.gpu_host(), m.cpu_host(), kFp32Tol, "adamw m");
}

TEST_CASE("device interface: one Gpt<float> training step on CUDA against the CPU") {
  skip_without_gpu();
  GptOnBoth both(make_gpt_config(2, C, NH, 64, V), B, Tn, /*seed=*/7);
  auto& [pool, g, cfg, on_cpu, on_gpu] = both;
  const auto in = tokens(N, V, 30), tg = tokens(N, V, 31);
  const float l_cpu = on_cpu.forward(in.data(), tg.data(), Gpt<float>::Mode::kTrain);
  const float l_gpu = on_gpu.forward(in.data(), tg.data(), Gpt<float>::Mode::kTrain);
  CHECK(std::fabs(l_gpu - l_cpu) <= 1e-2 * std::fabs(l_cpu));
  on_cpu.backward(false);
  on_gpu.backward(false);
  const size_t P = on_cpu.num_params();
  const double grad_err = rel_l2(both.gpu_grads().data(), on_cpu.grads(), P);
  INFO("relative L2 error of the gradients: " << grad_err);
  CHECK(grad_err <= 5e-2);

  AdamW opt_cpu(cfg, AdamWHyper{}, pool), opt_gpu(cfg, AdamWHyper{}, pool, &g);
  const double norm_cpu = opt_cpu.global_norm(on_cpu.grads()), norm_gpu = opt_gpu.global_norm(on_gpu.grads());
  CHECK(std::fabs(norm_gpu - norm_cpu) <= 5e-2 * norm_cpu);
  opt_cpu.update(on_cpu.params(), on_cpu.grads(), 1e-3f, 1.0f);
  opt_gpu.update(on_gpu.params(), on_gpu.grads(), 1e-3f, 1.0f);
  std::vector<float> p_gpu(P);
  on_gpu.copy_params_to_host(p_gpu.data());
  CHECK(rel_l2(p_gpu.data(), on_cpu.params(), P) <= 1e-2);
}

TEST_CASE("device interface: fused forms against their CPU compositions, persistent bf16 weights") {
  skip_without_gpu();
  ThreadPool pool(2);
  CpuKernels<float> c(pool);
  cuda::CudaKernels g;

  // MLP up-projection + GELU: GELU_AUX_BIAS (OC = 4C, a multiple of 8) and the unfused fallback (OC = 100)
  for (const int OC : {4 * C, 100}) {
    INFO("OC = " << OC);
    Both<float> x(c, g, rnd(N * C, 40, true)), w(c, g, rnd(static_cast<size_t>(OC) * C, 41, true));
    Both<float> bias(c, g, rnd(OC, 42)), pre(c, g, std::vector<float>(N * OC)), out(c, g, std::vector<float>(N * OC));
    c.matmul_gelu_forward(out.cpu.data(), pre.cpu.data(), x.cpu.data(), w.cpu.data(), bias.cpu.data(), N, C, OC);
    g.matmul_gelu_forward(out.gpu.data(), pre.gpu.data(), x.gpu.data(), w.gpu.data(), bias.gpu.data(), N, C, OC);
    expect_close(pre.gpu_host(), pre.cpu_host(), kBf16Tol, "matmul_gelu_forward pre-activation");
    expect_close(out.gpu_host(), out.cpu_host(), kBf16Tol, "matmul_gelu_forward gelu");
  }

  // residual + layernorm in one kernel against residual_forward then layernorm_forward
  Both<float> a(c, g, rnd(N * C, 43)), b(c, g, rnd(N * C, 44)), lw(c, g, rnd(C, 45)), lb(c, g, rnd(C, 46));
  Both<float> res(c, g, std::vector<float>(N * C)), ln(c, g, std::vector<float>(N * C));
  Both<float> mean(c, g, std::vector<float>(N)), rstd(c, g, std::vector<float>(N));
  c.residual_layernorm_forward(res.cpu.data(), ln.cpu.data(), mean.cpu.data(), rstd.cpu.data(), a.cpu.data(),
                               b.cpu.data(), lw.cpu.data(), lb.cpu.data(), N, C);
  g.residual_layernorm_forward(res.gpu.data(), ln.gpu.data(), mean.gpu.data(), rstd.gpu.data(), a.gpu.data(),
                               b.gpu.data(), lw.gpu.data(), lb.gpu.data(), N, C);
  expect_close(res.gpu_host(), res.cpu_host(), 0.0, "residual_layernorm_forward residual");  // one add: exact
  expect_close(ln.gpu_host(), ln.cpu_host(), kFp32Tol, "residual_layernorm_forward out");
  expect_close(mean.gpu_host(), mean.cpu_host(), kFp32Tol, "residual_layernorm_forward mean");
  expect_close(rstd.gpu_host(), rstd.cpu_host(), kFp32Tol, "residual_layernorm_forward rstd");

  // Persistent weights: a GEMM reading the bf16 copy equals one converting an outside buffer with the same fp32
  // values (the same bf16 operands; 1e-5 allows cuBLASLt another algorithm for another alignment, while a stale copy
  // is off by the AdamW step, ~1e-2) after set_weights, after an AdamW pass over the range and after a to_device.
  const int IC = C, OC = 3 * C;
  const size_t nw = static_cast<size_t>(OC) * IC, lead = 64;  // the weight at offset 64 (128 bytes of bf16)
  DeviceBuffer<float> params(g, lead + nw), outside(g, nw), x(g, N * IC), y1(g, N * OC), y2(g, N * OC);
  std::vector<float> host = rnd(lead + nw, 47), xs = rnd(N * IC, 48);
  g.to_device(params.data(), host.data(), host.size() * sizeof(float));
  g.to_device(x.data(), xs.data(), xs.size() * sizeof(float));
  g.set_weights(params.data(), params.size());
  const float* w = params.data() + lead;
  CHECK(g.weight_copy(w, nw) != nullptr);
  CHECK(g.weight_copy(params.data() + 1, 8) == nullptr);  // misaligned: converted per GEMM
  auto same_as_outside = [&](const char* what) {
    std::vector<float> cur(nw), r1(N * OC), r2(N * OC);
    g.to_host(cur.data(), w, nw * sizeof(float));
    g.to_device(outside.data(), cur.data(), nw * sizeof(float));
    g.matmul_forward(y1.data(), x.data(), w, nullptr, N, IC, OC);
    g.matmul_forward(y2.data(), x.data(), outside.data(), nullptr, N, IC, OC);
    g.to_host(r1.data(), y1.data(), r1.size() * sizeof(float));
    g.to_host(r2.data(), y2.data(), r2.size() * sizeof(float));
    expect_close(r1, r2, kFp32Tol, what);
  };
  same_as_outside("after set_weights");
  DeviceBuffer<float> gr(g, lead + nw), m(g, lead + nw), v(g, lead + nw);
  const std::vector<float> grads = rnd(lead + nw, 49);
  g.to_device(gr.data(), grads.data(), grads.size() * sizeof(float));
  g.adamw_update(params.data(), gr.data(), m.data(), v.data(), params.size(), 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
  same_as_outside("after adamw_update");
  const std::vector<float> fresh = rnd(nw, 50);
  g.to_device(params.data() + lead, fresh.data(), nw * sizeof(float));
  same_as_outside("after to_device into the weights");
  params = DeviceBuffer<float>();  // free(params) drops the copy
  CHECK(g.weight_copy(outside.data(), nw) == nullptr);
}

TEST_CASE("device interface: three Gpt<float> steps on CUDA follow the CPU (bf16 weight copies kept current)") {
  skip_without_gpu();
  GptOnBoth both(make_gpt_config(2, C, NH, 64, V), B, Tn, /*seed=*/9);
  auto& [pool, g, cfg, on_cpu, on_gpu] = both;
  AdamW opt_cpu(cfg, AdamWHyper{}, pool), opt_gpu(cfg, AdamWHyper{}, pool, &g);
  const auto in = tokens(N, V, 32), tg = tokens(N, V, 33);
  for (int step = 0; step < 3; ++step) {
    const float l_cpu = on_cpu.forward(in.data(), tg.data(), Gpt<float>::Mode::kTrain);
    const float l_gpu = on_gpu.forward(in.data(), tg.data(), Gpt<float>::Mode::kTrain);
    INFO("step " << step << ": loss cpu " << l_cpu << " cuda " << l_gpu);
    // A stale bf16 copy would keep the CUDA loss at the step-0 value while the CPU's drops.
    CHECK(std::fabs(l_gpu - l_cpu) <= 1e-2 * std::fabs(l_cpu));
    on_cpu.backward(false);
    on_gpu.backward(false);
    opt_cpu.update(on_cpu.params(), on_cpu.grads(), 1e-2f, 1.0f);
    opt_gpu.update(on_gpu.params(), on_gpu.grads(), 1e-2f, 1.0f);
  }
}
