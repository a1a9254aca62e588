// The tensor/pipeline-parallel stage's kernels of the device interface (worker/device/kernels.h, the functions after
// global_norm): CudaKernels against CpuKernels<float> (worker/kernels/cpu/vocab_parallel.cc, what the CPU stage runs on
// every CI run), then one whole GptStage (tp = pp = 1: the vocab-parallel embedding and cross entropy over the full
// vocabulary, no communicator) forward/backward on each device. GPU hosts only: exits 77 without a GPU (a CTest skip).
// Tolerances as test_device_parity.cc: fp32 kernels 1e-5 elementwise against |cpu| + mean |cpu|; the stage (bf16 GEMMs
// in every layer) by relative L2 error, loss 1e-2 and gradients 5e-2, set a priori from bf16 rounding, not observed.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/unit/worker_cuda/parity_util.h"
#include "worker/device/cpu_kernels.h"
#include "worker/kernels/cuda/cuda_check.h"
#include "worker/kernels/cuda/cuda_device.h"
#include "worker/parallel/gpt_stage.h"

using namespace railyard::worker;
using namespace railyard::worker::testing;

namespace {

// A rank holding vocabulary rows [v0, v0 + Vl) = [160, 320) of V = 301: Vr = 141 real rows, the rest padding.
constexpr int B = 2, Tn = 45, C = 96, V = 301, v0 = 160, Vl = 160, Vr = 141;
constexpr size_t N = static_cast<size_t>(B) * Tn;
constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE(
    "stage kernels: CudaKernels against CpuKernels<float> (vocab-parallel embedding, cross entropy, accumulate, "
    "divide)") {
  skip_without_gpu();
  ThreadPool pool(2);
  CpuKernels<float> c(pool);
  cuda::CudaKernels g;
  Both<int32_t> tok(c, g, tokens(N, V, 1));
  Both<float> wte(c, g, rnd(static_cast<size_t>(Vl) * C, 2)), wpe(c, g, rnd(static_cast<size_t>(Tn) * C, 3));
  Both<float> emb(c, g, rnd(N * C, 4));
  c.vocab_embedding_forward(emb.cpu.data(), tok.cpu.data(), wte.cpu.data(), v0, Vl, N, C);
  g.vocab_embedding_forward(emb.gpu.data(), tok.gpu.data(), wte.gpu.data(), v0, Vl, N, C);
  expect_close(emb.gpu_host(), emb.cpu_host(), 0, "vocab_embedding_forward");  // a copy: exact
  c.add_positions_rows(emb.cpu.data(), wpe.cpu.data(), 7, N - 7, Tn, C);
  g.add_positions_rows(emb.gpu.data(), wpe.gpu.data(), 7, N - 7, Tn, C);
  expect_close(emb.gpu_host(), emb.cpu_host(), 0, "add_positions_rows");  // one add per element: exact
  Both<float> dwte(c, g, rnd(wte.cpu.size(), 5)), dwpe(c, g, rnd(wpe.cpu.size(), 6)), dout(c, g, rnd(N * C, 7));
  c.vocab_embedding_backward(dwte.cpu.data(), dwpe.cpu.data(), dout.cpu.data(), tok.cpu.data(), v0, Vl, B, Tn, C);
  g.vocab_embedding_backward(dwte.gpu.data(), dwpe.gpu.data(), dout.gpu.data(), tok.gpu.data(), v0, Vl, B, Tn, C);
  expect_close(dwte.gpu_host(), dwte.cpu_host(), 0, "vocab_embedding_backward dwte");  // the CPU's order per element
  expect_close(dwpe.gpu_host(), dwpe.cpu_host(), 0, "vocab_embedding_backward dwpe");

  Both<float> logits(c, g, rnd(N * Vl, 8)), mx(c, g, std::vector<float>(N)), sums(c, g, std::vector<float>(2 * N));
  Both<float> losses(c, g, std::vector<float>(N));
  Both<int32_t> tgt(c, g, tokens(N, V, 9));
  c.vocab_ce_local_max(mx.cpu.data(), logits.cpu.data(), N, Vl, Vr);
  g.vocab_ce_local_max(mx.gpu.data(), logits.gpu.data(), N, Vl, Vr);
  expect_close(mx.gpu_host(), mx.cpu_host(), 0, "vocab_ce_local_max");
  c.vocab_ce_local_sums(sums.cpu.data(), logits.cpu.data(), mx.cpu.data(), tgt.cpu.data(), v0, N, Vl, Vr);
  g.vocab_ce_local_sums(sums.gpu.data(), logits.gpu.data(), mx.gpu.data(), tgt.gpu.data(), v0, N, Vl, Vr);
  expect_close(sums.gpu_host(), sums.cpu_host(), kTol, "vocab_ce_local_sums sums");
  expect_close(logits.gpu_host(), logits.cpu_host(), kTol, "vocab_ce_local_sums exp");
  c.vocab_ce_finish(losses.cpu.data(), logits.cpu.data(), sums.cpu.data(), mx.cpu.data(), tgt.cpu.data(), v0, N, Vl, Vr,
                    0.25f);
  g.vocab_ce_finish(losses.gpu.data(), logits.gpu.data(), sums.gpu.data(), mx.gpu.data(), tgt.gpu.data(), v0, N, Vl, Vr,
                    0.25f);
  expect_close(losses.gpu_host(), losses.cpu_host(), kTol, "vocab_ce_finish losses");
  expect_close(logits.gpu_host(), logits.cpu_host(), kTol, "vocab_ce_finish dlogits");

  Both<float> acc(c, g, rnd(1000, 10)), add(c, g, rnd(1000, 11)), dst(c, g, std::vector<float>(1000));
  c.accumulate(acc.cpu.data(), add.cpu.data(), 1000);
  g.accumulate(acc.gpu.data(), add.gpu.data(), 1000);
  expect_close(acc.gpu_host(), acc.cpu_host(), 0, "accumulate");
  g.copy(dst.gpu.data(), acc.gpu.data(), 1000);
  expect_close(dst.gpu_host(), acc.cpu_host(), 0, "copy");
  // dp = 6: not a power of two, so a multiplication by 1/6 would differ from the CPU's division in some elements
  c.divide(acc.cpu.data(), 6.0f, 1000);
  g.divide(acc.gpu.data(), 6.0f, 1000);
  expect_close(acc.gpu_host(), acc.cpu_host(), 0, "divide");
}

TEST_CASE("one GptStage (tp = pp = 1) forward/backward on CUDA against the CPU") {
  skip_without_gpu();
  using namespace railyard::worker::parallel;
  ThreadPool pool(2);
  cuda::CudaKernels g;
  const GptConfig cfg = make_gpt_config(2, C, 3, 64, V);
  const StageShape shape = make_stage_shape(cfg, Tn, 1, 0, 1, 0, {});
  GptStage on_cpu(shape, B, Tn, 1, pool, nullptr), on_gpu(shape, B, Tn, 1, pool, nullptr, {}, false, nullptr, &g);
  std::vector<float> full(num_parameters(cfg));
  init_gpt2_weights(full.data(), cfg, 7, &pool);
  on_cpu.scatter_from_full(full.data());
  on_gpu.scatter_from_full(full.data());
  const auto in = tokens(N, V, 30), tg = tokens(N, V, 31);
  const double l_cpu = on_cpu.forward(0, in.data(), tg.data(), 1.0f);
  const double l_gpu = on_gpu.forward(0, in.data(), tg.data(), 1.0f);
  CHECK(std::fabs(l_gpu - l_cpu) <= 1e-2 * std::fabs(l_cpu));
  on_cpu.zero_grad();
  on_gpu.zero_grad();
  on_cpu.backward(0);
  on_gpu.backward(0);
  std::vector<float> g_cpu(num_parameters(cfg)), g_gpu(num_parameters(cfg));
  on_cpu.gather_into_full(on_cpu.grads(), g_cpu.data());
  on_gpu.gather_into_full(on_gpu.grads(), g_gpu.data());
  const double err = rel_l2(g_gpu, g_cpu);
  INFO("relative L2 error of the stage's gradients: " << err);
  CHECK(err <= 5e-2);
}

// Ring attention's kernels (context parallelism, appended to Kernels<T>): rank 1 of a cp=2 ring on one device, its own
// (diagonal) block then rank 0's (all visible), forward and backward, against the CPU twins. The fp32 tolerance of
// the other kernels: the CUDA twins sum each dot product over 32 lanes instead of in channel order.
TEST_CASE("ring attention kernels: CudaKernels against CpuKernels<float> (diagonal and earlier block, fwd and bwd)") {
  skip_without_gpu();
  ThreadPool pool(2);
  CpuKernels<float> c(pool);
  cuda::CudaKernels g;
  const int Bq = 2, Tc = 8, Cq = 64, NH = 2;  // head size 32
  const size_t qkvn = static_cast<size_t>(Bq) * Tc * 3 * Cq, kvn = static_cast<size_t>(Bq) * Tc * 2 * Cq;
  const size_t outn = static_cast<size_t>(Bq) * Tc * Cq, rows = static_cast<size_t>(Bq) * NH * Tc;
  Both<float> qkv(c, g, rnd(qkvn, 21)), other(c, g, rnd(kvn, 22)), kv(c, g, std::vector<float>(kvn));
  Both<float> out(c, g, rnd(outn, 23)), m(c, g, rnd(rows, 24)), l(c, g, rnd(rows, 25)), lse(c, g, rnd(rows, 26));
  c.ring_forward_begin(kv.cpu.data(), out.cpu.data(), m.cpu.data(), l.cpu.data(), qkv.cpu.data(), Bq, Tc, Cq, NH);
  g.ring_forward_begin(kv.gpu.data(), out.gpu.data(), m.gpu.data(), l.gpu.data(), qkv.gpu.data(), Bq, Tc, Cq, NH);
  expect_close(kv.gpu_host(), kv.cpu_host(), 0, "ring_forward_begin kv");  // copies: exact
  expect_close(out.gpu_host(), out.cpu_host(), 0, "ring_forward_begin out");
  for (const auto& [block, diag] : {std::pair{&kv, true}, std::pair{&other, false}}) {
    c.ring_forward_block(out.cpu.data(), m.cpu.data(), l.cpu.data(), qkv.cpu.data(), block->cpu.data(), Bq, Tc, Cq, NH,
                         diag);
    g.ring_forward_block(out.gpu.data(), m.gpu.data(), l.gpu.data(), qkv.gpu.data(), block->gpu.data(), Bq, Tc, Cq, NH,
                         diag);
    expect_close(m.gpu_host(), m.cpu_host(), kTol, diag ? "ring_forward_block m (diagonal)" : "ring_forward_block m");
    expect_close(l.gpu_host(), l.cpu_host(), kTol, diag ? "ring_forward_block l (diagonal)" : "ring_forward_block l");
  }
  c.ring_forward_end(out.cpu.data(), lse.cpu.data(), m.cpu.data(), l.cpu.data(), Bq, Tc, Cq, NH);
  g.ring_forward_end(out.gpu.data(), lse.gpu.data(), m.gpu.data(), l.gpu.data(), Bq, Tc, Cq, NH);
  expect_close(out.gpu_host(), out.cpu_host(), kTol, "ring_forward_end out");
  expect_close(lse.gpu_host(), lse.cpu_host(), kTol, "ring_forward_end lse");

  // backward from the CPU's forward results on both devices (each kernel checked on the same inputs)
  const std::vector<float> o = out.cpu_host(), s = lse.cpu_host();
  Both<float> out2(c, g, o), lse2(c, g, s), dout(c, g, rnd(outn, 27)), D(c, g, std::vector<float>(rows));
  Both<float> dqkv(c, g, rnd(qkvn, 28)), dkv(c, g, rnd(kvn, 29)), dother(c, g, std::vector<float>(kvn));
  c.ring_backward_begin(kv.cpu.data(), dkv.cpu.data(), dqkv.cpu.data(), D.cpu.data(), dout.cpu.data(), qkv.cpu.data(),
                        out2.cpu.data(), Bq, Tc, Cq, NH);
  g.ring_backward_begin(kv.gpu.data(), dkv.gpu.data(), dqkv.gpu.data(), D.gpu.data(), dout.gpu.data(), qkv.gpu.data(),
                        out2.gpu.data(), Bq, Tc, Cq, NH);
  expect_close(dqkv.gpu_host(), dqkv.cpu_host(), 0, "ring_backward_begin dqkv");
  expect_close(dkv.gpu_host(), dkv.cpu_host(), 0, "ring_backward_begin dkv");
  expect_close(D.gpu_host(), D.cpu_host(), kTol, "ring_backward_begin D");
  for (const auto& [block, grad, diag] : {std::tuple{&kv, &dkv, true}, std::tuple{&other, &dother, false}}) {
    c.ring_backward_block(dqkv.cpu.data(), grad->cpu.data(), dout.cpu.data(), qkv.cpu.data(), block->cpu.data(),
                          lse2.cpu.data(), D.cpu.data(), Bq, Tc, Cq, NH, diag);
    g.ring_backward_block(dqkv.gpu.data(), grad->gpu.data(), dout.gpu.data(), qkv.gpu.data(), block->gpu.data(),
                          lse2.gpu.data(), D.gpu.data(), Bq, Tc, Cq, NH, diag);
    expect_close(grad->gpu_host(), grad->cpu_host(), kTol, diag ? "ring_backward_block dkv (diagonal)" : "dkv");
  }
  expect_close(dqkv.gpu_host(), dqkv.cpu_host(), kTol, "ring_backward_block dq");
  c.ring_backward_end(dqkv.cpu.data(), dkv.cpu.data(), Bq, Tc, Cq);
  g.ring_backward_end(dqkv.gpu.data(), dkv.gpu.data(), Bq, Tc, Cq);
  expect_close(dqkv.gpu_host(), dqkv.cpu_host(), kTol, "ring_backward_end dqkv");
}
