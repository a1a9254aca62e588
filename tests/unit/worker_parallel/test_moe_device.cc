// Mixture-of-experts layers on a device the host cannot touch (issue #11): Gpt<float> with experts on ShadowCpu
// (shadow_device.h: CPU kernels behind PROT_NONE addresses, so any host read of device memory is a SIGSEGV) must equal
// the plain CPU run bit for bit: the router softmax/top-k, gathering the experts' rows, combining their outputs and
// the router's backward run in the device's moe_* kernels; only the dispatch under capacity runs on the host, from
// the choices copied out. Then the trainer with data parallelism (ZeRO 1/2 and the deterministic tree on device
// buffers) against the CPU's; expert parallelism (--ep) with the exchange, the experts' GEMMs and the expert
// gradients' reduction on device memory; the tensor/pipeline stage with experts (tp, tp + sequence parallelism, pp)
// likewise; and what stays refused off the host (the stage's --ep, the hierarchical all_to_all) naming the fix.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_parallel/shadow_device.h"
#include "tests/unit/worker_parallel/stage_test_util.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/comm/process_groups.h"
#include "worker/model/gpt.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/expert_parallel.h"
#include "worker/parallel/parallel_model.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
using railyard::ConfigError;
using railyard::worker::testing::DeviceComm;
using railyard::worker::testing::ShadowCpu;
using railyard::worker::testing::take_device_memory;
namespace comm = railyard::worker::comm;

namespace {

constexpr int kB = 2, kT = 8, kSteps = 3;

GptConfig moe_config(int experts, int top_k, double capacity_factor) {
  GptConfig c = make_gpt_config(/*L=*/2, /*C=*/32, /*NH=*/4, /*maxT=*/16, /*V=*/100);
  c.moe = make_moe_config(experts, top_k, capacity_factor, 0.01);
  return c;
}

struct Pass {
  std::vector<float> losses, grads;  // per micro-batch: the loss; after them: the accumulated gradients
  MoeStats stats;
  size_t copies = 0;
};

// Two micro-batches of forward + backward (accumulating), on the CPU or on ShadowCpu.
Pass forward_backward(const GptConfig& cfg, bool device, const RecomputeSpec& recompute) {
  ThreadPool pool(1);
  ShadowCpu dev(pool);
  Gpt<float> model(cfg, kB, kT, pool, recompute, device ? &dev : nullptr);
  model.init_weights(11);
  model.zero_grad();
  const testing::TokenData data = testing::random_tokens(2, kB, kT, cfg.vocab_size, 3);
  Pass p;
  for (int m = 0; m < 2; ++m) {
    p.losses.push_back(
        model.forward(data.in.data() + m * kB * kT, data.tgt.data() + m * kB * kT, Gpt<float>::Mode::kTrain, 0.5f));
    model.backward(m > 0);
  }
  p.stats = model.moe_stats();
  p.grads.resize(model.num_params());
  if (device) {
    CHECK(dev.owns(model.grads()));
    dev.to_host(p.grads.data(), model.grads(), p.grads.size() * sizeof(float));
  } else {
    std::memcpy(p.grads.data(), model.grads(), p.grads.size() * sizeof(float));
  }
  p.copies = dev.copies;
  return p;
}

}  // namespace

