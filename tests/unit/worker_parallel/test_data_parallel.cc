// Data parallelism and ZeRO through the real Trainer over real Gloo sockets (every rank a thread with its own TCP
// communicator): dp=2 and dp=4 train 10 steps to the same losses and parameters as one process with the same global
// batch (1e-5 relative); ZeRO-1 and ZeRO-2 equal plain dp; the deterministic mode gives bitwise-identical losses and
// parameters for dp=4, dp=2 x accumulation 2 and dp=1 x accumulation 4.
//
// Model: L2 C64 NH4 maxT32 V256 (about 120k parameters), B=2, T=32, 4 micro-batches per step: big enough for several
// buckets (with a small --bucket-mb) and a padded last bucket, small enough for ten steps of four ranks in seconds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker/shadow_cpu.h"
#include "tests/unit/worker_parallel/shadow_device.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/comm/stream_reducer.h"
#include "worker/parallel/data_parallel.h"
#include "worker/train/train_metrics.h"
#include "worker/train/trainer.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

namespace {

const GptConfig kCfg = make_gpt_config(/*L=*/2, /*C=*/64, /*NH=*/4, /*maxT=*/32, /*V=*/256);
constexpr int kB = 2, kT = 32, kMicro = 4, kSteps = 10;

TrainConfig train_config() {
  TrainConfig tc = testing::small_train_config(kSteps, kB, kT, kMicro, /*lr=*/3e-3, /*warmup_steps=*/2);
  tc.grad_clip = 1.0;
  return tc;
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<float> params;
};

Run single_process() {
  const testing::LayoutRun r = testing::run_single_trainer(kCfg, train_config());
  Run out{{}, {}, r.params};
  for (const StepResult& s : r.steps) {
    out.losses.push_back(s.loss);
    out.norms.push_back(s.grad_norm);
  }
  return out;
}

// dp ranks over real sockets; every rank's run is returned (they must agree with each other too).
std::vector<Run> data_parallel(int dp, DataParallelOptions opt) {
  std::vector<Run> runs(dp);
  comm::run_local_world(dp, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    // Deterministic mode reads the job's whole sequence on every rank and skips the other ranks' leaves.
    testing::StreamSource src(opt.deterministic ? 0 : c.rank(), opt.deterministic ? 1 : dp, kB, kT, kCfg.vocab_size);
    const TrainConfig tc = train_config();
    auto sync = gpt_data_parallel(&c, kCfg, tc, pool, opt);
    Trainer tr(kCfg, tc, pool, src, nullptr, sync.get());
    Run& out = runs[c.rank()];
    for (int s = 0; s < kSteps; ++s) {
      const StepResult r = tr.step();
      out.losses.push_back(r.loss);
      out.norms.push_back(r.grad_norm);
    }
    out.params.assign(tr.model().params(), tr.model().params() + tr.model().num_params());
  });
  return runs;
}

void check_close(const Run& got, const Run& want, double rel, const char* what) {
  INFO(what);
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s) {
    INFO("step " << s << ": loss " << got.losses[s] << " vs " << want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= rel * std::abs(want.losses[s]));
    CHECK(std::abs(got.norms[s] - want.norms[s]) <= 1e-4 * std::abs(want.norms[s]));
  }
  REQUIRE(got.params.size() == want.params.size());
  // Parameters: relative to the tensor scale (biases start at 0, so a pure per-element ratio means nothing there).
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.params.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(got.params[i] - want.params[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want.params[i])));
  }
  INFO("max |param diff| " << worst << " of max |param| " << scale);
  CHECK(worst <= rel * scale);
}

bool bitwise_equal(const Run& a, const Run& b) {
  return a.losses == b.losses && a.norms == b.norms && a.params.size() == b.params.size() &&
         std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("tree_sum is the pairwise tree: ((a+b)+(c+d))+e, not a left fold") {
  ThreadPool pool(1);
  // Values chosen so that every association order gives a different float.
  std::vector<std::vector<float>> v = {{1e8f}, {1.0f}, {-1e8f}, {0.75f}, {3.0f}};
  std::vector<float*> items;
  for (auto& x : v) items.push_back(x.data());
  tree_sum(items, 1, pool);
  const float want = ((1e8f + 1.0f) + (-1e8f + 0.75f)) + 3.0f;
  CHECK(items[0] == v[0].data());
  CHECK(v[0][0] == want);
  const float left_fold = (((1e8f + 1.0f) + -1e8f) + 0.75f) + 3.0f;
  CHECK(want != left_fold);  // otherwise this test could not tell the trees apart
}

TEST_CASE("BucketLayout: buckets are multiples of dp, pieces tile the buffer once") {
  for (int dp : {1, 2, 3, 4}) {
    const size_t n = 1003;
    BucketLayout L(n, dp, 100);
    std::vector<int> seen(n, 0);
    size_t shard = 0;
    for (size_t b = 0; b < L.buckets().size(); ++b) {
      const auto& k = L.buckets()[b];
      if (b + 1 < L.buckets().size()) CHECK(k.size() % dp == 0);
      CHECK(L.bucket_of(k.begin) == b);
      CHECK(L.bucket_of(k.end - 1) == b);
      for (int r = 0; r < dp; ++r) {
        auto [s, e] = L.own(b, r);
        for (size_t i = s; i < e; ++i) ++seen[i];
      }
      shard += k.piece;
    }
    CHECK(shard == L.shard_size());
    CHECK(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; }));
  }
}

