// The planner's cost model against hand-computed values and published numbers (each tolerance is written next to
// its source).
#include "planner/cost_model.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "common/error.h"
#include "planner/calibration.h"
#include "planner/search.h"

using namespace railyard::plan;

namespace {

ModelShape gpt3_175b() { return {"gpt3-175b", 96, 12288, 96, 2048, 50257}; }

Cluster a100_cluster(int gpus) {
  Cluster c;
  c.device = builtin_profile("a100");
  c.gpus = gpus;
  c.topology.origin = "default";
  c.topology.gpus_per_node = 8;
  return c;
}

double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

}  // namespace

TEST_CASE("parameter count and model FLOPs per token") {
  // GPT-3 paper (Brown et al. 2020, Table 2.1): 175.0B parameters; our count (tied embedding, learned positions)
  // must agree to 0.5%.
  CHECK(rel(parameter_count(gpt3_175b()), 175.0e9) < 0.005);
  // Hand count for L2 h8 s4 V10: per layer 12*64 + 13*8 = 872; embeddings 10*8 + 4*8; final layernorm 16.
  const ModelShape small{"small", 2, 8, 2, 4, 10};
  CHECK(parameter_count(small) == doctest::Approx(2 * 872 + 80 + 32 + 16));
  // FLOPs per token, derived the other way: 6 x (matrix parameters incl. the LM head) + the attention core 12*L*h*s.
  CHECK(model_flops_per_token(small) == doctest::Approx(6.0 * (2 * 12 * 64 + 10 * 8) + 12.0 * 2 * 8 * 4));
}

TEST_CASE("ZeRO stages: the ZeRO paper's 7.5B example on 64 GPUs with K = 12") {
  // Rajbhandari et al. 2020, Figure 1: 7.5B parameters, Nd = 64, K = 12, 2-byte weights and gradients:
  // 120 / 31.4 / 16.6 / 1.9 GB for stages 0-3. Tolerance: half the last printed digit (0.5 GB, then 0.05 GB).
  DeviceProfile d = builtin_profile("a100");
  d.grad_bytes = 2;  // the paper's mixed-precision accounting (fp16 gradients)
  d.memory_bytes = 1e15;
  Cluster c{d, {}, 64};
  c.topology.origin = "default";
  const ModelShape m{"7.5b", 36, 4096, 32, 2048, 51200};
  const Job job{m, 64, 0};
  const double paper_gb[] = {120, 31.4, 16.6, 1.9};
  const double tolerance_gb[] = {0.5, 0.05, 0.05, 0.05};
  double previous = 1e30;
  for (int stage = 0; stage <= 3; ++stage) {
    const Estimate e = estimate(job, c, Layout{64, 1, 1, 1, stage, Recompute::kFull, false, 1});
    const double psi = e.params_per_gpu, n = 64;
    const double states = e.memory.params + e.memory.grads + e.memory.optimizer;
    // Exact: the paper's formulas with our parameter count.
    const double expect[] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
    CHECK(states == doctest::Approx(expect[stage]).epsilon(1e-12));
    // Scaled to the paper's 7.5B.
    CHECK(std::abs(states / psi * 7.5e9 / 1e9 - paper_gb[stage]) <= tolerance_gb[stage]);
    CHECK(states < previous);
    previous = states;
  }
}