TEST_CASE("MoE layers on a device the host cannot touch equal the CPU run bit for bit") {
  struct Case {
    int experts, top_k;
    double capacity_factor;
    Recompute recompute;
  };
  for (const Case& c : {Case{4, 1, 1.25, Recompute::kNone}, Case{4, 2, 1.0, Recompute::kNone},
                        Case{4, 2, 0.5, Recompute::kFull}, Case{3, 2, 0, Recompute::kSelective}}) {
    CAPTURE(c.experts);
    CAPTURE(c.top_k);
    CAPTURE(c.capacity_factor);
    const GptConfig cfg = moe_config(c.experts, c.top_k, c.capacity_factor);
    const RecomputeSpec rs{.mode = c.recompute};
    const Pass cpu = forward_backward(cfg, false, rs), dev = forward_backward(cfg, true, rs);
    CHECK(dev.losses == cpu.losses);  // bitwise: the same kernels in the same order, the aux loss from host copies
    CHECK(dev.grads == cpu.grads);
    CHECK(dev.stats.aux_loss == cpu.stats.aux_loss);
    CHECK(dev.stats.assignments == cpu.stats.assignments);
    CHECK(dev.stats.dropped == cpu.stats.dropped);
    CHECK(dev.stats.tokens_dropped == cpu.stats.tokens_dropped);
    CHECK(cpu.stats.aux_loss > 0);
    // the router and the experts got gradients (not a dense model in disguise)
    double router = 0;
    for (size_t i = router_offset(cfg); i < router_offset(cfg) + router_size(cfg); ++i)
      router += std::fabs(cpu.grads[i]);
    CHECK(router > 0);
    if (c.capacity_factor > 0 && c.capacity_factor < 1.25) CHECK(cpu.stats.dropped > 0);  // capacity binds
    if (c.capacity_factor == 0) CHECK(cpu.stats.dropped == 0);                            // no limit
    CHECK(dev.copies > 0);  // choices out, rows/tokens in, probabilities out for the balance statistics
  }
}

namespace {

struct TrainRun {
  std::vector<std::vector<double>> losses, aux;  // per rank, per step
  std::vector<std::vector<float>> params;
};

// The plain trainer at dp=2 on an MoE model: ZeRO `stage` (or the deterministic tree), on the CPU or on ShadowCpu
// with the data-parallel state on device buffers (DataParallelOptions::device).
TrainRun train(bool device, int stage, bool deterministic) {
  const GptConfig cfg = moe_config(4, 2, 1.0);
  constexpr int n = 2;
  TrainRun res;
  res.losses.resize(n);
  res.aux.resize(n);
  res.params.resize(n);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    const TrainConfig tc = testing::small_train_config(kSteps, kB, kT, 2 * n, 1e-2);
    testing::DeviceDpTrainer rank(c, pool, cfg, tc, 16 << 10, stage, deterministic, device);
    Trainer& tr = rank.trainer;
    std::vector<double> losses, aux;
    for (int s = 0; s < tc.steps; ++s) {
      const StepResult r = tr.step();
      losses.push_back(r.loss);
      aux.push_back(r.moe_aux_loss);
    }
    const TrainerState st = tr.state();
    if (device) CHECK(rank.grad_dev.device_calls > 0);  // the gradients travelled as device memory
    std::lock_guard<std::mutex> lock(mu);
    res.losses[c.rank()] = losses;
    res.aux[c.rank()] = aux;
    res.params[c.rank()].assign(st.params, st.params + st.num_params);
  });
  return res;
}

}  // namespace

TEST_CASE("an MoE model trains on that device with dp=2 (ZeRO 1/2, deterministic tree) as on the CPU") {
  struct Case {
    int stage;
    bool deterministic;
  };
  for (const Case& c : {Case{1, false}, Case{2, false}, Case{0, true}, Case{1, true}}) {
    CAPTURE(c.stage);
    CAPTURE(c.deterministic);
    const TrainRun cpu = train(false, c.stage, c.deterministic), dev = train(true, c.stage, c.deterministic);
    CHECK(cpu.losses[0].back() < cpu.losses[0].front());
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE(dev.losses[r].size() == cpu.losses[r].size());
      CHECK(dev.aux[r] == cpu.aux[r]);  // the statistics are the host's from the same bits
      CHECK(cpu.aux[r].front() > 0);
      if (c.deterministic) {
        CHECK(dev.losses[r] == cpu.losses[r]);  // the tree's sums are the CPU's bits
        CHECK(dev.params[r] == cpu.params[r]);
        continue;
      }
      // ZeRO on the device sums its count-once norm per tensor run: equal up to rounding
      testing::check_losses_close(dev.losses[r], cpu.losses[r]);
      CHECK(testing::close_to(dev.params[r], cpu.params[r]));
    }
    CHECK(dev.params[0] == dev.params[1]);  // both replicas hold the same parameters
  }
}