TEST_CASE("dp=2 and dp=4 equal one process with the same global batch (10 steps)") {
  const Run ref = single_process();
  CHECK(ref.losses.back() < ref.losses.front());  // it trains at all
  for (int dp : {2, 4}) {
    DataParallelOptions opt;
    opt.bucket_bytes = 64 << 10;  // several buckets, overlapped with backward
    const auto runs = data_parallel(dp, opt);
    for (int r = 0; r < dp; ++r) {
      CHECK(runs[r].losses == runs[0].losses);  // every replica reports the same loss bits
      CHECK(std::memcmp(runs[r].params.data(), runs[0].params.data(), runs[0].params.size() * sizeof(float)) == 0);
    }
    check_close(runs[0], ref, 1e-5, dp == 2 ? "dp=2" : "dp=4");
  }
}

TEST_CASE("ZeRO-1 and ZeRO-2 equal plain data parallelism") {
  DataParallelOptions plain;
  plain.bucket_bytes = 48 << 10;  // 12288 elements: the last bucket is padded for dp=2 and dp=4
  const auto base = data_parallel(2, plain);
  for (int stage : {1, 2}) {
    DataParallelOptions z = plain;
    z.zero_stage = stage;
    const auto runs = data_parallel(2, z);
    CHECK(std::memcmp(runs[1].params.data(), runs[0].params.data(), runs[0].params.size() * sizeof(float)) == 0);
    check_close(runs[0], base[0], 1e-5, stage == 1 ? "zero-1" : "zero-2");
  }
  DataParallelOptions z4 = plain;
  z4.zero_stage = 2;
  const auto four = data_parallel(4, z4);
  check_close(four[3], single_process(), 1e-5, "zero-2 dp=4");
}

TEST_CASE("deterministic mode: dp=4, dp=2 x 2 and dp=1 x 4 are bitwise identical, also with ZeRO-1/2") {
  DataParallelOptions det;
  det.deterministic = true;
  const auto d1 = data_parallel(1, det);
  const auto d2 = data_parallel(2, det);
  const auto d4 = data_parallel(4, det);
  CHECK(d1[0].losses.back() < d1[0].losses.front());
  CHECK(bitwise_equal(d2[0], d1[0]));
  CHECK(bitwise_equal(d2[1], d1[0]));
  CHECK(bitwise_equal(d4[0], d1[0]));
  CHECK(bitwise_equal(d4[3], d1[0]));
  // And it is the same training as the ordinary mode, up to rounding.
  check_close(d1[0], single_process(), 1e-5, "deterministic vs plain");
  // With ZeRO the reduced gradient stays sharded (all_to_all chunks = ZeRO pieces) and the norm is summed over fixed
  // blocks: still bitwise independent of dp.
  for (int stage : {1, 2}) {
    DataParallelOptions z = det;
    z.zero_stage = stage;
    const auto z1 = data_parallel(1, z), z2 = data_parallel(2, z), z4 = data_parallel(4, z);
    INFO("zero " << stage);
    CHECK(bitwise_equal(z2[1], z1[0]));
    CHECK(bitwise_equal(z4[0], z1[0]));
    CHECK(bitwise_equal(z4[3], z1[0]));
    check_close(z4[2], d1[0], 1e-5, "deterministic zero vs deterministic");
  }
}

