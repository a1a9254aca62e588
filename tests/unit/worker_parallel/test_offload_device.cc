// Optimizer offload on a device that is not the host (issue #11): the update thread moves each parameter group
// through the device's side copies (Kernels::side_to_host/side_to_device, CUDA's copy stream) while the main thread's
// next forward runs kernels on the same device. Run on ShadowCpu (CPU kernels behind addresses the host cannot touch,
// CUDA's bf16 weight copy emulated exactly) against the CPU: losses, grad norms, validation losses, parameters and
// moments bitwise equal; the moments never on the device; the copies' byte counts; a restore through state()'s host
// copies continuing bit for bit; a failed copy on the update thread reaching the caller. In the TSan set
// (tests/fuzz/CMakeLists.txt): the update thread copies while the main thread runs kernels.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tests/unit/worker/shadow_cpu.h"
#include "tests/unit/worker_parallel/offload_test_util.h"
#include "tests/unit/worker_parallel/shadow_device.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/optim/offload.h"
#include "worker/parallel/data_parallel.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using railyard::worker::testing::DeviceComm;
using railyard::worker::testing::ShadowCpu;
namespace comm = railyard::worker::comm;
using railyard::worker::parallel::DataParallelOptions;
using railyard::worker::parallel::gpt_data_parallel;

namespace {

const GptConfig kCfg = make_gpt_config(/*L=*/2, /*C=*/64, /*NH=*/4, /*maxT=*/32, /*V=*/256);
constexpr int kB = 2, kT = 32, kMicro = 3, kSteps = 6;

TrainConfig train_config(OffloadMode offload, int offload_threads = 1) {
  TrainConfig tc = testing::offload_train_config(kSteps, kB, kT, kMicro, offload, offload_threads);
  tc.val_steps = 2;
  return tc;
}

using Run = testing::OffloadRun;
using testing::check_bitwise;
using testing::same_bits;

// `steps` steps; after every other step a validation pass, whose forward races the update still running.
Run train(Trainer& tr, BatchSource* val, int steps) { return testing::train_offload(tr, val, steps); }

// A run in one process; device null = the CPU.
Run single(OffloadMode offload, Kernels<float>* device, int offload_threads = 1) {
  ThreadPool pool(2);
  testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
  testing::StreamSource val(0, 1, kB, kT, kCfg.vocab_size);
  Trainer tr(kCfg, train_config(offload, offload_threads), pool, src, &val, nullptr, nullptr, device);
  return train(tr, &val, kSteps);
}

size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

TEST_CASE("offload on a device the host cannot touch equals the CPU bitwise (1 and 2 update threads)") {
  const Run cpu = single(OffloadMode::kNone, nullptr);
  CHECK(cpu.losses.back() < cpu.losses.front());  // it trains
  check_bitwise(single(OffloadMode::kOptimizer, nullptr), cpu);
  const size_t n = num_parameters(kCfg);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    ThreadPool pool(2);
    ShadowCpu dev(pool);
    const Run got = single(OffloadMode::kOptimizer, &dev, threads);
    check_bitwise(got, cpu);
    // Every step: gradients and parameters down, parameters up, once each, all through the side copies.
    CHECK(dev.side_downloaded == static_cast<size_t>(kSteps) * 2 * n * sizeof(float));
    CHECK(dev.side_uploaded == static_cast<size_t>(kSteps) * n * sizeof(float));
  }
}

TEST_CASE("offload off the host: no moments on the device, state() from host copies only when asked") {
  ThreadPool pool(2);
  const size_t n = num_parameters(kCfg);
  // The bare model's device bytes: what an offloading trainer may hold on the device.
  ShadowCpu bare(pool);
  { Gpt<float> model(kCfg, kB, kT, pool, RecomputeSpec{}, &bare); }
  testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
  ShadowCpu off_dev(pool), mem_dev(pool);
  Trainer off(kCfg, train_config(OffloadMode::kOptimizer), pool, src, nullptr, nullptr, nullptr, &off_dev);
  Trainer mem(kCfg, train_config(OffloadMode::kNone), pool, src, nullptr, nullptr, nullptr, &mem_dev);
  CHECK(off_dev.used() == bare.used());
  CHECK(mem_dev.used() == bare.used() + 2 * round64(n * sizeof(float)));  // the in-memory AdamW's m and v
  CHECK(off.allocated_memory().adam == 0);
  CHECK(off.allocated_memory().host == offload_host_bytes(kCfg));

  // Three steps without a state(): no state-sized download on the main thread (the update's own copies are the
  // side copies); state() then downloads the parameters once, never m or v (they are host memory already).
  const size_t state_bytes = n * sizeof(float);
  const auto state_downloads = [&] {
    return std::count(off_dev.downloads.begin(), off_dev.downloads.end(), state_bytes);
  };
  off.state();  // the initial download (the copies start stale)
  const auto at_start = state_downloads();
  for (int s = 0; s < 3; ++s) off.step();
  CHECK(state_downloads() == at_start);
  const TrainerState st = off.state();
  CHECK(state_downloads() == at_start + 1);
  off.state();
  CHECK(state_downloads() == at_start + 1);  // nothing changed since
  CHECK(st.adam_t == 3);
  CHECK(off_dev.used() == bare.used());  // training allocated nothing more on the device
  CHECK_FALSE(off_dev.owns(st.adam_m));
  CHECK_FALSE(off_dev.owns(st.params));
}

