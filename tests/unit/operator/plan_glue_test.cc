// spec.parallelism.auto: the glue between a TrainingJob and the planner (pure, no API server). The best plan is checked
// against a brute force over every layout the worker implements, not against remembered numbers.
#include "operator/controller/plan_glue.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "planner/calibration.h"
#include "planner/context_parallel.h"
#include "planner/cost_model.h"
#include "planner/moe_cost.h"
#include "planner/search.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::config_json;
using railyard::op::testing::job_with;
using Json = nlohmann::json;
namespace plan = railyard::plan;

namespace {

JobSpec auto_spec(const Json& patch) {
  Json j = job_with(Json::parse(R"({"spec": {"parallelism": {"data": null, "auto": true}}})"));
  j.merge_patch(patch);
  ParsedJob p = parse_job(j);
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  return p.spec;
}

NodeInfo gpu_node(const std::string& name, const std::string& type, const std::string& unit, const std::string& leaf) {
  NodeInfo n;
  n.name = name;
  n.ready = true;
  n.gpu_allocatable = 8;
  n.labels = {{"railyard.dev/gpu-type", type}, {"railyard.dev/unit", unit}, {"railyard.dev/leaf", leaf}};
  return n;
}

// The fastest step over every layout the worker runs (dp/tp/pp, micro-batch, ZeRO 0-2, no SP/interleave/recompute).
double brute_force_best(const plan::Job& job, const plan::Cluster& c) {
  double best = -1;
  for (int tp = 1; tp <= c.topology.gpus_per_node; ++tp)
    for (int pp = 1; pp <= c.gpus; ++pp) {
      if (c.gpus % (tp * pp)) continue;
      const int dp = c.gpus / (tp * pp);
      for (int mb = 1; mb <= 64; ++mb)
        for (int zero = 0; zero <= 2; ++zero) {
          plan::Layout l;
          l.dp = dp, l.tp = tp, l.pp = pp, l.micro_batch = mb, l.zero = zero;
          if (!plan::check_layout(job, c, l).empty()) continue;
          plan::Estimate e = plan::estimate(job, c, l);
          if (e.fits && (best < 0 || e.time.step < best)) best = e.time.step;
        }
    }
  return best;
}

}  // namespace

TEST_CASE("auto on the CPU profile picks the fastest layout the worker implements") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 4, "training": {"globalBatch": 8}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 4, {});
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  const plan::Layout& l = o.plan->layout;
  CHECK(o.plan->device == "cpu");
  CHECK(l.dp * l.tp * l.pp == 4);
  CHECK(l.zero <= 2);
  CHECK_FALSE(l.sequence_parallel);
  CHECK(l.interleave == 1);
  CHECK(l.recompute == plan::Recompute::kNone);
  CHECK(4 % l.tp == 0);  // tiny has 4 heads, 4 layers
  CHECK(8 % (l.dp * l.micro_batch) == 0);
  const double best = brute_force_best(plan_job(s), plan_cluster(s, 4, {}));
  REQUIRE(best > 0);
  CHECK(o.plan->estimate.time.step == doctest::Approx(best).epsilon(1e-12));
  // status.plan and the event carry the same choice and prediction.
  CHECK(o.plan->status["data"] == l.dp);
  CHECK(o.plan->status["tensor"] == l.tp);
  CHECK(o.plan->status["pipeline"] == l.pp);
  CHECK(o.plan->status["zero"] == l.zero);
  CHECK(o.plan->status["predictedStepSeconds"].get<double>() == o.plan->estimate.time.step);
  CHECK(o.plan->status["predictedTokensPerSecond"].get<double>() > 0);
  CHECK(o.plan->status["predictedMemoryBytesPerDevice"].get<double>() > 0);
  CHECK(o.plan->message.find("planned dp=" + std::to_string(l.dp) + " tp=" + std::to_string(l.tp)) == 0);
  CHECK(o.plan->message.find("tokens/s") != std::string::npos);
}