TEST_CASE("bad options are refused with the flag named") {
  // (--deterministic with --zero is supported: see the deterministic test.)
  ThreadPool pool(1);
  DataParallelOptions o;
  o.zero_stage = 3;
  CHECK_THROWS_WITH_AS(gpt_data_parallel(nullptr, kCfg, train_config(), pool, o), doctest::Contains("--zero 3"),
                       railyard::ConfigError);
  // 4 micro-batches do not divide over 3 replicas.
  comm::run_local_world(3, [&](comm::Communicator& c) {
    ThreadPool p(1);
    testing::StreamSource src(c.rank(), 3, kB, kT, kCfg.vocab_size);
    auto sync = gpt_data_parallel(&c, kCfg, train_config(), p, {});
    CHECK_THROWS_WITH_AS(Trainer(kCfg, train_config(), p, src, nullptr, sync.get()),
                         doctest::Contains("--global-batch"), railyard::ConfigError);
  });
}

namespace {

// What the data-parallel reducer enqueued on a StreamReducer and when: a decorator around the host twin (which
// reduces with real Gloo collectives at once, over a wrapper that takes the device's addresses). Per enqueue the
// bucket's offset in the gradient buffer and whether the step's backward was over yet (the test device counts
// encoder_backward, the last kernel of a backward, when it is enqueued).
class Recorder final : public comm::StreamReducer {
 public:
  Recorder(comm::Communicator& c, testing::ShadowCpu& dev) : twin_(comm::host_stream_reducer(c)), dev_(dev) {}
  void all_reduce(void* buf, size_t count, comm::DType t, comm::ReduceOp op) override {
    // The NCCL reducer orders the reduction after the compute stream's work so far (an event): run those kernels.
    dev_.drain();
    launches.push_back({static_cast<const float*>(buf) - grads, count, dev_.encoder_backwards});
    twin_->all_reduce(buf, count, t, op);
  }
  void wait() override {
    waits.push_back(twin_->pending());
    twin_->wait();
  }
  size_t pending() const override { return twin_->pending(); }
  struct Launch {
    ptrdiff_t offset;
    size_t count;
    size_t backwards_done;
  };
  std::vector<Launch> launches;
  std::vector<size_t> waits;  // pending reductions at each wait()
  const float* grads = nullptr;

 private:
  std::unique_ptr<comm::StreamReducer> twin_;
  testing::ShadowCpu& dev_;
};

// The order in which buckets must be launched: replay the ranges Gpt::backward reports (lnf, then each layer's 12
// slices from the top layer down, then wte and wpe) over a per-element bitmap; a bucket goes when its last element
// does, buckets finished by one report in buffer order.
std::vector<size_t> expected_launch_order(const GptConfig& c, const BucketLayout& layout) {
  const auto sizes = param_sizes(c);
  std::vector<size_t> off(kNumParamTensors, 0);
  for (int i = 1; i < kNumParamTensors; ++i) off[i] = off[i - 1] + sizes[i - 1];
  std::vector<std::pair<size_t, size_t>> reports = {{off[14], sizes[14]}, {off[15], sizes[15]}};
  const size_t L = static_cast<size_t>(c.num_layers);
  for (size_t l = L; l-- > 0;)
    for (int i = 2; i < 14; ++i) reports.push_back({off[i] + l * (sizes[i] / L), sizes[i] / L});
  reports.push_back({off[0], sizes[0]});
  reports.push_back({off[1], sizes[1]});
  std::vector<bool> seen(num_parameters(c), false);
  std::vector<bool> launched(layout.buckets().size(), false);
  std::vector<size_t> order;
  for (const auto& [o, n] : reports) {
    for (size_t i = o; i < o + n; ++i) seen[i] = true;
    for (size_t b = 0; b < layout.buckets().size(); ++b) {
      const auto& k = layout.buckets()[b];
      if (launched[b] || !std::all_of(seen.begin() + k.begin, seen.begin() + k.end, [](bool x) { return x; })) continue;
      launched[b] = true;
      order.push_back(b);
    }
  }
  return order;
}

}  // namespace

