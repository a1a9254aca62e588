// Tensor- and pipeline-parallel GPT against the single-process Gpt<float>, over real Gloo sockets (every rank a
// thread with its own TCP communicator): the loss of M micro-batches and every gradient, gathered into the full llm.c
// buffer, agree within 1e-5 relative for tp=2, tp=4, pp=2, pp=4 and tp=2 x pp=2.
//
// Model: L4 C32 NH4 maxT16 V100 (Vp 128), the smallest shape where tp=4 (one head per rank, 32 wte rows per rank,
// the last rank's rows partly padding) and pp=4 (one layer per stage) are both meaningful. B=2, T=8 (< maxT, so
// the unused wpe rows must get zero gradient).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_parallel/trainer_test_util.h"
#include "worker/comm/local_world.h"
#include "worker/model/gpt.h"
#include "worker/parallel/parallel_model.h"

using namespace railyard::worker;
using namespace railyard::worker::parallel;
namespace comm = railyard::worker::comm;

namespace {

const GptConfig kCfg = make_gpt_config(/*L=*/4, /*C=*/32, /*NH=*/4, /*maxT=*/16, /*V=*/100);
constexpr int kB = 2, kT = 8;
constexpr uint64_t kSeed = 42;

using Data = railyard::worker::testing::TokenData;
Data make_data(int M, uint32_t seed = 11) {
  return railyard::worker::testing::random_tokens(M, kB, kT, kCfg.vocab_size, seed);
}

using Reference = testing::AccumulatedGrads;

// Gradient accumulation over M micro-batches in one process, each weighted 1/M.
Reference reference(const Data& d, int M) { return testing::accumulate_grads(kCfg, kB, kT, kSeed, d, M); }

using testing::rel_err;

struct Result {
  std::vector<double> losses;  // per rank
  std::vector<double> sumsq;   // per rank: sum_squares_once(grads)
  std::vector<float> grads;    // gathered primary slices
  std::vector<float> tied;     // the last stage's wte copy (pp > 1), gathered into a full buffer
  std::vector<StepTimes> times;
  std::vector<size_t> act_bytes;  // per rank
};

// Runs dp x tp x pp ranks with the worker's process groups (rank = tp + T*(dp + D*pp)). `d` holds dp*M micro-batches:
// replica r takes [r*M, (r+1)*M). With dp > 1 the gradients are averaged over the dp group by a plain all-reduce
// (what the data-parallel reducer does) and the losses likewise.
Result run_parallel(int tp, int pp, const Data& d, int M, bool finish = true, int dp = 1,
                    const RecomputeSpec& recompute = {}) {
  const int n = dp * tp * pp;
  Result res;
  res.losses.assign(n, 0);
  res.sumsq.assign(n, 0);
  res.times.assign(n, StepTimes{});
  res.act_bytes.assign(n, 0);
  res.grads.assign(num_parameters(kCfg), 0);
  res.tied.assign(num_parameters(kCfg), 0);
  std::mutex mu;
  comm::run_local_world(n, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = dp, .tp = tp, .pp = pp});
    const int rank = world.rank(), replica = groups.coord().dp;
    ThreadPool pool(1);
    ParallelModel model(kCfg, kB, kT, M, pool, model_groups(groups), {}, recompute);
    model.init_weights(kSeed);
    model.zero_grad();
    const size_t N = kB * kT;
    StepTimes t;
    double loss = model.forward_backward(M, testing::micro_batches(d.in, d.tgt, replica * M, N), 1.0f / (M * dp), &t);
    if (finish) model.finish_grads(&t);
    if (dp > 1) {
      groups.dp().all_reduce(model.grads(), model.num_params(), comm::DType::kFloat32, comm::ReduceOp::kSum);
      float l = static_cast<float>(loss);
      groups.dp().all_reduce(&l, 1, comm::DType::kFloat32, comm::ReduceOp::kAvg);
      loss = l;
    }
    const double sq = model.sum_squares_once(model.grads());
    const std::string desc = model.describe();
    CHECK(desc.find("stage " + std::to_string(groups.coord().pp) + "/" + std::to_string(pp)) == 0);
    CHECK(model.activation_bytes() > 0);
    std::lock_guard<std::mutex> lock(mu);
    res.losses[rank] = loss;
    res.sumsq[rank] = sq;
    res.times[rank] = t;
    res.act_bytes[rank] = model.activation_bytes();
    if (replica != 0) return;  // the replicas now hold the same gradients
    std::vector<ShardSlice> primary, copies;
    for (const ShardSlice& sl : model.shard_map()) (sl.tied_copy ? copies : primary).push_back(sl);
    copy_local_to_full(primary, kCfg, model.grads(), res.grads.data());
    copy_local_to_full(copies, kCfg, model.grads(), res.tied.data());
  });
  return res;
}