TEST_CASE("the applied plan is the world, the resolved config and the worker's ZeRO stage") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 4, "training": {"globalBatch": 8}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 4, {});
  REQUIRE(o.plan);
  apply_plan(s, o.plan->layout);
  WorldLayout w = world_layout(s, 4);
  CHECK(w.size == 4);
  CHECK(w.data == o.plan->layout.dp);
  CHECK(w.tensor == o.plan->layout.tp);
  CHECK(w.pipeline == o.plan->layout.pp);
  Json cfg = config_json(s, 4);
  CHECK(cfg["layout"]["tp"] == o.plan->layout.tp);
  CHECK(cfg["layout"]["pp"] == o.plan->layout.pp);
  CHECK(cfg["parallelism"]["zero"] == o.plan->layout.zero);
  CHECK(cfg["training"]["microBatch"] == o.plan->layout.micro_batch);
  CHECK(cfg["training"]["gradAccumulation"].get<int>() * o.plan->layout.micro_batch * o.plan->layout.dp == 8);
}

TEST_CASE("auto accepts a batch the default layout cannot split and the planner divides it") {
  // 4 ranks of pure data parallelism cannot split 6 sequences; the planner must find dp in {1, 2, 3, 6}.
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 4, "training": {"globalBatch": 6, "microBatch": 1}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 4, {});
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  CHECK(6 % (o.plan->layout.dp * o.plan->layout.micro_batch) == 0);
  CHECK(o.plan->layout.dp * o.plan->layout.tp * o.plan->layout.pp == 4);
}

TEST_CASE("a tensor degree given with auto is kept") {
  JobSpec s =
      auto_spec(Json::parse(R"({"spec": {"replicas": 2, "procsPerReplica": 2, "parallelism": {"tensor": 2}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 2, {});
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  CHECK(o.plan->layout.tp == 2);
}

TEST_CASE("GPU nodes give the device from the gpu-type label and the unit structure from the topology labels") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 4, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-350m"}, "training": {"globalBatch": 64, "seqLen": 1024}}})"));
  std::vector<NodeInfo> nodes = {gpu_node("n0", "h100-sxm", "u0", "l0"), gpu_node("n1", "h100-sxm", "u0", "l0"),
                                 gpu_node("n2", "h100-sxm", "u0", "l0"), gpu_node("n3", "h100-sxm", "u1", "l0"),
                                 gpu_node("n4", "h100-sxm", "u1", "l0")};
  nodes[4].ready = false;  // not ready: not counted
  plan::Cluster c = plan_cluster(s, 4, nodes);
  CHECK(c.device.name == plan::builtin_profile("h100-sxm").name);
  CHECK(c.gpus == 32);
  CHECK(c.topology.gpus_per_node == 8);
  CHECK(c.topology.nodes_per_unit == 3);
  CHECK(c.topology.units_per_leaf == 2);
  CHECK(c.topology.leaves_per_spine == 1);
  AutoPlanOutcome o = plan_parallelism(s, 4, nodes);
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  CHECK(o.plan->layout.tp <= 8);
  CHECK(o.plan->estimate.time.step == doctest::Approx(brute_force_best(plan_job(s), c)).epsilon(1e-12));
}

TEST_CASE("GPU nodes without a known gpu-type label make the job Invalid with a fix") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 1, "procsPerReplica": 8, "device": "cuda"}})"));
  std::vector<NodeInfo> unlabelled = {gpu_node("n0", "", "u0", "l0")};
  AutoPlanOutcome o = plan_parallelism(s, 1, unlabelled);
  REQUIRE(o.violation);
  CHECK(o.violation->reason == "InvalidParallelismAuto");
  CHECK(o.violation->message.find("railyard.dev/gpu-type") != std::string::npos);
  std::vector<NodeInfo> unknown = {gpu_node("n0", "v100", "u0", "l0")};
  o = plan_parallelism(s, 1, unknown);
  REQUIRE(o.violation);
  CHECK(o.violation->message.find("v100") != std::string::npos);
  CHECK(o.violation->message.find("h100") != std::string::npos);  // lists the known profiles
  o = plan_parallelism(s, 1, {});
  REQUIRE(o.violation);
  CHECK(o.violation->message.find("spec.device") != std::string::npos);
}