TEST_CASE("activation memory per layer (Korthikanti et al. 2022) against hand values") {
  // s128 b2 h64 a4, t2, 2-byte activations: sbh = 16384; 5as/h = 40.
  DeviceProfile d = builtin_profile("a100");
  const ModelShape m{"x", 4, 64, 4, 128, 256};
  auto act = [&](Recompute r, bool sp) { return layer_activation_bytes(m, d, Layout{1, 2, 1, 2, 0, r, sp, 1}); };
  CHECK(act(Recompute::kNone, false) == doctest::Approx(16384.0 * (10 + 24 / 2.0 + 40 / 2.0)));
  CHECK(act(Recompute::kNone, true) == doctest::Approx(16384.0 / 2 * (34 + 40)));
  CHECK(act(Recompute::kSelective, false) == doctest::Approx(16384.0 * (10 + 12)));
  CHECK(act(Recompute::kSelective, true) == doctest::Approx(16384.0 * 34 / 2));
  CHECK(act(Recompute::kFull, false) == doctest::Approx(2 * 16384.0));
  CHECK(act(Recompute::kFull, true) == doctest::Approx(16384.0));
  // Without dropout (Railyard's CPU worker): no masks (8 instead of 10, 32 instead of 34), scores 2as/h = 16.
  ModelShape nd = m;
  nd.dropout = false;
  auto act_nd = [&](Recompute r, bool sp) { return layer_activation_bytes(nd, d, Layout{1, 2, 1, 2, 0, r, sp, 1}); };
  CHECK(act_nd(Recompute::kNone, false) == doctest::Approx(16384.0 * (8 + 24 / 2.0 + 16 / 2.0)));
  CHECK(act_nd(Recompute::kNone, true) == doctest::Approx(16384.0 / 2 * (32 + 16)));
  CHECK(act_nd(Recompute::kSelective, false) == doctest::Approx(16384.0 * (8 + 12)));
  CHECK(act_nd(Recompute::kFull, false) == doctest::Approx(2 * 16384.0));
  // FlashAttention never stores the scores: no recomputation then costs what selective costs.
  d.flash_attention = true;
  CHECK(act(Recompute::kNone, false) == doctest::Approx(act(Recompute::kSelective, false)));
  // fp32 activations double everything.
  d.activation_bytes = 4;
  CHECK(act(Recompute::kFull, false) == doctest::Approx(4 * 16384.0));
}

TEST_CASE("the 1F1B bubble: (p-1)/(m+p-1), interleaved (p-1)/v") {
  CHECK(bubble_fraction(4, 8, 1) == doctest::Approx(3.0 / 11));
  CHECK(bubble_fraction(4, 8, 2) == doctest::Approx(1.5 / 9.5));
  CHECK(bubble_fraction(1, 8, 1) == 0);
  // The estimate's bubble is (p-1)/v micro-batch times of the bottleneck stage.
  const Cluster c = a100_cluster(64);
  const Job job{ModelShape{"m", 32, 4096, 32, 2048, 51200}, 64, 0};
  for (int v : {1, 2}) {
    const Estimate e = estimate(job, c, Layout{2, 8, 4, 1, 1, Recompute::kFull, false, v});
    CHECK(e.micro_batches == 32);
    const double per_mb = (e.time.compute + e.time.tp_comm + e.time.pp_comm) / e.micro_batches;
    CHECK(e.time.bubble == doctest::Approx(3.0 / v * per_mb));
    CHECK(e.bubble_fraction == doctest::Approx(bubble_fraction(4, 32, v)));
  }
}

TEST_CASE("the classic estimate: GPT-3 175B, 1,024 A100s, 300B tokens, about 34 days") {
  // Narayanan et al. SC'21 (section 5.1, cited by the Baidu article in /work/shared/seeds): end-to-end time
  // ~ 8 T P / (n X) with T = 300B tokens, P = 175B, n = 1024, X = 140 TFLOP/s per GPU (their measured rate with
  // batch 1536) = 34 days. 8TP is the FLOPs with full recomputation (4 passes of 2P per token).
  const double published_days = 8 * 300e9 * 175e9 / (1024 * 140e12) / 86400;
  CHECK(published_days == doctest::Approx(34).epsilon(0.01));
  // The same with our FLOPs per token (exact 96 L h^2 (1 + s/6h + V/16Lh) counting, not 8P): within 3%.
  const ModelShape m = gpt3_175b();
  const double h = m.hidden, L = m.layers;
  const double ours_per_token = model_flops_per_token(m) + L * (24 * h * h + 4.0 * m.seq * h);
  CHECK(rel(300e9 * ours_per_token / (1024 * 140e12) / 86400, 34) < 0.03);
  // The cost model with the A100 calibration file on their layout (tp 8, pp 16, dp 8, micro-batch 1, full
  // recomputation, no interleaving): the predicted rate must be within 15% of the measured 140 TFLOP/s, and the
  // days within 15% of 34 (assumption: the run reaches the throughput the cost model predicts for that layout).
  const Estimate e = estimate(Job{m, 1536, 300e9}, a100_cluster(1024), Layout{8, 8, 16, 1, 1, Recompute::kFull});
  CHECK(e.fits);
  CHECK(rel(e.hardware_flops_per_gpu, 140e12) < 0.15);
  CHECK(rel(e.days, 34) < 0.15);
  MESSAGE("GPT-3 175B on 1024 A100: " << e.hardware_flops_per_gpu / 1e12 << " TFLOP/s per GPU, " << e.days << " days");
}