void check_equal(const Result& got, const Reference& ref, int pp) {
  for (double l : got.losses) CHECK(std::fabs(l - ref.loss) <= 1e-5 * std::fabs(ref.loss));
  const auto sizes = param_sizes(kCfg);
  size_t off = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    CAPTURE(kParamNames[i]);
    const double e = rel_err(got.grads.data() + off, ref.grads.data() + off, sizes[i]);
    CHECK(e <= 1e-5);
    off += sizes[i];
  }
  // the replica-wide sum of squares counts every llm.c element once, the same on every rank
  double ref_sq = 0;
  for (float x : ref.grads) ref_sq += double(x) * x;
  for (double sq : got.sumsq) {
    CHECK(std::fabs(sq - ref_sq) <= 1e-5 * ref_sq);
    CHECK(sq == got.sumsq[0]);  // identical bits on every rank: clipping and NaN skips agree
  }
  if (pp > 1) {  // the tied copy took the same summed gradient
    CHECK(rel_err(got.tied.data(), ref.grads.data(), sizes[0]) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("tensor parallel tp=2 and tp=4 equal the single process") {
  const int M = 2;
  const Data d = make_data(M);
  const Reference ref = reference(d, M);
  for (int tp : {2, 4}) {
    CAPTURE(tp);
    const Result r = run_parallel(tp, 1, d, M);
    check_equal(r, ref, 1);
    for (const StepTimes& t : r.times) CHECK(t.tp_comm > 0);
  }
}

TEST_CASE("pipeline parallel pp=2 and pp=4 (1F1B) equal the single process") {
  for (int M : {1, 3, 6}) {  // one micro-batch, M < pp (warm-up capped), M > pp (steady state, slot reuse)
    const Data d = make_data(M);
    const Reference ref = reference(d, M);
    for (int pp : {2, 4}) {
      CAPTURE(M);
      CAPTURE(pp);
      const Result r = run_parallel(1, pp, d, M);
      check_equal(r, ref, pp);
      // every stage but the first waits for activations at least once: the bubble is measured, not zero
      for (int s = 1; s < pp; ++s) CHECK(r.times[s].pp_wait > 0);
    }
  }
}

TEST_CASE("tp=2 x pp=2 equals the single process") {
  const int M = 4;
  const Data d = make_data(M);
  const Reference ref = reference(d, M);
  check_equal(run_parallel(2, 2, d, M), ref, 2);
}

TEST_CASE("dp=2 x tp=2 x pp=2: each replica's pipeline, averaged over dp, equals the single process") {
  const int M = 2, dp = 2;  // the reference runs all dp*M micro-batches
  const Data d = make_data(M * dp);
  const Reference ref = reference(d, M * dp);
  check_equal(run_parallel(2, 2, d, M, true, dp), ref, 2);
}

TEST_CASE("without the tied-embedding all-reduce the wte gradient is wrong (the check can fail)") {
  const int M = 2;
  const Data d = make_data(M);
  const Reference ref = reference(d, M);
  const Result r = run_parallel(1, 2, d, M, /*finish=*/false);
  CHECK(rel_err(r.grads.data(), ref.grads.data(), param_sizes(kCfg)[0]) > 1e-3);
}

TEST_CASE("three SGD steps and a validation pass: tp=2 x pp=2 parameters and losses follow the single process") {
  // SGD (p -= lr g) is elementwise, so it runs on the local shards unchanged; after each step the parameters,
  // including both copies of the tied wte, must still be the single-process ones.
  const int M = 2, steps = 3;
  const float lr = 0.5f;
  std::vector<Data> data;
  for (int s = 0; s < steps; ++s) data.push_back(make_data(M, 100 + s));  // different batches per step
  ThreadPool ref_pool(1);
  Gpt<float> ref(kCfg, kB, kT, ref_pool);
  ref.init_weights(kSeed);
  std::vector<double> ref_losses;
  const size_t N = kB * kT;
  for (const Data& d : data) {
    double loss = 0;
    for (int m = 0; m < M; ++m) {
      loss += ref.forward(d.in.data() + m * N, d.tgt.data() + m * N, Gpt<float>::Mode::kTrain, 1.0f / M);
      ref.backward(m > 0);
    }
    ref_losses.push_back(loss / M);
    for (size_t i = 0; i < ref.num_params(); ++i) ref.params()[i] -= lr * ref.grads()[i];
  }
  const double ref_eval = ref.forward(data[0].in.data(), data[0].tgt.data(), Gpt<float>::Mode::kEval);

  const int tp = 2, pp = 2;
  std::vector<float> params(num_parameters(kCfg), 0), tied(num_parameters(kCfg), 0);
  std::vector<std::vector<double>> losses(tp * pp);
  std::vector<double> evals(tp * pp);
  std::mutex mu;
  comm::run_local_world(tp * pp, [&](comm::Communicator& world) {
    comm::ProcessGroups groups(world, comm::Layout{.dp = 1, .tp = tp, .pp = pp});
    ThreadPool pool(1);
    ParallelModel model(kCfg, kB, kT, M, pool, model_groups(groups));
    model.init_weights(kSeed);
    std::vector<double> mine;
    for (const Data& d : data) {
      model.zero_grad();
      mine.push_back(model.forward_backward(M, testing::micro_batches(d.in, d.tgt, 0, N), 1.0f / M));
      model.finish_grads();
      for (size_t i = 0; i < model.num_params(); ++i) model.params()[i] -= lr * model.grads()[i];
    }
    const double eval = model.evaluate(1, testing::micro_batches(data[0].in, data[0].tgt, 0, N));
    std::lock_guard<std::mutex> lock(mu);
    losses[world.rank()] = mine;
    evals[world.rank()] = eval;
    std::vector<ShardSlice> primary, copies;
    for (const ShardSlice& sl : model.shard_map()) (sl.tied_copy ? copies : primary).push_back(sl);
    copy_local_to_full(primary, kCfg, model.params(), params.data());
    copy_local_to_full(copies, kCfg, model.params(), tied.data());
  });
  for (int r = 0; r < tp * pp; ++r) {
    for (int s = 0; s < steps; ++s) CHECK(std::fabs(losses[r][s] - ref_losses[s]) <= 1e-5 * ref_losses[s]);
    CHECK(std::fabs(evals[r] - ref_eval) <= 1e-5 * ref_eval);
  }
  CHECK(ref_losses[2] < ref_losses[0] + 1.0);  // sanity: the steps did not blow up
  const auto sizes = param_sizes(kCfg);
  size_t off = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    CAPTURE(kParamNames[i]);
    CHECK(rel_err(params.data() + off, ref.params() + off, sizes[i]) <= 1e-5);
    off += sizes[i];
  }
  CHECK(rel_err(tied.data(), ref.params(), sizes[0]) <= 1e-5);  // the last stage's wte copy moved alike
}

TEST_CASE("a token outside the vocabulary fails every rank with the same clear error") {
  const int M = 1;
  std::atomic<int> errors{0};
  CHECK_THROWS_WITH(comm::run_local_world(2,
                                          [&](comm::Communicator& world) {
                                            comm::ProcessGroups groups(world, comm::Layout{.dp = 1, .tp = 1, .pp = 2});
                                            ThreadPool pool(1);
                                            ParallelModel model(kCfg, kB, kT, M, pool, model_groups(groups));
                                            try {
                                              model.forward_backward(
                                                  M,
                                                  [&](int32_t* in, int32_t* tgt) {
                                                    for (int i = 0; i < kB * kT; ++i) in[i] = tgt[i] = 1;
                                                    tgt[5] = 100;  // V = 100
                                                  },
                                                  1.0f);
                                            } catch (const railyard::Error&) {
                                              ++errors;
                                              throw;
                                            }
                                          }),
                    doctest::Contains("micro-batch 0: target token 100 at position 5 is outside the vocabulary"));
  CHECK(errors == 2);  // both stages refused before any communication
}

TEST_CASE("the grad-ready hook reports every local gradient once, already final") {
  const int M = 3;
  const Data d = make_data(M);
  for (int pp : {1, 2}) {
    CAPTURE(pp);
    const int tp = 2;
    std::atomic<int> ok_ranks{0};
    comm::run_local_world(tp * pp, [&](comm::Communicator& world) {
      comm::ProcessGroups groups(world, comm::Layout{.dp = 1, .tp = tp, .pp = pp});
      ThreadPool pool(1);
      ParallelModel model(kCfg, kB, kT, M, pool, model_groups(groups));
      model.init_weights(kSeed);
      std::vector<int> seen(model.num_params(), 0);
      std::vector<float> snapshot(model.num_params(), 0);
      model.set_grad_ready_hook([&](size_t offset, size_t count) {
        for (size_t i = offset; i < offset + count; ++i) {
          ++seen[i];
          snapshot[i] = model.grads()[i];
        }
      });
      model.zero_grad();
      const size_t N = kB * kT;
      model.forward_backward(M, testing::micro_batches(d.in, d.tgt, 0, N), 1.0f / M);
      model.finish_grads();
      bool once = true, final = true;
      for (size_t i = 0; i < model.num_params(); ++i) {
        once = once && seen[i] == 1;
        final = final && snapshot[i] == model.grads()[i];
      }
      CHECK(once);
      CHECK(final);
      if (once && final) ++ok_ranks;
    });
    CHECK(ok_ranks == tp * pp);
  }
}

TEST_CASE("activation recomputation in the tp/pp stages leaves losses and gradients bitwise unchanged") {
  // tp=2 x pp=2 (each stage 2 layers; 1F1B with M=4 reuses slots, so the shared working set is refilled between
  // micro-batches) and pp=2 alone; recomputation of all layers or the first 3 (stage 1 mixes kinds).
  const int M = 4;
  const Data d = make_data(M);
  for (auto [tp, pp] : {std::pair{2, 2}, std::pair{1, 2}}) {
    const Result base = run_parallel(tp, pp, d, M);
    for (const RecomputeSpec& rc : {RecomputeSpec{Recompute::kFull, -1}, RecomputeSpec{Recompute::kSelective, -1},
                                    RecomputeSpec{Recompute::kFull, 3}}) {
      CAPTURE(tp);
      CAPTURE(pp);
      CAPTURE(describe(rc));
      const Result r = run_parallel(tp, pp, d, M, true, 1, rc);
      CHECK(r.losses == base.losses);
      CHECK(std::memcmp(r.grads.data(), base.grads.data(), r.grads.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(r.tied.data(), base.tied.data(), r.tied.size() * sizeof(float)) == 0);
      // Every rank saves when all layers recompute; with the first 3, the last stage (layers 2-3, one slot) trades
      // its layer 2 for the working set and breaks even, stage 0 (two slots) saves.
      size_t got = 0, want = 0;
      for (size_t k = 0; k < r.act_bytes.size(); ++k) {
        if (rc.layers < 0) CHECK(r.act_bytes[k] < base.act_bytes[k]);
        CHECK(r.act_bytes[k] <= base.act_bytes[k]);
        got += r.act_bytes[k];
        want += base.act_bytes[k];
      }
      CHECK(got < want);
    }
  }
}