TEST_CASE("a model that fits no layout is Invalid with the planner's reason") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 1, "procsPerReplica": 1,
      "model": {"preset": "custom", "layers": 96, "hidden": 12288, "heads": 96, "seqLen": 2048, "vocab": 50257},
      "training": {"globalBatch": 8, "seqLen": 2048}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 1, {});
  REQUIRE(o.violation);
  CHECK_FALSE(o.plan);
  CHECK(o.violation->field == "spec.parallelism.auto");
  CHECK(o.violation->message.find("no layout of 1 x") != std::string::npos);
  CHECK(o.violation->message.find("per device") != std::string::npos);
  CHECK(o.violation->message.find("add replicas") != std::string::npos);
}

TEST_CASE("auto with deterministic plans only power-of-two accumulations per rank (docs/parallel.md)") {
  // 4 pods, 576 sequences: the unconstrained best runs 3 micro-batches per rank (dp4 mb48), which the deterministic
  // reduction cannot fold; with deterministic the plan must keep globalBatch/(dp*microBatch) in {1, 2, 4, ...}.
  const Json patch = Json::parse(R"({"spec": {"replicas": 4, "training": {"globalBatch": 576}}})");
  JobSpec free_spec = auto_spec(patch);
  AutoPlanOutcome free_plan = plan_parallelism(free_spec, 4, {});
  REQUIRE(free_plan.plan);
  const auto acc = [](const plan::Layout& l) { return 576 / (l.dp * l.micro_batch); };
  const auto pow2 = [](int a) { return a > 0 && (a & (a - 1)) == 0; };
  // The example is only worth something if the unconstrained plan breaks the rule.
  REQUIRE(free_plan.plan->layout.dp > 1);
  REQUIRE_FALSE(pow2(acc(free_plan.plan->layout)));

  Json det_patch = patch;
  det_patch["spec"]["parallelism"]["deterministic"] = true;
  JobSpec s = auto_spec(det_patch);
  REQUIRE(s.deterministic);
  for (int replicas : {4, 3, 2}) {  // admission and the elastic sizes a resize plans for
    CAPTURE(replicas);
    AutoPlanOutcome o = plan_parallelism(s, replicas, {});
    REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
    const plan::Layout& l = o.plan->layout;
    CHECK((l.dp == 1 || pow2(acc(l))));
    // The best among the layouts the rule allows (brute force over everything the worker runs).
    const plan::Job job = plan_job(s);
    const plan::Cluster c = plan_cluster(s, replicas, {});
    double best = -1;
    for (int tp = 1; tp <= c.topology.gpus_per_node; ++tp)
      for (int pp = 1; pp <= c.gpus; ++pp) {
        if (c.gpus % (tp * pp)) continue;
        const int dp = c.gpus / (tp * pp);
        for (int mb = 1; mb <= 64; ++mb) {
          if (576 % (dp * mb) || (dp > 1 && !pow2(576 / (dp * mb)))) continue;
          for (int zero = 0; zero <= 2; ++zero) {
            plan::Layout x;
            x.dp = dp, x.tp = tp, x.pp = pp, x.micro_batch = mb, x.zero = zero;
            if (!plan::check_layout(job, c, x).empty()) continue;
            const plan::Estimate e = plan::estimate(job, c, x);
            if (e.fits && (best < 0 || e.time.step < best)) best = e.time.step;
          }
        }
      }
    REQUIRE(best > 0);
    CHECK(o.plan->estimate.time.step == doctest::Approx(best).epsilon(1e-12));
  }
}

TEST_CASE("the operator models Railyard's worker: no dropout masks among the activations") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 1, "model": {"preset": "gpt2-124m"},
      "training": {"globalBatch": 4, "seqLen": 1024}}})"));
  const plan::Job job = plan_job(s);
  CHECK_FALSE(job.model.dropout);
  // Per layer without recomputation, tp 1: S (8 + 24 + 2 a s / h) instead of S (10 + 24 + 5 a s / h) (docs/planner.md).
  plan::Cluster c = plan_cluster(s, 1, {});
  plan::Layout l;
  l.micro_batch = 1;
  plan::ModelShape with = job.model;
  with.dropout = true;
  const double as_h = 12.0 * 1024 / 768;
  CHECK(plan::layer_activation_bytes(with, c.device, l) / plan::layer_activation_bytes(job.model, c.device, l) ==
        doctest::Approx((34 + 5 * as_h) / (32 + 2 * as_h)).epsilon(1e-12));
  // The plan's activation memory is the no-dropout one.
  AutoPlanOutcome o = plan_parallelism(s, 1, {});
  REQUIRE(o.plan);
  plan::Job dropout_job = job;
  dropout_job.model.dropout = true;
  CHECK(o.plan->estimate.memory.activations < plan::estimate(dropout_job, c, o.plan->layout).memory.activations * 0.8);
}