TEST_CASE("Narayanan et al. SC'21 Table 1: predicted TFLOP/s per GPU within 15% of the published runs") {
  // Table 1 of "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (A100-80GB,
  // seq 2048, vocab 51200, full recomputation; TFLOP/s per GPU counted with recomputation). The tensor and pipeline
  // degrees are the published ones; micro-batch and interleaving are the search's choice.
  struct Row {
    int layers, hidden, heads, tp, pp, gpus, batch;
    double tflops;
  };
  const Row rows[] = {{24, 2304, 24, 1, 1, 32, 512, 137},        {30, 3072, 32, 2, 1, 64, 512, 138},
                      {36, 4096, 32, 4, 1, 128, 512, 142},       {40, 6144, 48, 8, 1, 256, 1024, 135},
                      {48, 8192, 64, 8, 2, 512, 1536, 138},      {60, 10240, 80, 8, 4, 1024, 1792, 140},
                      {80, 12288, 96, 8, 8, 1536, 2304, 148},    {96, 16384, 128, 8, 16, 1920, 2160, 155},
                      {105, 20480, 128, 8, 35, 2520, 2520, 163}, {128, 25600, 160, 8, 64, 3072, 3072, 163}};
  for (const Row& r : rows) {
    SearchOptions o;
    o.tp = r.tp;
    o.pp = r.pp;
    o.zero = 0;
    o.recompute = Recompute::kFull;
    o.sequence_parallel = false;
    o.top = 1;
    const Job job{ModelShape{"row", r.layers, r.hidden, r.heads, 2048, 51200}, r.batch, 0};
    const SearchResult res = search(job, a100_cluster(r.gpus), o);
    REQUIRE(res.plans.size() == 1);
    const double predicted = res.plans[0].estimate.hardware_flops_per_gpu / 1e12;
    INFO("L" << r.layers << " h" << r.hidden << ": predicted " << predicted << " published " << r.tflops);
    CHECK(rel(predicted, r.tflops) < 0.15);
  }
}

TEST_CASE("ZeRO stages shrink a real layout's memory by the sharded parts") {
  const Cluster c = a100_cluster(64);
  const Job job{ModelShape{"m", 24, 2048, 16, 2048, 50257}, 64, 0};
  Estimate s[4];
  for (int z = 0; z <= 3; ++z) s[z] = estimate(job, c, Layout{64, 1, 1, 1, z, Recompute::kFull});
  const double P = s[0].params_per_gpu;
  const DeviceProfile& d = c.device;
  CHECK(s[1].memory.total() == doctest::Approx(s[0].memory.total() - P * d.optimizer_bytes * 63 / 64));
  CHECK(s[2].memory.total() == doctest::Approx(s[1].memory.total() - P * d.grad_bytes * 63 / 64));
  CHECK(s[3].memory.total() == doctest::Approx(s[2].memory.total() - P * d.weight_bytes * 63 / 64));
  // Stage 3 gathers the weights for every micro-batch's forward and backward: more communication.
  CHECK(s[3].time.dp_comm > s[1].time.dp_comm);
}

