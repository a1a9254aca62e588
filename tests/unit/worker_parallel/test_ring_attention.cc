// Context parallelism's ring attention (worker/parallel/ring_attention.h) over real Gloo sockets against the
// single-process CPU attention kernel on the whole sequence: cp = 1, 2, 4 ranks, each holding T/cp positions of every
// sequence; the outputs and d(qkv) of every position agree within 1e-5 relative (max-norm; the online softmax and the
// ring order of the d(keys)/d(values) sums round differently from the kernel's full-row softmax).
// The whole model with context parallelism (ParallelModel with a cp group): dp x cp = 1x2, 1x4, 2x2 ranks, gradients
// averaged over dp x cp, give the loss and every gradient of one process within 1e-5 relative.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "common/error.h"
#include "planner/calibration.h"
#include "planner/context_parallel.h"
#include "tests/unit/worker/planner_fixture.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/comm/process_groups.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/model/gpt.h"
#include "worker/parallel/parallel_model.h"
#include "worker/parallel/ring_attention.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

namespace {

constexpr int kB = 2, kT = 16, kC = 32, kNH = 4;

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return d / m;
}

}  // namespace

TEST_CASE("ring attention over cp = 1, 2, 4 ranks equals full causal attention, forward and backward") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);  // wide enough that the softmax is far from uniform
  std::vector<float> qkv(static_cast<size_t>(kB) * kT * 3 * kC), dout(static_cast<size_t>(kB) * kT * kC);
  for (float& x : qkv) x = u(rng);
  for (float& x : dout) x = u(rng);
  // reference: the kernel the model uses, on the whole sequence
  ThreadPool pool(1);
  std::vector<float> ref_out(dout.size()), att(static_cast<size_t>(kB) * kNH * kT * kT), scratch(kT * kT),
      ref_dqkv(qkv.size(), 0.0f);
  cpu::attention_forward(pool, ref_out.data(), att.data(), qkv.data(), kB, kT, kC, kNH);
  cpu::attention_backward(pool, ref_dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), kB, kT, kC, kNH);

  for (int cp : {1, 2, 4}) {
    CAPTURE(cp);
    const int Tc = kT / cp;
    std::vector<float> out(ref_out.size()), dqkv(qkv.size());
    std::vector<size_t> sent(cp);
    std::mutex mu;
    comm::run_local_world(cp, [&](comm::Communicator& world) {
      const int r = world.rank();
      ThreadPool p(1);
      // this rank's positions [r Tc, (r+1) Tc) of every sequence
      auto slice = [&](const std::vector<float>& full, int width) {
        std::vector<float> local(static_cast<size_t>(kB) * Tc * width);
        for (int b = 0; b < kB; ++b) {
          std::memcpy(local.data() + static_cast<size_t>(b) * Tc * width,
                      full.data() + (static_cast<size_t>(b) * kT + r * Tc) * width, Tc * width * sizeof(float));
        }
        return local;
      };
      const std::vector<float> lq = slice(qkv, 3 * kC), ld = slice(dout, kC);
      std::vector<float> lo(static_cast<size_t>(kB) * Tc * kC), lse(static_cast<size_t>(kB) * kNH * Tc), ldq(lq.size());
      RingAttention ring(cp == 1 ? nullptr : &world, kB, Tc, kC, kNH, p);
      ring.forward(lq.data(), lo.data(), lse.data());
      ring.backward(ld.data(), lq.data(), lo.data(), lse.data(), ldq.data());
      std::lock_guard<std::mutex> lock(mu);
      sent[r] = ring.forward_bytes_sent();
      for (int b = 0; b < kB; ++b) {
        std::memcpy(out.data() + (static_cast<size_t>(b) * kT + r * Tc) * kC,
                    lo.data() + static_cast<size_t>(b) * Tc * kC, Tc * kC * sizeof(float));
        std::memcpy(dqkv.data() + (static_cast<size_t>(b) * kT + r * Tc) * 3 * kC,
                    ldq.data() + static_cast<size_t>(b) * Tc * 3 * kC, Tc * 3 * kC * sizeof(float));
      }
    });
    CHECK(rel_err(out, ref_out) <= 1e-5);
    CHECK(rel_err(dqkv, ref_dqkv) <= 1e-5);
    // the ring moves every other block's keys and values once: (cp - 1) hops of B Tc 2C floats
    for (size_t s : sent) CHECK(s == static_cast<size_t>(cp - 1) * kB * Tc * 2 * kC * sizeof(float));
  }
}