TEST_CASE("the scheduler's step model: the job's layout as the world runs it, null when the planner cannot model it") {
  Json j = job_with(Json::parse(R"({"spec": {"replicas": 4, "parallelism": {"data": null, "pipeline": 2},
      "training": {"globalBatch": 8}}})"));
  ParsedJob p = parse_job(j);
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  auto m = placement_step_model(p.spec, world_layout(p.spec, 4), 4, {});
  REQUIRE(m);
  CHECK(m->layout.dp == 2);
  CHECK(m->layout.pp == 2);
  CHECK(m->cluster.device.name == plan::builtin_profile("cpu").name);
  CHECK_FALSE(m->job.model.dropout);
  // A tensor group wider than a pod stays outside the model (tensor parallelism is modelled inside a node).
  JobSpec wide = p.spec;
  wide.tensor = 2;
  wide.pipeline = 1;
  CHECK_FALSE(placement_step_model(wide, world_layout(wide, 4), 4, {}));
}

TEST_CASE("mixed GPU types: the batch is split by speed, and the worker gets the split") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 4, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-124m"}, "training": {"globalBatch": 256, "seqLen": 1024}}})"));
  std::vector<NodeInfo> nodes = {gpu_node("a0", "a100-80gb", "u0", "l0"), gpu_node("a1", "a100-80gb", "u0", "l0"),
                                 gpu_node("h0", "h100-sxm", "u1", "l0"), gpu_node("h1", "h100-sxm", "u1", "l0")};
  AutoPlanOutcome o = plan_parallelism(s, 4, nodes);
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  REQUIRE(o.plan->mixed);
  const Json& mixed = o.plan->status["mixed"];
  INFO(o.plan->status.dump());
  // gpt2-124m fits plain data parallelism, which the worker can split unevenly: the balanced split wins.
  CHECK(o.plan->layout.tp == 1);
  CHECK(o.plan->layout.pp == 1);
  CHECK(mixed["split"] == "balanced");
  CHECK(mixed["ranksByDevice"]["a100-80gb"] == 16);
  CHECK(mixed["ranksByDevice"]["h100-sxm"] == 16);
  const std::vector<int> split = mixed["dpSplit"].get<std::vector<int>>();
  REQUIRE(split.size() == 32);
  int sum = 0;
  for (int a : split) sum += a;
  CHECK(sum == 256 / o.plan->layout.micro_batch);
  // Expected pods: a100s first (name order), then h100s, which get more of the batch.
  CHECK(split.front() < split.back());
  CHECK(mixed["balancedStepSeconds"].get<double>() < mixed["evenStepSeconds"].get<double>());
  CHECK(o.plan->status["predictedStepSeconds"].get<double>() == mixed["balancedStepSeconds"].get<double>());
  CHECK(o.plan->message.find("batch split by speed") != std::string::npos);

  // The split the controller passes for the nodes the pods are bound to (rank order follows the pods).
  JobSpec w = s;
  apply_plan(w, o.plan->layout);
  auto placed = mixed_split(w, {"h100-sxm", "a100-80gb", "h100-sxm", "a100-80gb"});
  REQUIRE(placed);
  REQUIRE(placed->dp_split.size() == 32);
  CHECK(placed->dp_split[0] > placed->dp_split[8]);    // rank 0 on an H100, rank 8 on an A100
  CHECK(placed->dp_split[16] == placed->dp_split[0]);  // both H100 pods alike
  // One type: nothing to split. Tensor parallelism: the worker cannot split unevenly, and says so.
  CHECK_FALSE(mixed_split(w, {"h100-sxm", "h100-sxm", "h100-sxm", "h100-sxm"}));
  JobSpec tp = w;
  tp.tensor = 2;
  auto even = mixed_split(tp, {"h100-sxm", "a100-80gb", "h100-sxm", "a100-80gb"});
  REQUIRE(even);
  CHECK(even->dp_split.empty());
  CHECK(even->why_even.find("plain data parallelism") != std::string::npos);
}