namespace {

// The host twin of the NCCL stream reducer on ShadowCpu: NCCL's reduction is ordered after the compute stream's work
// so far (an event), so the kernels queued before it run first.
class ShadowStreamReducer final : public comm::StreamReducer {
 public:
  ShadowStreamReducer(comm::Communicator& c, ShadowCpu& dev) : twin_(comm::host_stream_reducer(c)), dev_(dev) {}
  void all_reduce(void* buf, size_t count, comm::DType t, comm::ReduceOp op) override {
    dev_.drain();
    twin_->all_reduce(buf, count, t, op);
  }
  void wait() override { twin_->wait(); }
  size_t pending() const override { return twin_->pending(); }

 private:
  std::unique_ptr<comm::StreamReducer> twin_;
  ShadowCpu& dev_;
};

struct EpRun {
  std::vector<std::vector<double>> losses, aux, norms;  // per rank, per step
  std::vector<std::vector<float>> params;               // per rank: its own buffer (E/ep experts when sharded)
  size_t local_params = 0;
  size_t exchange_calls = 0;  // device-memory operations of the exchange's groups (ep, expert-dp), rank 0
  size_t dp_calls = 0;        // of the dp group's stream reducer / device_dp, rank 0
};

// The plain trainer at dp = n with expert parallelism over groups of `ep`: expert-parallel storage (`sharded`, ZeRO 0:
// group spans) or all experts on every rank (ZeRO `stage`, the deterministic tree), on the CPU or on ShadowCpu with
// the exchange and the reductions on device memory (DeviceComm), wired as railyard-worker wires NCCL on CUDA.
EpRun ep_train(bool device, int n, int ep, bool sharded, int stage, bool deterministic, double grad_clip) {
  const GptConfig cfg = moe_config(4, 2, 1.0);
  EpRun res;
  res.losses.resize(n);
  res.aux.resize(n);
  res.norms.resize(n);
  res.params.resize(n);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    ShadowCpu dev(pool);
    TrainConfig tc = testing::small_train_config(kSteps, kB, kT, 2 * n, 1e-2);
    tc.grad_clip = grad_clip;
    testing::StreamSource src(c.rank(), n, kB, kT, cfg.vocab_size);
    DeviceComm dp_dev(c, dev);  // the NCCL dp group of DistSetup::device_groups
    ExpertParallel xp(c, {ep, "flat", 0, deterministic}, device ? &dp_dev : nullptr);
    const GptConfig local = sharded ? xp.local_config(cfg) : cfg;
    auto grad = c.dup("dp-grad");
    DeviceComm grad_dev(*grad, dev);
    ShadowStreamReducer reducer(grad_dev, dev);
    DataParallelOptions o;
    o.bucket_bytes = 16 << 10;  // buckets straddle the dense/expert boundary
    o.zero_stage = stage;
    o.deterministic = deterministic;
    if (device) {  // set_device_reduction in worker/main.cc
      o.stream_reducer = &reducer;
      o.device = &dev;
      o.device_dp = &grad_dev;
    }
    if (sharded) {
      o.group_spans = expert_group_spans(local, device ? &xp.device_expert_data_parallel() : &xp.expert_data_parallel(),
                                         &xp.group());
    }
    auto sync = gpt_data_parallel(&c, local, tc, pool, o);
    Trainer tr(local, tc, pool, src, nullptr, sync.get(), nullptr, device ? &dev : nullptr);
    xp.attach(tr.model());
    std::vector<double> losses, aux, norms;
    for (int s = 0; s < tc.steps; ++s) {
      const StepResult r = tr.step();
      losses.push_back(r.loss);
      aux.push_back(r.moe_aux_loss);
      norms.push_back(r.grad_norm);
    }
    const TrainerState st = tr.state();
    std::lock_guard<std::mutex> lock(mu);
    res.losses[c.rank()] = losses;
    res.aux[c.rank()] = aux;
    res.norms[c.rank()] = norms;
    res.params[c.rank()].assign(st.params, st.params + st.num_params);
    res.local_params = st.num_params;
    if (c.rank() == 0) {
      res.exchange_calls = dp_dev.subtree_calls;
      res.dp_calls = grad_dev.device_calls;
    }
  });
  return res;
}

}  // namespace

