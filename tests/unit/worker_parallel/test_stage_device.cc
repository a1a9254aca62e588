// The tensor/pipeline-parallel stage on a device whose memory the host cannot touch (issue #11): tp=2 x pp=2 (and
// with sequence parallelism; cp=2 and tp=2 x cp=2 with ring attention) through ParallelModel on "ShadowCpu", a device
// that runs the CPU kernels but hands out addresses in a PROT_NONE region. Any host code in GptStage/ParallelModel that
// reads or writes device memory (a memcpy, a loop over the losses, a host-side reduction) dies with SIGSEGV instead of
// passing; any host pointer given to a device kernel is refused. The communicators are the real Gloo ones behind a
// wrapper that translates device addresses, as NCCL takes device memory. Losses and gathered gradients must equal the
// plain CPU run bit for bit (same kernels, same order); the count-once sum of squares goes through the device's
// global_norm, so it is compared to 1e-12.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_parallel/shadow_device.h"
#include "tests/unit/worker_parallel/stage_test_util.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/comm/process_groups.h"
#include "worker/comm/stream_reducer.h"
#include "worker/device/cpu_kernels.h"
#include "worker/parallel/dist_model.h"
#include "worker/parallel/parallel_model.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
using railyard::worker::testing::DeviceComm;
using railyard::worker::testing::ShadowCpu;
using railyard::worker::testing::take_device_memory;
namespace comm = railyard::worker::comm;

namespace {

const GptConfig kCfg = make_gpt_config(/*L=*/4, /*C=*/32, /*NH=*/4, /*maxT=*/16, /*V=*/100);
constexpr int kB = 2, kT = 8, kM = 3;
struct Run {
  std::vector<double> losses, sumsq;
  std::vector<float> grads, params;  // gathered (tp = 0 of each stage writes its primary slices)
  size_t copies = 0, device_comm = 0;
};

// tp x pp (x cp: context parallelism, the cp ranks being the layout's dp ranks, each holding T/cp positions of the same
// sequences). With cp the gathered gradients are kept per cp rank (each holds its positions' share).
Run run(bool device, bool sp, const std::vector<int32_t>& data, int tp = 2, int pp = 2, int cp = 1) {
  const int n = tp * pp * cp;
  const size_t P = num_parameters(kCfg);
  Run res;
  res.losses.assign(n, 0);
  res.sumsq.assign(n, 0);
  res.grads.assign(P * cp, 0);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = cp, .tp = tp, .pp = pp});
    ThreadPool pool(1);
    ShadowCpu dev(pool);
    ModelGroups mg = model_groups(groups);
    const std::unique_ptr<comm::Communicator> cp_group = testing::attach_cp_group(groups, mg, cp);
    std::vector<std::unique_ptr<DeviceComm>> wrapped;
    if (device) wrapped = take_device_memory(mg, dev);
    ParallelModel model(kCfg, kB, kT, kM, pool, mg, {}, {}, sp, device ? &dev : nullptr);
    model.init_weights(7);
    model.zero_grad();
    const double loss = model.forward_backward(kM, testing::interleaved_micro_batches(data, kB * kT), 1.0f / kM);
    model.finish_grads();
    const double sq = model.sum_squares_once(model.grads());
    const testing::HostGrads grads = testing::host_grads(model);
    std::lock_guard<std::mutex> lock(mu);
    res.losses[world.rank()] = loss;
    res.sumsq[world.rank()] = sq;
    grads.copy_to_full(kCfg, res.grads.data() + P * groups.dp().rank());
    res.copies += dev.copies;
    for (auto& w : wrapped) res.device_comm += w->device_calls;
  });
  return res;
}

std::vector<int32_t> make_data() {
  std::mt19937 rng(5);
  std::vector<int32_t> d(static_cast<size_t>(kM) * 2 * kB * kT);
  for (auto& x : d) x = static_cast<int32_t>(rng() % kCfg.vocab_size);
  return d;
}

void check_same(const Run& dev, const Run& cpu) {
  for (size_t r = 0; r < cpu.losses.size(); ++r) {
    CHECK(dev.losses[r] == cpu.losses[r]);  // bitwise
    CHECK(std::fabs(dev.sumsq[r] - cpu.sumsq[r]) <= 1e-12 * cpu.sumsq[r]);
  }
  CHECK(cpu.sumsq[0] > 0);
  CHECK(std::memcmp(dev.grads.data(), cpu.grads.data(), cpu.grads.size() * sizeof(float)) == 0);
  CHECK(dev.copies > 0);       // token ids, targets and losses crossed the boundary
  CHECK(dev.device_comm > 0);  // tp collectives and pipeline messages took device memory
  CHECK(cpu.copies == 0);
}

}  // namespace

TEST_CASE("tp=2 x pp=2 on a device the host cannot touch equals the CPU run bit for bit") {
  const auto data = make_data();
  check_same(run(true, false, data), run(false, false, data));
}

TEST_CASE("tp=2 x pp=2 with sequence parallelism on that device equals the CPU run bit for bit") {
  const auto data = make_data();
  check_same(run(true, true, data), run(false, true, data));
}

// Context parallelism: ring attention's blocks and their gradients travel between the cp ranks as device memory, its
// math runs in the device's ring_* kernels (issue #11).
TEST_CASE("context parallelism cp=2 on a device the host cannot touch equals the CPU run bit for bit") {
  const auto data = make_data();
  const Run dev = run(true, false, data, 1, 1, 2), cpu = run(false, false, data, 1, 1, 2);
  check_same(dev, cpu);
  // the two cp ranks hold different positions' shares of the gradient
  CHECK(std::memcmp(cpu.grads.data(), cpu.grads.data() + num_parameters(kCfg), num_parameters(kCfg) * 4) != 0);
}