// spec.parallelism.auto with the parallelism family (#14): the planner's recompute and offload choices and, for MoE
// models, the expert degree and the flat vs hierarchical all-to-all (planner/moe_cost.h), written into
// status.plan and the resolved config.

TEST_CASE("auto recomputes when the activations do not fit otherwise, and the pods are told") {
  // One CPU process, 8192-token sequences: the stored (T x T) probabilities of 24 layers exceed the CPU profile's
  // memory; recomputing fits. Nothing else can shrink them with one rank.
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 1,
      "model": {"preset": "custom", "layers": 24, "hidden": 1024, "heads": 16, "seqLen": 8192, "vocab": 50257},
      "training": {"globalBatch": 1, "microBatch": 1, "seqLen": 8192}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 1, {});
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  CHECK(o.plan->layout.recompute != plan::Recompute::kNone);
  plan::Layout none = o.plan->layout;
  none.recompute = plan::Recompute::kNone;
  none.offload = false;
  CHECK_FALSE(plan::estimate(plan_job(s), plan_cluster(s, 1, {}), none).fits);  // why it recomputes
  CHECK(o.plan->status["recompute"] == railyard::to_string(o.plan->layout.recompute));
  CHECK(o.plan->message.find(std::string("recompute=") + railyard::to_string(o.plan->layout.recompute)) !=
        std::string::npos);
  apply_plan(s, *o.plan);
  CHECK(config_json(s, 1)["memory"]["recompute"] == railyard::to_string(o.plan->layout.recompute));

  // A small job fits without: nothing recomputed, nothing offloaded.
  JobSpec small = auto_spec(Json::parse(R"({"spec": {"replicas": 2}})"));
  AutoPlanOutcome os = plan_parallelism(small, 2, {});
  REQUIRE(os.plan);
  CHECK(os.plan->status["recompute"] == "none");
  CHECK(os.plan->status["offload"] == "none");
  // A pinned spec.memory.recompute is kept.
  JobSpec pinned = auto_spec(Json::parse(R"({"spec": {"replicas": 2, "memory": {"recompute": "full"}}})"));
  AutoPlanOutcome op = plan_parallelism(pinned, 2, {});
  REQUIRE(op.plan);
  CHECK(op.plan->layout.recompute == plan::Recompute::kFull);
}

TEST_CASE("auto with spec.memory.offload optimizer plans a layout the worker offloads") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 2, "memory": {"offload": "optimizer"}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 2, {});
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  CHECK(o.plan->layout.offload);
  CHECK(o.plan->layout.zero == 0);  // the worker offloads only the unsharded optimizer
  CHECK(o.plan->layout.tp == 1);
  CHECK(o.plan->layout.pp == 1);
  CHECK(o.plan->status["offload"] == "optimizer");
  apply_plan(s, *o.plan);
  CHECK(config_json(s, 2)["memory"]["offload"] == "optimizer");
  // On GPUs (the worker offloads there since 2026-11-27, its copy costs unmeasured) auto plans it only when asked:
  // asked, the layout offloads; not asked, it never does, even where it would fit only with it.
  JobSpec g = auto_spec(Json::parse(R"({"spec": {"replicas": 1, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-124m"}, "training": {"globalBatch": 8, "seqLen": 1024},
      "memory": {"offload": "optimizer"}}})"));
  AutoPlanOutcome og = plan_parallelism(g, 1, {gpu_node("n0", "h100-sxm", "u0", "l0")});
  REQUIRE_MESSAGE(og.plan, (og.violation ? og.violation->message : ""));
  CHECK(og.plan->layout.offload);
  CHECK(og.plan->layout.zero == 0);
  JobSpec gn = g;
  gn.offload.clear();
  AutoPlanOutcome ogn = plan_parallelism(gn, 1, {gpu_node("n0", "h100-sxm", "u0", "l0")});
  REQUIRE_MESSAGE(ogn.plan, (ogn.violation ? ogn.violation->message : ""));
  CHECK_FALSE(ogn.plan->layout.offload);
}