TEST_CASE("expert parallelism on that device (exchange and expert gradients in device memory) equals the CPU run") {
  struct Case {
    int n, ep;
    bool sharded;
    int stage;
    bool deterministic;
  };
  for (const Case& c : {Case{2, 2, true, 0, false}, Case{4, 2, true, 0, false}, Case{4, 4, true, 0, false},
                        Case{4, 2, false, 0, false}, Case{2, 2, false, 0, true}, Case{2, 2, false, 1, false}}) {
    CAPTURE(c.n);
    CAPTURE(c.ep);
    CAPTURE(c.sharded);
    CAPTURE(c.stage);
    CAPTURE(c.deterministic);
    // Without clipping the update does not read the norm, so parameters stay bitwise where only the norm's summation
    // differs (the device's global_norm per range vs the host's blocks); with it the trainer's own norm is the CPU's.
    const double clip = c.sharded ? 0.0 : 1.0;
    const EpRun cpu = ep_train(false, c.n, c.ep, c.sharded, c.stage, c.deterministic, clip);
    const EpRun dev = ep_train(true, c.n, c.ep, c.sharded, c.stage, c.deterministic, clip);
    CHECK(cpu.losses[0].back() < cpu.losses[0].front());
    if (c.sharded) CHECK(dev.local_params < num_parameters(moe_config(4, 2, 1.0)));  // E/ep experts per rank
    for (int r = 0; r < c.n; ++r) {
      CAPTURE(r);
      CHECK(dev.aux[r] == cpu.aux[r]);
      CHECK(cpu.aux[r].front() > 0);
      if (c.stage > 0) {  // ZeRO on the device sums its norm per tensor run: equal up to rounding
        REQUIRE(dev.losses[r].size() == cpu.losses[r].size());
        testing::check_losses_close(dev.losses[r], cpu.losses[r]);
        CHECK(testing::close_to(dev.params[r], cpu.params[r]));
        continue;
      }
      // bitwise: the same kernels in the same order, the exchange moves bits, the span mean is the same division
      CHECK(dev.losses[r] == cpu.losses[r]);
      CHECK(dev.params[r] == cpu.params[r]);
      for (size_t s = 0; s < cpu.norms[r].size(); ++s) {
        if (c.sharded) {
          CHECK(std::fabs(dev.norms[r][s] - cpu.norms[r][s]) <= 1e-6 * cpu.norms[r][s]);
        } else {
          CHECK(dev.norms[r][s] == cpu.norms[r][s]);
        }
      }
      // ranks holding the same experts hold the same parameters
      const int twin = c.sharded ? (r + c.ep) % c.n : (r + 1) % c.n;
      CHECK(dev.params[r] == dev.params[twin]);
    }
    // Every exchange went through device memory: per MoE layer and micro-batch 3 all_to_alls forward (counts, rows,
    // outputs) and 3 backward (inputs, gated output gradients, input gradients), + 1 returning expert gradients in
    // the deterministic mode; with sharded storage and an expert-dp group of 2+ ranks one span all-reduce per step.
    const size_t layers = 2, micro = 2, per = 6 + (c.deterministic ? 1 : 0);
    const size_t spans = c.sharded && c.n / c.ep > 1 ? kSteps : 0;
    CHECK(dev.exchange_calls == layers * micro * kSteps * per + spans);
    CHECK(cpu.exchange_calls == 0);
    CHECK(dev.dp_calls > 0);  // the dense gradients (and ZeRO's pieces, the tree's chunks) as device memory
  }
}