TEST_CASE("tp=2 x cp=2 on that device equals the CPU run bit for bit") {
  const auto data = make_data();
  check_same(run(true, false, data, 2, 1, 2), run(false, false, data, 2, 1, 2));
}

namespace {

// One fixed (B,T) batch, every call on every rank: the loss must go down.
class Batches final : public BatchSource {
 public:
  void next_batch(int32_t* in, int32_t* tgt) override {
    rng_.seed(9);
    for (int i = 0; i < kB * kT; ++i) {
      in[i] = static_cast<int32_t>(rng_() % kCfg.vocab_size);
      tgt[i] = static_cast<int32_t>(rng_() % kCfg.vocab_size);
    }
  }

 private:
  std::mt19937 rng_{9};
};

struct TrainRun {
  std::vector<double> losses;                 // rank 0's, per step
  std::vector<std::vector<float>> params, m;  // per rank: state() after the steps (host memory)
};

// The trainer over ParallelGpt, tp=2 x pp=2, a few AdamW steps; device: on ShadowCpu with device-memory
// communicators, the AdamW update on the device and state() served from host copies.
TrainRun train(bool device) {
  TrainRun res;
  res.params.resize(4);
  res.m.resize(4);
  std::mutex mu;
  comm::run_local_world(4, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = 1, .tp = 2, .pp = 2});
    ThreadPool pool(1);
    ShadowCpu dev(pool);
    ModelGroups mg = model_groups(groups);
    std::vector<std::unique_ptr<DeviceComm>> wrapped;
    if (device) wrapped = take_device_memory(mg, dev);
    TrainConfig tc = testing::small_train_config(3, kB, kT, 2, 1e-2);
    Batches src;
    ParallelGpt model(kCfg, tc, tc.micro_steps(), pool, world, mg, device ? &dev : nullptr);
    Trainer trainer(kCfg, tc, pool, src, nullptr, nullptr, &model, device ? &dev : nullptr);
    std::vector<double> losses;
    for (int s = 0; s < tc.steps; ++s) losses.push_back(trainer.step().loss);
    const TrainerState st = trainer.state();
    REQUIRE(st.params != nullptr);
    CHECK(st.adam_t == tc.steps);
    CHECK_FALSE(dev.owns(st.params));
    // Without ZeRO the model's own AdamW moments live on the device (allocated by the first update).
    if (device) CHECK(model.device_moment_bytes() == 2 * model.num_params() * sizeof(float));
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) res.losses = losses;
    res.params[world.rank()].assign(st.params, st.params + st.num_params);
    res.m[world.rank()].assign(model.adam_m(), model.adam_m() + st.num_params);
  });
  return res;
}

}  // namespace

TEST_CASE("the trainer's tp=2 x pp=2 steps on that device (AdamW there, state() from host copies) equal the CPU's") {
  const TrainRun cpu = train(false), dev = train(true);
  REQUIRE(cpu.losses.size() == 3);
  CHECK(dev.losses == cpu.losses);  // bitwise
  CHECK(cpu.losses.back() < cpu.losses.front());
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(dev.params[r] == cpu.params[r]);  // the host copies hold the updated parameters
    CHECK(dev.m[r] == cpu.m[r]);
  }
}

namespace {

// dp x tp x pp on the device (issue #11): the replica's gradient buckets go to a StreamReducer, here the host twin over
// a DeviceComm (Gloo taking device addresses, as the NCCL reducer takes CUDA memory), counted: every bucket it is
// handed must be device memory.
class CountingReducer final : public comm::StreamReducer {
 public:
  CountingReducer(comm::Communicator& c, ShadowCpu& dev) : twin_(comm::host_stream_reducer(c)), dev_(dev) {}
  void all_reduce(void* buf, size_t count, comm::DType t, comm::ReduceOp op) override {
    // The NCCL reducer orders the reduction after the compute stream's work so far (an event): run those kernels.
    dev_.drain();
    ++launches;
    if (!dev_.owns(buf)) ++host_buffers;
    // Two micro-batches per replica and step: an odd count is the last one's backward before its embedding backward.
    if (dev_.embedding_backwards % 2 == 1) ++during_backward;
    twin_->all_reduce(buf, count, t, op);
  }
  void wait() override {
    ++waits;
    twin_->wait();
  }
  size_t pending() const override { return twin_->pending(); }
  size_t launches = 0, waits = 0, host_buffers = 0, during_backward = 0;