TEST_CASE("ring attention: a wrong causal mask would be caught (the check can fail)") {
  // Attending to the future changes the output: the same comparison against a non-causal result fails.
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> qkv(static_cast<size_t>(kB) * kT * 3 * kC);
  for (float& x : qkv) x = u(rng);
  ThreadPool pool(1);
  std::vector<float> out(static_cast<size_t>(kB) * kT * kC), lse(static_cast<size_t>(kB) * kNH * kT);
  RingAttention ring(nullptr, kB, kT, kC, kNH, pool);
  ring.forward(qkv.data(), out.data(), lse.data());
  // row 0 attends only to itself: its output is exactly its own value vector
  for (int h = 0; h < kNH; ++h) {
    for (int c = 0; c < kC / kNH; ++c) CHECK(out[h * (kC / kNH) + c] == qkv[2 * kC + h * (kC / kNH) + c]);
  }
}

namespace {

const GptConfig kModel = make_gpt_config(/*L=*/4, /*C=*/32, /*NH=*/4, /*maxT=*/16, /*V=*/100);
constexpr int kMB = 2, kMT = 16;  // micro-batch (B, T): T = maxT so that every wpe row is used

struct Grads {
  double loss = 0;
  std::vector<float> grads;
};

// Every parameter tensor's gradient in `got` within 1e-5 of the largest element of that tensor in `ref`.
void check_tensors_close(const std::vector<float>& got, const std::vector<float>& ref) {
  const auto sizes = param_sizes(kModel);
  size_t off = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    CAPTURE(kParamNames[i]);
    double d = 0, m = 0;
    for (size_t k = off; k < off + sizes[i]; ++k) {
      d = std::max(d, std::fabs(double(got[k]) - double(ref[k])));
      m = std::max(m, std::fabs(double(ref[k])));
    }
    CHECK(d <= 1e-5 * m);
    off += sizes[i];
  }
}

}  // namespace

TEST_CASE("context parallel model: dp x cp = 1x2, 1x4, 2x2 equal one process (loss, every gradient)") {
  const int M = 2;
  for (auto [dp, cp] : {std::pair{1, 2}, {1, 4}, {2, 2}}) {
    CAPTURE(dp);
    CAPTURE(cp);
    const size_t N = static_cast<size_t>(kMB) * kMT;
    const testing::TokenData tokens = testing::random_tokens(M * dp, kMB, kMT, kModel.vocab_size, 3);
    const std::vector<int32_t>& in = tokens.in;
    const std::vector<int32_t>& tgt = tokens.tgt;
    const testing::AccumulatedGrads acc = testing::accumulate_grads(kModel, kMB, kMT, 42, tokens, M * dp);
    const Grads ref{acc.loss, acc.grads};
    Grads got;
    got.grads.assign(num_parameters(kModel), 0);
    std::vector<double> losses(static_cast<size_t>(dp * cp));
    std::vector<size_t> bytes(static_cast<size_t>(dp * cp)), expected(static_cast<size_t>(dp * cp));
    std::mutex mu;
    comm::run_local_world(dp * cp, [&](comm::Communicator& world) {
      const int replica = world.rank() / cp;
      std::vector<int> members;
      for (int i = 0; i < cp; ++i) members.push_back(replica * cp + i);
      auto cp_group = world.split(members, "cp");
      ThreadPool pool(1);
      ModelGroups groups;
      groups.cp = cp_group.get();
      ParallelModel model(kModel, kMB, kMT, M, pool, groups);
      model.init_weights(42);
      model.zero_grad();
      double loss = model.forward_backward(M, testing::micro_batches(in, tgt, replica * M, N), 1.0f / (M * dp * cp));
      // cp ranks hold different positions and dp ranks different sequences: both are summed like replicas
      world.all_reduce(model.grads(), model.num_params(), comm::DType::kFloat32, comm::ReduceOp::kSum);
      float l = static_cast<float>(loss);
      world.all_reduce(&l, 1, comm::DType::kFloat32, comm::ReduceOp::kSum);
      std::lock_guard<std::mutex> lock(mu);
      losses[static_cast<size_t>(world.rank())] = static_cast<double>(l) / (dp * cp);
      bytes[static_cast<size_t>(world.rank())] = model.activation_bytes();
      expected[static_cast<size_t>(world.rank())] =
          stage_activation_bytes(model.shape(), kMB, kMT, model.stage().slots(), pool.size(), {}, false, cp);
      if (world.rank() == 0) model.gather_into_full(model.grads(), got.grads.data());
    });
    for (double l : losses) CHECK(std::fabs(l - ref.loss) <= 1e-5 * ref.loss);
    CHECK(bytes == expected);
    CHECK(bytes[0] < stage_activation_bytes(make_stage_shape(kModel, kMT, 1, 0, 1, 0, {}), kMB, kMT, 1, 1));
    check_tensors_close(got.grads, ref.grads);
  }
}