TEST_CASE("what stays refused off the host with --ep names the flag and the fix") {
  ThreadPool pool(1);
  ShadowCpu dev(pool);
  comm::run_local_world(2, [&](comm::Communicator& c) {
    // the hierarchical all_to_all stages its chunks in host memory
    DeviceComm dp_dev(c, dev);
    CHECK_THROWS_WITH_AS(ExpertParallel(c, {2, "hierarchical", 1, false}, &dp_dev), doctest::Contains("--ep-a2a flat"),
                         ConfigError);
  });
  // the tensor/pipeline stage's experts loop over the received rows on the host
  const GptConfig global = moe_config(4, 1, 1.25);
  ParallelModel model(global, kB, kT, 1, pool, ModelGroups{}, {}, {}, false, &dev);
  Gpt<float>::ExpertExchange x;
  x.size = 2;
  x.rank = 0;
  x.all_to_all = [](const void*, void*, size_t) {};
  CHECK_THROWS_WITH_AS(model.stage().set_expert_exchange(x), doctest::Contains("--device cpu"), ConfigError);
}

namespace {

struct StageRun {
  std::vector<double> losses;  // per rank
  std::vector<float> grads;    // gathered (tp = 0 of each stage writes its primary slices)
  std::vector<MoeStats> stats;
  size_t copies = 0, device_comm = 0;
};

// M micro-batches of forward/backward through ParallelModel at tp x pp (sp: sequence parallelism) with experts.
StageRun stage_run(bool device, int tp, int pp, bool sp, const testing::TokenData& data) {
  const GptConfig cfg = moe_config(4, 2, 1.0);
  constexpr int M = 3;
  const int n = tp * pp;
  const size_t P = num_parameters(cfg);
  StageRun res;
  res.losses.assign(n, 0);
  res.stats.resize(n);
  res.grads.assign(P, 0);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = 1, .tp = tp, .pp = pp});
    ThreadPool pool(1);
    ShadowCpu dev(pool);
    ModelGroups mg = model_groups(groups);
    std::vector<std::unique_ptr<DeviceComm>> wrapped;
    if (device) wrapped = take_device_memory(mg, dev);
    ParallelModel model(cfg, kB, kT, M, pool, mg, {}, {}, sp, device ? &dev : nullptr);
    model.init_weights(7);
    model.zero_grad();
    const size_t N = kB * kT;
    const double loss = model.forward_backward(M, testing::micro_batches(data.in, data.tgt, 0, N), 1.0f / M);
    model.finish_grads();
    const testing::HostGrads grads = testing::host_grads(model);
    std::lock_guard<std::mutex> lock(mu);
    res.losses[world.rank()] = loss;
    res.stats[world.rank()] = model.moe_stats();
    grads.copy_to_full(cfg, res.grads.data());
    res.copies += dev.copies;
    for (auto& w : wrapped) res.device_comm += w->device_calls;
  });
  return res;
}

}  // namespace

TEST_CASE("MoE layers in the tp/pp stage on that device equal the CPU run bit for bit (tp 2, tp 2 + sp, pp 2)") {
  struct Case {
    int tp, pp;
    bool sp;
  };
  const testing::TokenData data = testing::random_tokens(3, kB, kT, 100, 8);
  for (const Case& c : {Case{2, 1, false}, Case{2, 1, true}, Case{1, 2, false}}) {
    CAPTURE(c.tp);
    CAPTURE(c.pp);
    CAPTURE(c.sp);
    const StageRun cpu = stage_run(false, c.tp, c.pp, c.sp, data), dev = stage_run(true, c.tp, c.pp, c.sp, data);
    CHECK(dev.losses == cpu.losses);  // bitwise
    CHECK(dev.grads == cpu.grads);
    for (size_t r = 0; r < cpu.stats.size(); ++r) {
      CHECK(dev.stats[r].aux_loss == cpu.stats[r].aux_loss);
      CHECK(dev.stats[r].dropped == cpu.stats[r].dropped);
      CHECK(dev.stats[r].assignments == cpu.stats[r].assignments);
    }
    CHECK(cpu.stats[0].aux_loss > 0);
    CHECK(cpu.stats[0].dropped > 0);  // capacity 1.0 with top-2: some choices dropped
    CHECK(cpu.copies == 0);
    CHECK(dev.copies > 0);
    CHECK(dev.device_comm > 0);  // tp collectives / pipeline messages (and with sp the routing counts) on device memory
  }
}