 private:
  std::unique_ptr<comm::StreamReducer> twin_;
  ShadowCpu& dev_;
};

struct HybridRun {
  std::vector<std::vector<double>> losses, norms;  // per rank, per step
  std::vector<std::vector<float>> params, m;       // per rank: host copies after the steps
  size_t launches = 0, waits = 0, host_buffers = 0, buckets = 0;
  std::vector<size_t> during_backward;      // per first-stage rank: launches while its backward still ran
  std::vector<std::vector<float>> shard_m;  // ZeRO: per rank, the host copy of its shard's AdamW m
  size_t dp_device_calls = 0;               // ZeRO on the device: reduce-scatters/all-gathers on device memory
};

constexpr int kHybridSteps = 3;

// The trainer over ParallelGpt on `layout` (dp = 2), each replica its own data, the dp reduction by DataParallel with
// small buckets: on the CPU its background thread over Gloo; on ShadowCpu (device) the stream reducer above.
HybridRun train_hybrid(comm::Layout layout, bool device, int zero = 0, bool deterministic = false) {
  const int n = layout.world();
  HybridRun res;
  res.losses.resize(n);
  res.norms.resize(n);
  res.params.resize(n);
  res.m.resize(n);
  res.shard_m.resize(n);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, layout);
    ThreadPool pool(1);
    ShadowCpu dev(pool);
    ModelGroups mg = model_groups(groups);
    std::vector<std::unique_ptr<DeviceComm>> wrapped;
    if (device) wrapped = take_device_memory(mg, dev);
    TrainConfig tc =
        testing::small_train_config(kHybridSteps, kB, kT, 2 * layout.dp, 1e-2);  // 2 micro-batches per replica
    // Deterministic: every replica reads the whole sequence and keeps its run of the virtual micro-batches.
    testing::StreamSource src(deterministic ? 0 : groups.coord().dp, deterministic ? 1 : layout.dp, kB, kT,
                              kCfg.vocab_size);
    ParallelGpt model(kCfg, tc, tc.micro_steps() / layout.dp, pool, world, mg, device ? &dev : nullptr);
    std::unique_ptr<comm::Communicator> grad;
    std::unique_ptr<DeviceComm> grad_dev;
    std::unique_ptr<CountingReducer> reducer;
    DataParallelOptions o;
    o.bucket_bytes = 8 << 10;  // 2048 floats: several buckets per stage, some finished during backward
    o.zero_stage = zero;
    o.deterministic = deterministic;
    if (device) {
      grad = groups.dp().dup("dp-grad");
      grad_dev = std::make_unique<DeviceComm>(*grad, dev);
      reducer = std::make_unique<CountingReducer>(*grad_dev, dev);
      o.stream_reducer = reducer.get();
      o.device = &dev;  // ZeRO-1: reduce-scatter, AdamW and all-gather of device pieces (as railyard-worker sets it)
      o.device_dp = grad_dev.get();
    }
    auto sync = parallel_gpt_data_parallel(&groups.dp(), model, mg, tc, pool, o);
    CHECK(sync->device_buffers() == device);
    Trainer trainer(kCfg, tc, pool, src, nullptr, sync.get(), &model, device ? &dev : nullptr);
    std::vector<double> losses, norms;
    for (int s = 0; s < tc.steps; ++s) {
      const StepResult r = trainer.step();
      losses.push_back(r.loss);
      norms.push_back(r.grad_norm);
    }
    const TrainerState st = trainer.state();
    REQUIRE(st.params != nullptr);
    CHECK_FALSE(dev.owns(st.params));
    std::lock_guard<std::mutex> lock(mu);
    const int r = world.rank();
    res.losses[r] = losses;
    res.norms[r] = norms;
    res.params[r].assign(st.params, st.params + st.num_params);
    // Under ZeRO the moments are the sync's shard (the model holds none of its own).
    if (zero == 0) res.m[r].assign(model.adam_m(), model.adam_m() + st.num_params);
    if (zero > 0) res.shard_m[r].assign(sync->shard_m(), sync->shard_m() + sync->shard_size());
    if (grad_dev) res.dp_device_calls += grad_dev->device_calls;
    res.buckets += sync->layout().buckets().size();
    if (reducer) {
      res.launches += reducer->launches;
      res.waits += reducer->waits;
      res.host_buffers += reducer->host_buffers;
      if (groups.coord().pp == 0) res.during_backward.push_back(reducer->during_backward);
    }
  });
  return res;
}

void check_hybrid(comm::Layout layout) {
  const HybridRun cpu = train_hybrid(layout, false), dev = train_hybrid(layout, true);
  const int n = layout.world();
  // Every bucket of every rank once per step, each step's waited for once; all of them device memory.
  CHECK(dev.buckets > static_cast<size_t>(2 * n));
  CHECK(dev.launches == dev.buckets * kHybridSteps);
  CHECK(dev.waits == static_cast<size_t>(n * kHybridSteps));
  CHECK(dev.host_buffers == 0);
  // The overlap: on every first-stage rank some buckets went while the step's last backward was still running.
  REQUIRE(dev.during_backward.size() == static_cast<size_t>(n / layout.pp));
  for (size_t k : dev.during_backward) CHECK(k >= static_cast<size_t>(kHybridSteps));
  REQUIRE(cpu.losses[0].size() == static_cast<size_t>(kHybridSteps));
  CHECK(cpu.losses[0].back() < cpu.losses[0].front());
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(dev.losses[r] == cpu.losses[r]);  // bitwise
    for (int s = 0; s < kHybridSteps; ++s) {
      // Summed per range by the device's global_norm (the CPU loops element by element): equal up to rounding.
      CHECK(std::fabs(dev.norms[r][s] - cpu.norms[r][s]) <= 1e-12 * cpu.norms[r][s]);
    }
    CHECK(dev.params[r] == cpu.params[r]);  // the reduced gradients, the device AdamW: the same bits
    CHECK(dev.m[r] == cpu.m[r]);
  }
  // The replicas saw different data and still hold the same parameters: the dp reduction happened.
  for (int r = 0; r < n; ++r) {
    if ((r / layout.tp) % layout.dp != 0) continue;  // rank = tp + tp * (dp + dp_size * pp): r + tp is r's dp peer
    CAPTURE(r);
    CHECK(cpu.params[r] == cpu.params[r + layout.tp]);
    CHECK(dev.params[r] == dev.params[r + layout.tp]);
  }
}

}  // namespace

TEST_CASE("dp=2 x tp=2 on that device: buckets through a stream reducer, the trainer's steps equal the CPU's bitwise") {
  check_hybrid(comm::Layout{.dp = 2, .tp = 2, .pp = 1});
}

TEST_CASE("dp=2 x pp=2 on that device (tied-embedding all-reduce on device memory) equals the CPU bitwise") {
  check_hybrid(comm::Layout{.dp = 2, .tp = 1, .pp = 2});
}