TEST_CASE("context parallel with tensor or pipeline parallelism: tp=2 x cp=2 and pp=2 x cp=2 equal one process") {
  const int M = 2;
  const size_t N = static_cast<size_t>(kMB) * kMT;
  const testing::TokenData tokens = testing::random_tokens(M, kMB, kMT, kModel.vocab_size, 4);
  const std::vector<int32_t>& in = tokens.in;
  const std::vector<int32_t>& tgt = tokens.tgt;
  const testing::AccumulatedGrads acc = testing::accumulate_grads(kModel, kMB, kMT, 42, tokens, M);
  const Grads ref{acc.loss, acc.grads};
  for (auto [tp, pp] : {std::pair{2, 1}, {1, 2}}) {
    CAPTURE(tp);
    CAPTURE(pp);
    const int cp = 2;
    std::vector<float> grads(num_parameters(kModel), 0.0f);
    std::vector<double> losses(static_cast<size_t>(cp * tp * pp));
    std::mutex mu;
    comm::run_local_world(cp * tp * pp, [&](comm::Communicator& world) {
      // the process groups' dp group is the cp group here (dp x cp with dp = 1), as railyard-worker --cp builds it
      comm::ProcessGroups pg(world, comm::Layout{.dp = cp, .tp = tp, .pp = pp});
      ThreadPool pool(1);
      ModelGroups groups{&pg.tp(), &pg.pp(), pg.embedding(), &pg.dp()};
      ParallelModel model(kModel, kMB, kMT, M, pool, groups);
      model.init_weights(42);
      model.zero_grad();
      const double loss = model.forward_backward(M, testing::micro_batches(in, tgt, 0, N), 1.0f / (M * cp));
      model.finish_grads();
      pg.dp().all_reduce(model.grads(), model.num_params(), comm::DType::kFloat32, comm::ReduceOp::kSum);
      std::lock_guard<std::mutex> lock(mu);
      losses[static_cast<size_t>(world.rank())] = loss;
      if (pg.coord().dp != 0) return;
      std::vector<ShardSlice> primary;
      for (const ShardSlice& sl : model.shard_map()) {
        if (!sl.tied_copy) primary.push_back(sl);
      }
      copy_local_to_full(primary, kModel, model.grads(), grads.data());
    });
    for (double l : losses) CHECK(std::fabs(l - ref.loss) <= 1e-5 * ref.loss);
    check_tensors_close(grads, ref.grads);
  }
}