TEST_CASE("device buffers: buckets go to a StreamReducer as backward finishes them, equal to the host path bitwise") {
  DataParallelOptions opt;
  opt.bucket_bytes = 64 << 10;  // 16384 floats: 8 buckets of ~120k parameters
  const auto host = data_parallel(2, opt);
  std::vector<Run> runs(2);
  comm::run_local_world(2, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    testing::StreamSource src(c.rank(), 2, kB, kT, kCfg.vocab_size);
    testing::ShadowCpu dev(pool);  // the gradient buffer is "device" memory: only the reducer may touch it
    auto grad = c.dup("dp-grad");
    testing::DeviceComm grad_dev(*grad, dev);
    Recorder rec(grad_dev, dev);
    DataParallelOptions o = opt;
    o.stream_reducer = &rec;
    const TrainConfig tc = train_config();
    auto sync = gpt_data_parallel(&c, kCfg, tc, pool, o);
    CHECK(sync->device_buffers());
    Trainer tr(kCfg, tc, pool, src, nullptr, sync.get(), nullptr, &dev);
    rec.grads = tr.model().grads();
    Run& out = runs[c.rank()];
    for (int s = 0; s < kSteps; ++s) {
      const StepResult r = tr.step();
      out.losses.push_back(r.loss);
      out.norms.push_back(r.grad_norm);
    }
    const TrainerState st = tr.state();  // host copies of the device's parameters
    out.params.assign(st.params, st.params + st.num_params);

    // The schedule: every step launches every bucket once, in the order the model finishes them, each step's
    // launches waited for once by finish(); at least one bucket was launched while backward still ran (the
    // overlap), and the last one (wte) after it.
    const auto order = expected_launch_order(kCfg, sync->layout());
    const size_t nb = sync->layout().buckets().size();
    REQUIRE(nb >= 4);
    REQUIRE(order.size() == nb);
    REQUIRE(rec.launches.size() == nb * kSteps);
    CHECK(rec.waits == std::vector<size_t>(kSteps, nb));
    for (int s = 0; s < kSteps; ++s) {
      // The step's last micro-batch is backward number (s + 1) * A, A = kMicro / 2 micro-batches per replica.
      const size_t last_backward = static_cast<size_t>(s + 1) * (kMicro / 2);
      size_t during = 0;
      for (size_t j = 0; j < nb; ++j) {
        const auto& l = rec.launches[static_cast<size_t>(s) * nb + j];
        const auto& k = sync->layout().buckets()[order[j]];
        INFO("step " << s << " launch " << j);
        CHECK(l.offset == static_cast<ptrdiff_t>(k.begin));
        CHECK(l.count == k.size());
        if (l.backwards_done + 1 == last_backward) ++during;
        if (j + 1 == nb) CHECK(l.backwards_done == last_backward);
      }
      CHECK(during >= 1);
    }
  });
  CHECK(host[0].losses.back() < host[0].losses.front());
  // The same collectives on the same bits as the host path's background thread: the same training, bit for bit.
  CHECK(bitwise_equal(runs[0], host[0]));
  CHECK(bitwise_equal(runs[1], host[0]));
}

TEST_CASE(
    "device buffers: ZeRO and the deterministic mode with a reducer but no device are refused, so is a host-only one") {
  comm::run_local_world(2, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    testing::ShadowCpu dev(pool);
    auto twin = comm::host_stream_reducer(c);
    for (int what = 0; what < 2; ++what) {
      DataParallelOptions o;
      o.stream_reducer = twin.get();
      if (what == 0) {
        o.zero_stage = 1;
      } else {
        o.deterministic = true;
      }
      CHECK_THROWS_WITH_AS(gpt_data_parallel(&c, kCfg, train_config(), pool, o),
                           doctest::Contains(what == 0 ? "--zero" : "--deterministic"), railyard::ConfigError);
    }
    testing::StreamSource src(c.rank(), 2, kB, kT, kCfg.vocab_size);
    auto host_only = gpt_data_parallel(&c, kCfg, train_config(), pool, {});
    CHECK_FALSE(host_only->device_buffers());
    CHECK_THROWS_WITH_AS(Trainer(kCfg, train_config(), pool, src, nullptr, host_only.get(), nullptr, &dev),
                         doctest::Contains("host buffers"), railyard::ConfigError);
  });
}

TEST_CASE("the step's time split reaches the log fields and railyard_worker_step_phase_seconds_total") {
  comm::run_local_world(2, [&](comm::Communicator& c) {
    ThreadPool pool(1);
    testing::StreamSource src(c.rank(), 2, kB, kT, kCfg.vocab_size);
    auto sync = gpt_data_parallel(&c, kCfg, train_config(), pool, {});
    Trainer tr(kCfg, train_config(), pool, src, nullptr, sync.get());
    railyard::metrics::Registry registry;
    TrainMetrics m(registry, {{"rank", std::to_string(c.rank())}});
    const StepResult r = tr.step();
    m.on_step(r, kSteps);
    CHECK(r.times.compute > 0);
    CHECK(r.times.dp_comm > 0);  // at least the loss gather is data-parallel communication
    CHECK(r.times.optimizer > 0);
    CHECK(r.times.tp_comm == 0);
    CHECK(r.times.total() <= r.seconds * 1.01 + 1e-4);  // the phases do not overlap in wall time
    const std::string text = registry.serialize();
    CHECK(text.find("railyard_worker_step_phase_seconds_total{") != std::string::npos);
    CHECK(text.find("phase=\"dp_comm\"") != std::string::npos);
  });
}