namespace {

// ZeRO-1/2 on the device: the grad norm is summed per run on the device (the CPU loops element by element), so the
// clip factor may differ in the last bit: the same training to 1e-6, not bit for bit. Stage 2 reads the reduced
// pieces from a shard-sized device buffer instead of the full-size gradients.
void check_hybrid_zero(comm::Layout layout, int stage = 1) {
  const HybridRun cpu = train_hybrid(layout, false, stage), dev = train_hybrid(layout, true, stage);
  const int n = layout.world();
  CHECK(dev.launches == 0);  // no all-reduce: the buckets are reduce-scattered
  CHECK(dev.dp_device_calls >= static_cast<size_t>(2 * n * kHybridSteps));  // reduce-scatter + all-gather, device
  REQUIRE(cpu.losses[0].size() == static_cast<size_t>(kHybridSteps));
  CHECK(cpu.losses[0].back() < cpu.losses[0].front());
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    REQUIRE(dev.losses[r].size() == static_cast<size_t>(kHybridSteps));
    testing::check_losses_close(dev.losses[r], cpu.losses[r]);
    for (int s = 0; s < kHybridSteps; ++s)
      CHECK(std::fabs(dev.norms[r][s] - cpu.norms[r][s]) <= 1e-9 * cpu.norms[r][s]);
    CHECK(testing::close_to(dev.params[r], cpu.params[r]));  // state(): the host copy after ZeRO's all-gather
    CHECK(testing::close_to(dev.shard_m[r], cpu.shard_m[r]));
  }
  for (int r = 0; r < n; ++r) {
    if ((r / layout.tp) % layout.dp != 0) continue;
    CAPTURE(r);
    CHECK(dev.params[r] == dev.params[r + layout.tp]);    // the all-gather gave both replicas the same parameters
    CHECK(dev.shard_m[r] != dev.shard_m[r + layout.tp]);  // and each its own piece of the moments
  }
}

}  // namespace

TEST_CASE("ZeRO-1 with dp=2 x tp=2 and dp=2 x pp=2 on that device (pieces, AdamW, all-gather there) follows the CPU") {
  check_hybrid_zero(comm::Layout{.dp = 2, .tp = 2, .pp = 1});
  check_hybrid_zero(comm::Layout{.dp = 2, .tp = 1, .pp = 2});
}

TEST_CASE("ZeRO-2 with dp=2 x tp=2 on that device (shard-sized gradient buffer there) follows the CPU's ZeRO-2") {
  check_hybrid_zero(comm::Layout{.dp = 2, .tp = 2, .pp = 1}, 2);
}

TEST_CASE("dp x tp on that device: ZeRO 1/2 and --deterministic without the device are refused, host reduction too") {
  comm::run_local_world(4, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = 2, .tp = 2, .pp = 1});
    ThreadPool pool(1);
    ShadowCpu dev(pool);
    ModelGroups mg = model_groups(groups);
    auto wrapped = take_device_memory(mg, dev);
    TrainConfig tc;
    tc.batch = kB;
    tc.seq_len = kT;
    tc.global_batch_tokens = 4 * kB * kT;
    testing::StreamSource src(groups.coord().dp, 2, kB, kT, kCfg.vocab_size);
    ParallelGpt model(kCfg, tc, 2, pool, world, mg, &dev);
    auto twin = comm::host_stream_reducer(groups.dp());
    // ZeRO 1 and 2 and the deterministic tree need the device (their pieces and leaves live there), not only a
    // stream reducer.
    for (int what = 0; what < 3; ++what) {
      DataParallelOptions o;
      o.stream_reducer = twin.get();
      o.device_dp = &groups.dp();
      if (what == 0) o.zero_stage = 2;
      if (what == 1) o.deterministic = true;
      if (what == 2) o.zero_stage = 1;
      CHECK_THROWS_WITH_AS(parallel_gpt_data_parallel(&groups.dp(), model, mg, tc, pool, o),
                           doctest::Contains(what == 0   ? "--zero 2"
                                             : what == 1 ? "--deterministic"
                                                         : "--zero 1"),
                           railyard::ConfigError);
    }
    // Without a stream reducer the sync reduces host buffers: the trainer refuses it off the host.
    auto host_only = parallel_gpt_data_parallel(&groups.dp(), model, mg, tc, pool, {});
    CHECK_THROWS_WITH_AS(Trainer(kCfg, tc, pool, src, nullptr, host_only.get(), &model, &dev),
                         doctest::Contains("host buffers"), railyard::ConfigError);
  });
}

namespace {

// One rank's ParallelGpt + ZeRO DataParallel + Trainer on its own ShadowCpu, as railyard-worker wires them on CUDA
// (device = false: the same on the CPU). `steps`: the run's length (the LR schedule's).
struct DeviceZeroRank {
  DeviceZeroRank(comm::Communicator& world, comm::ProcessGroups& groups, comm::Layout layout, ThreadPool& pool,
                 int skip_steps, int stage, bool device = true, int steps = kHybridSteps)
      : dev(pool),
        mg(model_groups(groups)),
        src(groups.coord().dp, layout.dp, kB, kT, kCfg.vocab_size, 2 * skip_steps) {  // the loader's position
    if (device) wrapped = take_device_memory(mg, dev);
    tc = testing::small_train_config(steps, kB, kT, 2 * layout.dp, 1e-2);
    model = std::make_unique<ParallelGpt>(kCfg, tc, 2, pool, world, mg, device ? &dev : nullptr);
    model_bytes = dev.used();
    grad = groups.dp().dup("dp-grad");
    grad_dev = std::make_unique<DeviceComm>(*grad, dev);
    const DataParallelOptions o = testing::device_dp_options(8 << 10, stage, false, device, dev, grad_dev.get());
    sync = parallel_gpt_data_parallel(&groups.dp(), *model, mg, tc, pool, o);
    trainer = std::make_unique<Trainer>(kCfg, tc, pool, src, nullptr, sync.get(), model.get(), device ? &dev : nullptr);
    setup_bytes = dev.used();
  }
  ShadowCpu dev;
  size_t model_bytes = 0, setup_bytes = 0;  // device bytes after the model's and after the whole set-up
  ModelGroups mg;
  testing::StreamSource src;
  std::vector<std::unique_ptr<DeviceComm>> wrapped;
  TrainConfig tc;
  std::unique_ptr<ParallelGpt> model;
  std::unique_ptr<comm::Communicator> grad;
  std::unique_ptr<DeviceComm> grad_dev;
  std::unique_ptr<DataParallel> sync;
  std::unique_ptr<Trainer> trainer;
};

}  // namespace

