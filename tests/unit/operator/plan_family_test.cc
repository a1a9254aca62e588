// spec.parallelism.auto with the parallelism family (#14): the planner's recompute and offload choices and, for MoE
// models, the expert degree and the flat vs hierarchical all-to-all (operator/planner/moe_cost.h), written into
// status.plan and the resolved config. Checked against the cost model's own terms, not remembered numbers.
#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include "operator/controller/plan_glue.h"
#include "operator/planner/cost_model.h"
#include "operator/planner/moe_cost.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::job_with;
using Json = nlohmann::json;
namespace plan = railyard::plan;

namespace {

JobSpec auto_job(const Json& patch) {
  Json j = job_with(Json::parse(R"({"spec": {"parallelism": {"data": null, "auto": true}}})"));
  j.merge_patch(patch);
  ParsedJob p = parse_job(j);
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  return p.spec;
}

NodeInfo h100(const std::string& name, const std::string& unit) {
  NodeInfo n;
  n.name = name;
  n.ready = true;
  n.gpu_allocatable = 8;
  n.labels = {{"railyard.dev/gpu-type", "h100-sxm"}, {"railyard.dev/unit", unit}, {"railyard.dev/leaf", "l0"}};
  return n;
}

}  // namespace

TEST_CASE("auto recomputes when the activations do not fit otherwise, and the pods are told") {
  // One CPU process, 8192-token sequences: the stored (T x T) probabilities of 24 layers exceed the CPU profile's
  // memory; recomputing fits. Nothing else can shrink them with one rank.
  JobSpec s = auto_job(Json::parse(R"({"spec": {"replicas": 1,
      "model": {"preset": "custom", "layers": 24, "hidden": 1024, "heads": 16, "seqLen": 8192, "vocab": 50257},
      "training": {"globalBatch": 1, "microBatch": 1, "seqLen": 8192}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 1, {});
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  CHECK(o.plan->layout.recompute != plan::Recompute::kNone);
  plan::Layout none = o.plan->layout;
  none.recompute = plan::Recompute::kNone;
  none.offload = false;
  CHECK_FALSE(plan::estimate(plan_job(s), plan_cluster(s, 1, {}), none).fits);  // why it recomputes
  CHECK(o.plan->status["recompute"] == plan::to_string(o.plan->layout.recompute));
  CHECK(o.plan->message.find(std::string("recompute=") + plan::to_string(o.plan->layout.recompute)) !=
        std::string::npos);
  apply_plan(s, *o.plan);
  CHECK(resolved_config(s, 1)["memory"]["recompute"] == plan::to_string(o.plan->layout.recompute));

  // A small job fits without: nothing recomputed, nothing offloaded.
  JobSpec small = auto_job(Json::parse(R"({"spec": {"replicas": 2}})"));
  AutoPlanOutcome os = plan_parallelism(small, 2, {});
  REQUIRE(os.plan);
  CHECK(os.plan->status["recompute"] == "none");
  CHECK(os.plan->status["offload"] == "none");
  // A pinned spec.memory.recompute is kept.
  JobSpec pinned = auto_job(Json::parse(R"({"spec": {"replicas": 2, "memory": {"recompute": "full"}}})"));
  AutoPlanOutcome op = plan_parallelism(pinned, 2, {});
  REQUIRE(op.plan);
  CHECK(op.plan->layout.recompute == plan::Recompute::kFull);
}

TEST_CASE("auto with spec.memory.offload optimizer plans a layout the worker offloads") {
  JobSpec s = auto_job(Json::parse(R"({"spec": {"replicas": 2, "memory": {"offload": "optimizer"}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 2, {});
  REQUIRE_MESSAGE(o.plan, (o.violation ? o.violation->message : ""));
  CHECK(o.plan->layout.offload);
  CHECK(o.plan->layout.zero == 0);  // the worker offloads only the unsharded optimizer
  CHECK(o.plan->layout.tp == 1);
  CHECK(o.plan->layout.pp == 1);
  CHECK(o.plan->status["offload"] == "optimizer");
  apply_plan(s, *o.plan);
  CHECK(resolved_config(s, 2)["memory"]["offload"] == "optimizer");
  // On GPUs the worker's offload is not wired: auto never plans it there, even when asked (the job is Invalid).
  JobSpec g = auto_job(Json::parse(R"({"spec": {"replicas": 1, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-124m"}, "training": {"globalBatch": 8, "seqLen": 1024},
      "memory": {"offload": "optimizer"}}})"));
  AutoPlanOutcome og = plan_parallelism(g, 1, {h100("n0", "u0")});
  REQUIRE(og.violation);
  CHECK(og.violation->field == "spec.memory.offload");
}

TEST_CASE("auto on a MoE model picks the smallest expert degree that fits and the cheaper all-to-all") {
  // gpt2-1.5b with 64 experts per layer (~63B expert parameters): no GPU holds all the experts; split over enough
  // data-parallel ranks they fit. 4 pods x 8 H100, two units: the all-to-all crosses nodes.
  JobSpec s = auto_job(Json::parse(R"({"spec": {"replicas": 4, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-1.5b", "moe": {"experts": 64, "topK": 2}},
      "training": {"globalBatch": 64, "seqLen": 1024}}})"));
  std::vector<NodeInfo> nodes = {h100("n0", "u0"), h100("n1", "u0"), h100("n2", "u1"), h100("n3", "u1")};
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
  CHECK(x.all_to_all == (comm.per_all_to_all.use_hierarchical ? "hierarchical" : "flat"));
  CHECK(x.all_to_all_seconds == doctest::Approx(std::min(x.flat_seconds, x.hierarchical_seconds)));
  // status.plan: the family's choices, and the step with the all-to-alls added to the dense estimate.
  CHECK(o.plan->status["expert"] == x.expert);
  CHECK(o.plan->status["expertAllToAll"] == x.all_to_all);
  CHECK(o.plan->status["predictedAllToAllSeconds"].get<double>() == doctest::Approx(x.all_to_all_seconds));
  CHECK(o.plan->status["predictedStepSeconds"].get<double>() ==
        doctest::Approx(o.plan->estimate.time.step + x.all_to_all_seconds));
  CHECK(o.plan->status["predictedMemoryBytesPerDevice"].get<double>() == doctest::Approx(x.memory_bytes));
  // The pods get the choice.
  apply_plan(s, *o.plan);
  Json cfg = resolved_config(s, 4);
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
  JobSpec s = auto_job(Json::parse(R"({"spec": {"replicas": 1, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-1.5b", "moe": {"experts": 1024}},
      "training": {"globalBatch": 8, "seqLen": 1024}}})"));
  AutoPlanOutcome o = plan_parallelism(s, 1, {h100("n0", "u0")});
  REQUIRE(o.violation);
  CHECK(o.violation->field == "spec.parallelism.auto");
  CHECK(o.violation->message.find("1024 experts") != std::string::npos);
  CHECK(o.violation->message.find("add replicas") != std::string::npos);
}