TEST_CASE("a data-parallel ring inside one unit beats one that crosses the spine") {
  const Job job{ModelShape{"m", 32, 4096, 32, 2048, 51200}, 512, 0};
  const Layout l{16, 8, 1, 1, 1, Recompute::kFull};  // 16 nodes, one dp ring per rail across all of them
  Cluster unit = a100_cluster(128), spine = a100_cluster(128);
  unit.topology.nodes_per_unit = 16;
  spine.topology.nodes_per_unit = 2;
  spine.topology.units_per_leaf = 2;
  const Estimate a = estimate(job, unit, l), b = estimate(job, spine, l);
  CHECK(a.dp_tier == "unit");
  CHECK(b.dp_tier == "spine");
  CHECK(a.time.dp_comm < b.time.dp_comm);  // more switch hops per ring step
  CHECK(a.time.step < b.time.step);
  // With a 2:1 oversubscribed spine the crossing ring takes about twice as long.
  spine.topology.spine_bandwidth_factor = 0.5;
  const Estimate b2 = estimate(job, spine, l);
  CHECK(b2.time.dp_comm / a.time.dp_comm == doctest::Approx(2).epsilon(0.05));
}

TEST_CASE("invalid layouts are rejected with the reason") {
  const Cluster c = a100_cluster(64);
  const Job job{ModelShape{"m", 30, 4096, 32, 2048, 51200}, 96, 0};
  auto why = [&](Layout l) { return check_layout(job, c, l); };
  CHECK(why(Layout{8, 8, 1}) == "");
  CHECK(why(Layout{4, 8, 1}).find("dp*tp*pp = 32 but the cluster has 64 GPUs") != std::string::npos);
  CHECK(why(Layout{16, 4, 1}) == "");
  CHECK(why(Layout{4, 16, 1}).find("does not fit a node of 8 GPUs") != std::string::npos);
  CHECK(why(Layout{2, 8, 4}) == "");  // uneven stages (8, 8, 7, 7 layers) are fine
  CHECK(why(Layout{1, 1, 64}).find("pp 64 exceeds the 30 layers") != std::string::npos);
  const Layout chunks{1, 2, 32, 1, 0, Recompute::kNone, false, 2};
  CHECK(why(chunks).find("pp 32 x interleave 2 exceeds the 30 layers") != std::string::npos);
  CHECK(why(Layout{64, 1, 1}).find("global batch 96 is not divisible by dp*micro-batch = 64") != std::string::npos);
  CHECK(why(Layout{4, 8, 2, 1, 2}).find("ZeRO-2") != std::string::npos);
  CHECK(why(Layout{8, 8, 1, 1, 0, Recompute::kNone, false, 2}).find("interleaving needs pp > 1") != std::string::npos);
  CHECK(why(Layout{32, 1, 2, 1, 0, Recompute::kNone, true}).find("sequence parallelism needs tp > 1") !=
        std::string::npos);
  const Job heads{ModelShape{"m", 32, 4800, 25, 1024, 50257}, 64, 0};
  CHECK(check_layout(heads, c, Layout{8, 8, 1}).find("tp 8 does not divide the 25 attention heads") !=
        std::string::npos);
  CHECK_THROWS_AS(estimate(heads, c, Layout{8, 8, 1}), railyard::ConfigError);
  Cluster small = c;
  small.topology.nodes = 4;
  small.topology.origin = "t.yaml";
  CHECK(check_layout(job, small, Layout{8, 8, 1}).find("64 GPUs need 8 nodes of 8 but the topology (t.yaml) has 4") !=
        std::string::npos);
  CHECK_THROWS_WITH_AS(validate(ModelShape{"m", 2, 100, 3, 8, 8}), doctest::Contains("not divisible by heads 3"),
                       railyard::ConfigError);
}