TEST_CASE("ZeRO-1 and -2 on that device: a restore through the host copies continues the run bit for bit") {
  const comm::Layout layout{.dp = 2, .tp = 2, .pp = 1};
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    comm::run_local_world(layout.world(), [&](comm::Communicator& world) {
      comm::ProcessGroups groups(world, layout);
      ThreadPool pool(1);
      // Uninterrupted: 2 steps, the checkpoint's view (state(): params, the shard's m and v), a third step.
      DeviceZeroRank a(world, groups, layout, pool, 0, stage);
      a.trainer->step();
      a.trainer->step();
      const TrainerState st = a.trainer->state();
      const std::vector<float> params(st.params, st.params + st.num_params);
      const std::vector<float> m(a.sync->shard_m(), a.sync->shard_m() + a.sync->shard_size());
      const std::vector<float> v(a.sync->shard_v(), a.sync->shard_v() + a.sync->shard_size());
      REQUIRE(st.adam_t == 2);
      const double loss3 = a.trainer->step().loss;
      const TrainerState after = a.trainer->state();
      const std::vector<float> params3(after.params, after.params + after.num_params);
      CHECK(params3 != params);  // the host copy follows ZeRO's update

      // Restored: a fresh run (other device memory) whose host copies get the checkpoint, then restore_counters().
      DeviceZeroRank b(world, groups, layout, pool, 2, stage);
      TrainerState rs = b.trainer->state();
      std::copy(params.begin(), params.end(), rs.params);
      std::copy(m.begin(), m.end(), b.sync->shard_m());
      std::copy(v.begin(), v.end(), b.sync->shard_v());
      rs.step = st.step;
      rs.adam_t = st.adam_t;
      b.trainer->restore_counters(rs);
      CHECK(b.trainer->step().loss == loss3);  // bitwise: the same device path from the same state
      const TrainerState got = b.trainer->state();
      CHECK(std::vector<float>(got.params, got.params + got.num_params) == params3);
      CHECK(std::vector<float>(b.sync->shard_m(), b.sync->shard_m() + b.sync->shard_size()) ==
            std::vector<float>(a.sync->shard_m(), a.sync->shard_m() + a.sync->shard_size()));
    });
  }
}

namespace {

struct PlainRun {
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<float>> params, shard_m;
};

// The plain Gpt trainer at dp=n with ZeRO stage `stage`: on the CPU, or on ShadowCpu with the device pieces.
PlainRun plain_zero(bool device, int n, int stage) {
  PlainRun res;
  res.losses.resize(n);
  res.params.resize(n);
  res.shard_m.resize(n);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    const TrainConfig tc = testing::small_train_config(kHybridSteps, kB, kT, 2 * n, 1e-2);
    testing::DeviceDpTrainer rank(c, pool, kCfg, tc, 16 << 10, stage, false, device);
    const auto& sync = rank.sync;
    CHECK(sync->device_buffers() == device);
    Trainer& tr = rank.trainer;
    std::vector<double> losses;
    for (int s = 0; s < tc.steps; ++s) losses.push_back(tr.step().loss);
    const TrainerState st = tr.state();
    CHECK_FALSE(rank.dev.owns(st.params));
    CHECK(st.adam_m == nullptr);  // ZeRO: the moments are the sync's shard
    if (device && n > 1) CHECK(rank.grad_dev.device_calls >= static_cast<size_t>(2 * kHybridSteps));
    std::lock_guard<std::mutex> lock(mu);
    res.losses[c.rank()] = losses;
    res.params[c.rank()].assign(st.params, st.params + st.num_params);
    res.shard_m[c.rank()].assign(sync->shard_m(), sync->shard_m() + sync->shard_size());
  });
  return res;
}

}  // namespace

TEST_CASE("ZeRO-1 and -2 on that device with the plain Gpt trainer (dp=1 and dp=2) follow the CPU's ZeRO run") {
  for (const auto& [stage, n] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 1}, std::pair{2, 2}}) {
    CAPTURE(stage);
    CAPTURE(n);
    const PlainRun cpu = plain_zero(false, n, stage), dev = plain_zero(true, n, stage);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      REQUIRE(dev.losses[r].size() == cpu.losses[r].size());
      testing::check_losses_close(dev.losses[r], cpu.losses[r]);
      CHECK(testing::close_to(dev.params[r], cpu.params[r]));
      REQUIRE(dev.shard_m[r].size() == cpu.shard_m[r].size());
      CHECK(testing::max_abs(cpu.shard_m[r]) > 0);
      CHECK(testing::close_to(dev.shard_m[r], cpu.shard_m[r]));
    }
    CHECK(cpu.losses[0].back() < cpu.losses[0].front());
    CHECK(dev.params.front() == dev.params.back());  // the all-gather: both replicas hold the same parameters
  }
}