TEST_CASE("auto on a MoE model picks the smallest expert degree that fits and the cheaper all-to-all") {
  // gpt2-1.5b with 64 experts per layer (~63B expert parameters): no GPU holds all the experts; split over enough
  // data-parallel ranks they fit. 4 pods x 8 H100, two units: the all-to-all crosses nodes.
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 4, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-1.5b", "moe": {"experts": 64, "topK": 2}},
      "training": {"globalBatch": 64, "seqLen": 1024}}})"));
  std::vector<NodeInfo> nodes = {gpu_node("n0", "h100-sxm", "u0", "l0"), gpu_node("n1", "h100-sxm", "u0", "l0"),
                                 gpu_node("n2", "h100-sxm", "u1", "l0"), gpu_node("n3", "h100-sxm", "u1", "l0")};
  AutoPlanOutcome o = plan_parallelism(s, 4, nodes);
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  REQUIRE(o.plan->experts);
  const ExpertPlan& x = *o.plan->experts;
  const plan::Layout& l = o.plan->layout;
  CHECK(l.tp == 1);  // experts run with data and expert parallelism only
  CHECK(l.pp == 1);
  CHECK(x.expert > 1);
  CHECK(64 % x.expert == 0);
  CHECK(l.dp % x.expert == 0);
  CHECK(x.memory_bytes <= o.plan->estimate.memory_capacity);
  // Every smaller degree does not fit: pinned to it, the choice is refused with the memory it needs.
  const plan::Job job = plan_job(s);
  const plan::Cluster cluster = plan_cluster(s, 4, nodes);
  for (int d = 1; d < x.expert; ++d) {
    if (64 % d || l.dp % d) continue;
    CAPTURE(d);
    JobSpec pin = s;
    pin.expert = d;
    pin.expert_given = true;
    ExpertChoice c = choose_experts(pin, job, cluster, o.plan->estimate);
    CHECK_FALSE(c.plan);
    REQUIRE(c.why_not);
    CHECK(c.why_not->find("per device") != std::string::npos);
  }
  // The all-to-all is the cheaper of the two the cost model prices on this topology.
  const plan::MoeCommEstimate comm = plan::moe_comm_estimate(job.model, {64, 2, 1.25}, cluster, x.expert, l.micro_batch,
                                                             o.plan->estimate.micro_batches);
  CHECK(x.flat_seconds == doctest::Approx(comm.per_all_to_all.flat * comm.all_to_alls));
  CHECK(x.hierarchical_seconds == doctest::Approx(comm.per_all_to_all.hierarchical * comm.all_to_alls));
  // On CUDA the worker refuses the hierarchical exchange (it stages chunks in host memory): flat, priced as such.
  CHECK(x.all_to_all == "flat");
  CHECK(x.all_to_all_seconds == doctest::Approx(x.flat_seconds));
  // With device auto the planner takes the cheaper of the two the cost model prices on this topology (hierarchical
  // here: the exchange crosses nodes).
  JobSpec any = s;
  any.device = "auto";
  const ExpertChoice ca = choose_experts(any, job, cluster, o.plan->estimate);
  REQUIRE(ca.plan);
  CHECK(comm.per_all_to_all.use_hierarchical);
  CHECK(ca.plan->all_to_all == "hierarchical");
  CHECK(ca.plan->all_to_all_seconds == doctest::Approx(std::min(ca.plan->flat_seconds, ca.plan->hierarchical_seconds)));
  // status.plan: the family's choices, and the step with the all-to-alls added to the dense estimate.
  CHECK(o.plan->status["expert"] == x.expert);
  CHECK(o.plan->status["expertAllToAll"] == x.all_to_all);
  CHECK(o.plan->status["predictedAllToAllSeconds"].get<double>() == doctest::Approx(x.all_to_all_seconds));
  CHECK(o.plan->status["predictedStepSeconds"].get<double>() ==
        doctest::Approx(o.plan->estimate.time.step + x.all_to_all_seconds));
  CHECK(o.plan->status["predictedMemoryBytesPerDevice"].get<double>() == doctest::Approx(x.memory_bytes));
  // The pods get the choice.
  apply_plan(s, *o.plan);
  Json cfg = config_json(s, 4);
  CHECK(cfg["parallelism"]["expert"] == x.expert);
  CHECK(cfg["parallelism"]["expertAllToAll"] == x.all_to_all);
  CHECK(cfg["model"]["moe"]["experts"] == 64);
  CHECK(world_layout(s, 4).expert == x.expert);
  // A pinned all-to-all is kept.
  JobSpec flat = s;
  flat.expert_all_to_all = "flat";
  flat.expert_given = false;
  ExpertChoice cf = choose_experts(flat, job, cluster, o.plan->estimate);
  REQUIRE(cf.plan);
  CHECK(cf.plan->all_to_all == "flat");
  CHECK(cf.plan->all_to_all_seconds == doctest::Approx(cf.plan->flat_seconds));
}