TEST_CASE("offload off the host: a restore through state()'s host copies continues bit for bit") {
  constexpr int kAt = 3;
  const Run cpu = single(OffloadMode::kNone, nullptr);
  ThreadPool pool(2);
  // The first kAt steps on the device, saved as the checkpointer does (the pointers of state()).
  Run saved;
  {
    ShadowCpu dev(pool);
    testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
    Trainer tr(kCfg, train_config(OffloadMode::kOptimizer), pool, src, nullptr, nullptr, nullptr, &dev);
    saved = train(tr, nullptr, kAt);
  }
  for (size_t i = 0; i < kAt; ++i) CHECK(saved.losses[i] == cpu.losses[i]);
  // A fresh run on another device (other seed: its own initial weights are not the checkpoint's), the loader kAt
  // steps in, the checkpoint written through state() and restore_counters() uploading it.
  ShadowCpu dev(pool);
  testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
  std::vector<int32_t> in(kB * kT), tgt(kB * kT);
  for (int i = 0; i < kAt * kMicro; ++i) src.next_batch(in.data(), tgt.data());
  TrainConfig tc = train_config(OffloadMode::kOptimizer);
  tc.seed = 1234;
  Trainer tr(kCfg, tc, pool, src, nullptr, nullptr, nullptr, &dev);
  TrainerState rs = tr.state();
  std::copy(saved.params.begin(), saved.params.end(), rs.params);
  std::copy(saved.m.begin(), saved.m.end(), rs.adam_m);
  std::copy(saved.v.begin(), saved.v.end(), rs.adam_v);
  rs.step = kAt;
  rs.adam_t = saved.adam_t;
  tr.restore_counters(rs);
  const Run rest = train(tr, nullptr, kSteps - kAt);
  for (int i = 0; i < kSteps - kAt; ++i) CHECK(rest.losses[i] == cpu.losses[kAt + i]);
  CHECK(rest.norms == std::vector<double>(cpu.norms.begin() + kAt, cpu.norms.end()));
  CHECK(rest.adam_t == kSteps);
  CHECK(same_bits(rest.params, cpu.params));
  CHECK(same_bits(rest.m, cpu.m));
  CHECK(same_bits(rest.v, cpu.v));
}

TEST_CASE("offload off the host with the deterministic data-parallel tree (dp=2) equals the CPU bitwise") {
  // The tree reduces device buffers over a device-memory communicator; then the norm on the device and the offloaded
  // update through the side copies. Each replica reads the job's whole micro-batch sequence (deterministic mode).
  auto run = [](bool device, OffloadMode offload) {
    std::vector<Run> runs(2);
    comm::run_local_world(2, [&](comm::Communicator& c) {
      ThreadPool pool(1);
      ShadowCpu dev(pool);
      testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
      TrainConfig tc = train_config(offload);
      tc.global_batch_tokens = static_cast<int64_t>(4) * kB * kT;  // 2 micro-batches per replica
      auto grad = c.dup("dp-grad");
      DeviceComm grad_dev(*grad, dev);
      const DataParallelOptions o = testing::device_dp_options(16 << 10, 0, true, device, dev, &grad_dev);
      auto sync = gpt_data_parallel(&c, kCfg, tc, pool, o);
      Trainer tr(kCfg, tc, pool, src, nullptr, sync.get(), nullptr, device ? &dev : nullptr);
      runs[c.rank()] = train(tr, nullptr, kSteps);
      if (device) CHECK(dev.side_uploaded == static_cast<size_t>(kSteps) * num_parameters(kCfg) * sizeof(float));
    });
    return runs;
  };
  const auto cpu = run(false, OffloadMode::kNone);
  const auto dev = run(true, OffloadMode::kOptimizer);
  CHECK(cpu[0].losses.back() < cpu[0].losses.front());
  check_bitwise(dev[0], cpu[0]);
  check_bitwise(dev[1], cpu[1]);
  check_bitwise(cpu[1], cpu[0]);
}

TEST_CASE("a copy failing on the update thread reaches the trainer and stays an error") {
  ThreadPool pool(2);
  ShadowCpu dev(pool);
  testing::StreamSource src(0, 1, kB, kT, kCfg.vocab_size);
  Trainer tr(kCfg, train_config(OffloadMode::kOptimizer), pool, src, nullptr, nullptr, nullptr, &dev);
  tr.step();
  tr.state();  // waits for step 1's update, so the failure below is step 2's
  CHECK(dev.side_copies > 0);
  dev.fail_side_uploads = true;
  tr.step();  // the update starts and fails on its thread
  // The next forward waits for group 0: the failure comes out there, and a state() (a checkpoint of partly
  // updated parameters) is refused the same way.
  CHECK_THROWS_WITH(tr.step(), doctest::Contains("side_to_device failed"));
  CHECK_THROWS_WITH(tr.state(), doctest::Contains("side_to_device failed"));
}