namespace {

// --deterministic on the device (issue #11): the plain Gpt trainer at dp=n (4 virtual micro-batches per step, every
// rank reading the whole sequence), ZeRO `stage`, on the CPU or on ShadowCpu with the tree's leaves on device memory
// and its all_to_all/all_gather over a DeviceComm. `skip_steps`: the loader starts that many steps in (a restore).
struct PlainDetRank {
  PlainDetRank(comm::Communicator& c, ThreadPool& pool, bool device, int stage, int skip_steps = 0)
      : dev(pool), src(0, 1, kB, kT, kCfg.vocab_size, 4 * skip_steps) {
    tc = testing::small_train_config(kHybridSteps, kB, kT, 4, 1e-2);
    tc.grad_clip = 0.5;  // binding for these steps: the norm's bits reach the parameters
    grad = c.dup("dp-grad");
    grad_dev = std::make_unique<DeviceComm>(*grad, dev);
    const DataParallelOptions o =
        testing::device_dp_options(DataParallelOptions{}.bucket_bytes, stage, true, device, dev, grad_dev.get());
    sync = gpt_data_parallel(c.size() > 1 ? &c : nullptr, kCfg, tc, pool, o);  // one process: no group (main's)
    trainer = std::make_unique<Trainer>(kCfg, tc, pool, src, nullptr, sync.get(), nullptr, device ? &dev : nullptr);
  }
  std::vector<float> shard_m() { return {sync->shard_m(), sync->shard_m() + sync->shard_size()}; }
  std::vector<float> shard_v() { return {sync->shard_v(), sync->shard_v() + sync->shard_size()}; }
  ShadowCpu dev;
  testing::StreamSource src;
  TrainConfig tc;
  std::unique_ptr<comm::Communicator> grad;
  std::unique_ptr<DeviceComm> grad_dev;
  std::unique_ptr<DataParallel> sync;
  std::unique_ptr<Trainer> trainer;
};

struct DetRun {
  std::vector<std::vector<double>> losses, norms;  // per rank, per step
  std::vector<std::vector<float>> params, m;       // per rank after the steps: state() and the moments held (shard)
  size_t device_calls = 0, copies = 0;
};

DetRun plain_deterministic(bool device, int n, int stage) {
  DetRun res;
  res.losses.resize(n);
  res.norms.resize(n);
  res.params.resize(n);
  res.m.resize(n);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    PlainDetRank a(c, pool, device, stage);
    CHECK(a.sync->device_buffers() == device);
    std::vector<double> losses, norms;
    for (int s = 0; s < kHybridSteps; ++s) {
      const StepResult r = a.trainer->step();
      losses.push_back(r.loss);
      norms.push_back(r.grad_norm);
    }
    const TrainerState st = a.trainer->state();
    CHECK_FALSE(a.dev.owns(st.params));
    std::lock_guard<std::mutex> lock(mu);
    res.losses[c.rank()] = losses;
    res.norms[c.rank()] = norms;
    res.params[c.rank()].assign(st.params, st.params + st.num_params);
    res.m[c.rank()] = stage > 0 ? a.shard_m() : std::vector<float>(st.adam_m, st.adam_m + st.num_params);
    res.device_calls += a.grad_dev->device_calls;
    res.copies += a.dev.copies;
  });
  return res;
}

}  // namespace

TEST_CASE(
    "--deterministic on that device (plain trainer, dp=1/2/4, ZeRO 1/2) equals the CPU's deterministic run bitwise") {
  std::map<int, std::vector<float>> reference;  // per stage, the first layout's: every dp trains the same bits
  for (const auto& [stage, n] : {std::pair{0, 1}, std::pair{0, 2}, std::pair{0, 4}, std::pair{1, 2}, std::pair{2, 2},
                                 std::pair{2, 4}, std::pair{1, 1}}) {
    CAPTURE(stage);
    CAPTURE(n);
    const DetRun cpu = plain_deterministic(false, n, stage), dev = plain_deterministic(true, n, stage);
    if (!reference.count(stage)) reference[stage] = cpu.params[0];
    CHECK(cpu.losses[0].back() < cpu.losses[0].front());
    CHECK(cpu.norms[0].front() > 0.5);  // the clip binds: the norm's bits reach the parameters
    CHECK(cpu.copies == 0);
    CHECK(dev.copies > 0);
    // all_to_all + all_gather (or, ZeRO, the parameters' all-gather) per step and rank, on device memory.
    if (n > 1) CHECK(dev.device_calls >= static_cast<size_t>(2 * n * kHybridSteps));
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(dev.losses[r] == cpu.losses[r]);  // bitwise
      CHECK(dev.norms[r] == cpu.norms[r]);
      CHECK(dev.params[r] == cpu.params[r]);
      CHECK(dev.m[r] == cpu.m[r]);
      CHECK(dev.params[r] == reference[stage]);  // independent of dp
    }
    if (n > 1 && stage > 0) CHECK(dev.m[0] != dev.m[1]);  // each rank its own piece of the moments
  }
}

TEST_CASE("--deterministic with ZeRO 0/1/2 on that device: a restore through the host copies continues bit for bit") {
  for (int stage : {0, 1, 2}) {
    CAPTURE(stage);
    comm::run_local_world(2, [&](comm::Communicator& c) {
      ThreadPool pool(1);
      PlainDetRank a(c, pool, true, stage);
      a.trainer->step();
      a.trainer->step();
      const TrainerState st = a.trainer->state();
      const std::vector<float> params(st.params, st.params + st.num_params);
      const std::vector<float> m = stage > 0 ? a.shard_m() : std::vector<float>(st.adam_m, st.adam_m + st.num_params);
      const std::vector<float> v = stage > 0 ? a.shard_v() : std::vector<float>(st.adam_v, st.adam_v + st.num_params);
      REQUIRE(st.adam_t == 2);
      const double loss3 = a.trainer->step().loss;
      const TrainerState after = a.trainer->state();
      const std::vector<float> params3(after.params, after.params + after.num_params);
      CHECK(params3 != params);

      PlainDetRank b(c, pool, true, stage, 2);
      TrainerState rs = b.trainer->state();
      std::copy(params.begin(), params.end(), rs.params);
      std::copy(m.begin(), m.end(), stage > 0 ? b.sync->shard_m() : rs.adam_m);
      std::copy(v.begin(), v.end(), stage > 0 ? b.sync->shard_v() : rs.adam_v);
      rs.step = st.step;
      rs.adam_t = st.adam_t;
      b.trainer->restore_counters(rs);
      CHECK(b.trainer->step().loss == loss3);
      const TrainerState got = b.trainer->state();
      CHECK(std::vector<float>(got.params, got.params + got.num_params) == params3);
      if (stage > 0) CHECK(b.shard_m() == a.shard_m());
    });
  }
}