TEST_CASE("auto on a MoE model whose experts fit nowhere is Invalid with the memory it needs") {
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 1, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-1.5b", "moe": {"experts": 1024}},
      "training": {"globalBatch": 8, "seqLen": 1024}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 1, {gpu_node("n0", "h100-sxm", "u0", "l0")});
  REQUIRE(o.violation);
  CHECK(o.violation->field == "spec.parallelism.auto");
  CHECK(o.violation->message.find("1024 experts") != std::string::npos);
  CHECK(o.violation->message.find("add replicas") != std::string::npos);
}

TEST_CASE("auto splits sequences over context-parallel ranks when no layout fits without") {
  // 2^20-token sequences on 8 CPU processes: one layer's activations of one sequence exceed the CPU profile's memory,
  // so no data/tensor/pipeline layout, recomputation or offload fits; split over context ranks they do.
  JobSpec s = auto_spec(Json::parse(R"({"spec": {"replicas": 8,
      "model": {"preset": "custom", "layers": 1, "hidden": 768, "heads": 12, "seqLen": 1048576, "vocab": 256},
      "training": {"globalBatch": 8, "microBatch": 1, "seqLen": 1048576}}})"));
  const plan::Job job = plan_job(s);
  const plan::Cluster c = plan_cluster(s, 8, {});
  plan::SearchOptions o;
  o.interleaves = {1};
  CHECK(plan::search(job, c, o).plans.empty());  // why context parallelism
  AutoPlanOutcome out = plan_parallelism(s, 8, {});
  REQUIRE_MESSAGE(out.plan, (out.violation ? out.violation->message : ""));
  const AutoPlan& p = *out.plan;
  REQUIRE(p.context > 1);
  CHECK(p.layout.dp * p.context * p.layout.tp * p.layout.pp == 8);
  plan::Cluster part = c;
  part.gpus = 8 / p.context;
  part.topology.nodes = 0;
  const double act = plan::cp_activation_bytes(job, part, p.layout, p.context);
  CHECK(p.estimate.memory.activations == doctest::Approx(act));
  CHECK(p.estimate.memory.total() <= p.estimate.memory_capacity);
  CHECK(p.status["context"] == p.context);
  CHECK(p.status["predictedStepSeconds"].get<double>() == doctest::Approx(p.estimate.time.step + p.ring_seconds));
  CHECK(p.message.find("context=" + std::to_string(p.context)) != std::string::npos);
  apply_plan(s, p);
  WorldLayout w = world_layout(s, 8);
  CHECK(w.context == p.context);
  CHECK(w.data == p.layout.dp);
  Json cfg = config_json(s, 8);
  CHECK(cfg["parallelism"]["context"] == p.context);
  CHECK(cfg["layout"]["dp"].get<int>() * cfg["layout"]["tp"].get<int>() * cfg["layout"]["pp"].get<int>() == 8);
  // deterministic mode cannot run context parallelism: still Invalid, with the planner's reason
  JobSpec det = s;
  det.context = 1;
  det.deterministic = true;
  CHECK(plan_parallelism(det, 8, {}).violation);
}