TEST_CASE("context parallel with full and selective recomputation: bitwise the stored-activation run") {
  // The recomputed forward reruns the ring (deterministic), so its outputs and log-sum-exps have the same bits.
  const int M = 2, cp = 2;
  const size_t N = static_cast<size_t>(kMB) * kMT;
  std::mt19937 rng(8);
  std::vector<int32_t> in(M * N), tgt(M * N);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<int32_t>(rng() % kModel.vocab_size);
    tgt[i] = static_cast<int32_t>(rng() % kModel.vocab_size);
  }
  auto run = [&](const RecomputeSpec& spec) {
    std::vector<float> grads;
    double loss0 = 0;
    std::mutex mu;
    comm::run_local_world(cp, [&](comm::Communicator& world) {
      ThreadPool pool(1);
      ModelGroups groups;
      groups.cp = &world;
      ParallelModel model(kModel, kMB, kMT, M, pool, groups, {}, spec);
      model.init_weights(42);
      model.zero_grad();
      const double loss = model.forward_backward(M, testing::micro_batches(in, tgt, 0, N), 1.0f / (M * cp));
      std::lock_guard<std::mutex> lock(mu);
      if (world.rank() == 1) {  // the rank whose attention sees both blocks
        grads.assign(model.grads(), model.grads() + model.num_params());
        loss0 = loss;
      }
    });
    return std::pair{loss0, grads};
  };
  const auto base = run({});
  for (Recompute r : {Recompute::kFull, Recompute::kSelective}) {
    CAPTURE(static_cast<int>(r));
    const auto got = run(RecomputeSpec{r, -1});
    CHECK(got.first == base.first);
    REQUIRE(got.second.size() == base.second.size());
    CHECK(std::memcmp(got.second.data(), base.second.data(), base.second.size() * sizeof(float)) == 0);
  }
}

// The planner's context-parallel memory model (planner/context_parallel.h) against what a stage allocates
// (stage_activation_bytes, asserted equal to the allocation above), on gpt2-124m at T = 1024, one GPU per cp rank.
TEST_CASE("gpt2-124m: context parallel activation bytes and their drop match the planner within 15%") {
  namespace plan = railyard::plan;
  const GptConfig g = model_preset("gpt2-124m");
  const plan::Cluster cluster = testing::cpu_cluster();
  const StageShape sh = make_stage_shape(g, g.max_seq_len, 1, 0, 1, 0, {});
  for (int B : {1, 2}) {
    const plan::Job job = testing::planner_job("gpt2-124m", g, B);
    plan::Layout l;
    l.micro_batch = B;
    const double m1 = static_cast<double>(stage_activation_bytes(sh, B, g.max_seq_len, 1, 2));
    const double p1 = plan::cp_activation_bytes(job, cluster, l, 1);
    for (int cp : {2, 4}) {
      CAPTURE(B);
      CAPTURE(cp);
      const double m = static_cast<double>(stage_activation_bytes(sh, B, g.max_seq_len, 1, 2, {}, false, cp));
      const double p = plan::cp_activation_bytes(job, cluster, l, cp);
      MESSAGE("B=" << B << " cp=" << cp << " MiB allocated cp1/cp " << m1 / 1048576 << " / " << m / 1048576 << " (drop "
                   << (m1 - m) / 1048576 << "), planner " << p1 / 1048576 << " / " << p / 1048576 << " (drop "
                   << (p1 - p) / 1048576 << ")");
      auto within = [](double got, double want) { return std::fabs(got - want) <= 0.15 * want; };
      CHECK(m < m1);
      CHECK(within(m, p));
      CHECK(within(m1 - m, p1 - p));
    }
  }
  // the ring's bytes per hop are what RingAttention sends (fp32 on the cpu profile): B Tc 2C floats
  const plan::RingTime rt = plan::cp_ring_time(plan::ModelShape{"t", 1, kC, kNH, kT, 100, false}, cluster,
                                               plan::Layout{.micro_batch = kB}, 4);
  CHECK(rt.bytes_per_hop == static_cast<double>(kB) * (kT / 4) * 2 * kC * sizeof(float));
  CHECK(rt.backward > rt.forward);
  CHECK(rt.forward_exposed <= rt.forward);
  const plan::Job odd{plan::ModelShape{"t", 1, kC, kNH, kT, 100, false}, 1, 0};
  CHECK_THROWS_AS(plan::cp_activation_bytes(odd, cluster, plan::Layout{}, 3), railyard::ConfigError);  // 3 ∤ 16
}