TEST_CASE(
    "--deterministic with dp=2 x tp=2 (ZeRO 0, 2) and dp=2 x pp=2 (ZeRO 1) on that device equals the CPU bitwise") {
  for (const auto& [layout, zero] :
       {std::pair{comm::Layout{.dp = 2, .tp = 2, .pp = 1}, 0}, std::pair{comm::Layout{.dp = 2, .tp = 2, .pp = 1}, 2},
        std::pair{comm::Layout{.dp = 2, .tp = 1, .pp = 2}, 1}}) {
    CAPTURE(zero);
    CAPTURE(layout.pp);
    const HybridRun cpu = train_hybrid(layout, false, zero, true), dev = train_hybrid(layout, true, zero, true);
    CHECK(dev.launches == 0);  // no bucket all-reduce: the tree's all_to_all and all_gather instead
    CHECK(dev.dp_device_calls >= static_cast<size_t>(2 * layout.world() * kHybridSteps));
    REQUIRE(cpu.losses[0].size() == static_cast<size_t>(kHybridSteps));
    CHECK(cpu.losses[0].back() < cpu.losses[0].front());
    for (int r = 0; r < layout.world(); ++r) {
      CAPTURE(r);
      CHECK(dev.losses[r] == cpu.losses[r]);  // bitwise
      for (int s = 0; s < kHybridSteps; ++s) {
        // ZeRO: the fixed-block norm over a host copy, the CPU's bits; otherwise the stage's device global_norm.
        if (zero > 0) CHECK(dev.norms[r][s] == cpu.norms[r][s]);
        CHECK(std::fabs(dev.norms[r][s] - cpu.norms[r][s]) <= 1e-12 * cpu.norms[r][s]);
      }
      CHECK(dev.params[r] == cpu.params[r]);
      if (zero > 0) CHECK(dev.shard_m[r] == cpu.shard_m[r]);
      if (zero == 0) CHECK(dev.m[r] == cpu.m[r]);
    }
    for (int r = 0; r < layout.world(); ++r) {
      if ((r / layout.tp) % layout.dp != 0) continue;
      CHECK(dev.params[r] == dev.params[r + layout.tp]);
    }
  }
}

namespace {

// Lazy host copies (issue #11): off the host, ZeRO's shard m/v and a ParallelGpt's parameters are copied to the host
// only when state() is asked for them (a checkpoint, a snapshot, an export) after an update, never inside a step.
constexpr int kSaveSteps = 7, kSaveEvery = 3;

// What one rank's checkpoint holds: state()'s parameters and ZeRO's shard of the moments (host memory).
struct Saved {
  std::vector<float> params, m, v;
};

struct SavingRun {
  std::vector<double> losses;
  std::map<int, Saved> saved;  // by steps taken
  // Per device->host copy the size of a state buffer (the parameters, the shard's m or v): the steps taken before it,
  // negated if it happened inside step() rather than in a save.
  std::vector<int> state_copies_after;
};

// kSaveSteps steps, with the checkpointer's view (Checkpointer::start_save/put_memory: state(), then the buffers
// behind it) taken at start, as checkpoint_shards does, and after every kSaveEvery-th and the last step.
SavingRun train_saving(Trainer& tr, DataParallel& sync, const ShadowCpu& dev, size_t num_params) {
  SavingRun run;
  auto is_state = [&](size_t bytes) {
    return bytes == num_params * sizeof(float) || bytes == sync.shard_size() * sizeof(float);
  };
  auto note = [&](size_t from, int mark) {
    for (size_t i = from; i < dev.downloads.size(); ++i)
      if (is_state(dev.downloads[i])) run.state_copies_after.push_back(mark);
  };
  auto save = [&](int step) {
    const size_t from = dev.downloads.size();
    const TrainerState st = tr.state();
    REQUIRE(st.num_params == num_params);
    CHECK_FALSE(dev.owns(st.params));
    CHECK_FALSE(dev.owns(sync.shard_m()));
    Saved& s = run.saved[step];
    s.params.assign(st.params, st.params + st.num_params);
    s.m.assign(sync.shard_m(), sync.shard_m() + sync.shard_size());
    s.v.assign(sync.shard_v(), sync.shard_v() + sync.shard_size());
    note(from, step);
    const size_t again = dev.downloads.size();
    tr.state();  // no update since the last view: nothing to copy
    CHECK(dev.downloads.size() == again);
  };
  save(0);
  for (int s = 1; s <= kSaveSteps; ++s) {
    const size_t from = dev.downloads.size();
    run.losses.push_back(tr.step().loss);
    note(from, -s);
    if (s % kSaveEvery == 0 || s == kSaveSteps) save(s);
  }
  return run;
}

using testing::close_to;

// The saves at start (the parameters only: nothing was updated, the moments are the zeros the host copies hold) and
// after steps 3, 6 and 7 (parameters, m, v); none inside a step. Before the copies were lazy, every step's update
// downloaded the shard's m and v (and a ParallelGpt its parameters and its own unused full-size m and v).
const std::vector<int> kWantCopies = {0, 3, 3, 3, 6, 6, 6, 7, 7, 7};

void check_saves_follow_cpu(const SavingRun& dev, const SavingRun& cpu) {
  CHECK(dev.state_copies_after == kWantCopies);
  CHECK(cpu.state_copies_after.empty());  // the CPU's state() is read in place
  REQUIRE(dev.losses.size() == cpu.losses.size());
  testing::check_losses_close(dev.losses, cpu.losses);
  CHECK(cpu.losses.back() < cpu.losses.front());
  for (int step : {3, 6, 7}) {
    CAPTURE(step);
    // The values of this step, not of an earlier one: a stale copy is a whole AdamW step away.
    CHECK(close_to(dev.saved.at(step).params, cpu.saved.at(step).params));
    CHECK(close_to(dev.saved.at(step).m, cpu.saved.at(step).m));
    CHECK(close_to(dev.saved.at(step).v, cpu.saved.at(step).v));
  }
  CHECK(dev.saved.at(6).params != dev.saved.at(7).params);
  CHECK(dev.saved.at(6).m != dev.saved.at(7).m);
}

// Restores `from` (the view after `step` steps) into a fresh run's host copies as the checkpointer does (write through
// state() and the shard pointers, then restore_counters()) and takes one step.
double restore_and_step(Trainer& tr, DataParallel& sync, const Saved& from, int step) {
  TrainerState rs = tr.state();
  std::copy(from.params.begin(), from.params.end(), rs.params);
  std::copy(from.m.begin(), from.m.end(), sync.shard_m());
  std::copy(from.v.begin(), from.v.end(), sync.shard_v());
  rs.step = step;
  rs.adam_t = step;
  tr.restore_counters(rs);
  return tr.step().loss;
}

}  // namespace

TEST_CASE("ZeRO-1/2 with dp=2 x tp=2 on that device: state copied to the host only on save steps, no model m/v") {
  const comm::Layout layout{.dp = 2, .tp = 2, .pp = 1};
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    comm::run_local_world(layout.world(), [&](comm::Communicator& world) {
      comm::ProcessGroups groups(world, layout);
      ThreadPool pool(1);
      DeviceZeroRank cpu(world, groups, layout, pool, 0, stage, false, kSaveSteps);
      const SavingRun on_cpu = train_saving(*cpu.trainer, *cpu.sync, cpu.dev, cpu.model->num_params());
      DeviceZeroRank a(world, groups, layout, pool, 0, stage, true, kSaveSteps);
      const SavingRun on_dev = train_saving(*a.trainer, *a.sync, a.dev, a.model->num_params());
      check_saves_follow_cpu(on_dev, on_cpu);

      // The model holds no AdamW moments of its own on the device (the sync's shard is the optimizer state): its
      // device memory is the bare stage's, and training and saving allocate nothing more.
      CHECK(a.model->device_moment_bytes() == 0);
      ShadowCpu bare(pool);
      ModelGroups mg = model_groups(groups);
      auto bare_comms = take_device_memory(mg, bare);
      ParallelModel stage_only(kCfg, kB, kT, 2, pool, mg, {}, a.tc.recompute, a.tc.sequence_parallel, &bare);
      CHECK(a.model_bytes == bare.used());
      CHECK(a.dev.used() == a.setup_bytes);

      // A restore of step 6's save continues bit for bit: step 7's loss, parameters and moments.
      DeviceZeroRank b(world, groups, layout, pool, 6, stage, true, kSaveSteps);
      CHECK(restore_and_step(*b.trainer, *b.sync, on_dev.saved.at(6), 6) == on_dev.losses[6]);
      const TrainerState got = b.trainer->state();
      CHECK(std::vector<float>(got.params, got.params + got.num_params) == on_dev.saved.at(7).params);
      CHECK(std::vector<float>(b.sync->shard_m(), b.sync->shard_m() + b.sync->shard_size()) == on_dev.saved.at(7).m);
      CHECK(std::vector<float>(b.sync->shard_v(), b.sync->shard_v() + b.sync->shard_size()) == on_dev.saved.at(7).v);
    });
  }
}

TEST_CASE("ZeRO-1/2 with the plain Gpt trainer on that device (dp=1, 2): state copied to the host only on save steps") {
  for (const auto& [stage, n] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{2, 1}}) {
    CAPTURE(stage);
    CAPTURE(n);
    comm::run_local_world(n, [&](comm::Communicator& c) {
      ThreadPool pool(1);
      const size_t P = num_parameters(kCfg);
      // The plain Gpt trainer with ZeRO over dp = c.size(), 2 micro-batches per rank a step.
      const TrainConfig tc = testing::small_train_config(kSaveSteps, kB, kT, 2 * c.size(), 1e-2);
      testing::DeviceDpTrainer cpu(c, pool, kCfg, tc, 16 << 10, stage, false, /*device=*/false);
      const SavingRun on_cpu = train_saving(cpu.trainer, *cpu.sync, cpu.dev, P);
      testing::DeviceDpTrainer a(c, pool, kCfg, tc, 16 << 10, stage, false, /*device=*/true);
      const SavingRun on_dev = train_saving(a.trainer, *a.sync, a.dev, P);
      check_saves_follow_cpu(on_dev, on_cpu);

      // restored at step 6: its loader 2 x 6 batches in
      testing::DeviceDpTrainer b(c, pool, kCfg, tc, 16 << 10, stage, false, /*device=*/true, /*first_batch=*/2 * 6);
      CHECK(restore_and_step(b.trainer, *b.sync, on_dev.saved.at(6), 6) == on_dev.losses[6]);
      const TrainerState got = b.trainer.state();
      CHECK(std::vector<float>(got.params, got.params + got.num_params) == on_dev.saved.at(7).params);
      CHECK(std::vector<float>(b.sync->shard_m(), b.sync->shard_m() + b.sync->shard_size()) == on_dev.saved.at(7).m);
      CHECK(std::vector<float>(b.sync->shard_v(), b.sync->shard_v() + b.sync->shard_size()) == on_dev.saved.at(7).v);
    });
  }
}
