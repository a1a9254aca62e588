// The parallelism family in a TrainingJob (#14): spec.model.moe, spec.parallelism.{expert, expertAllToAll,
// sequenceParallel, context, zero 2}, spec.memory.{recompute, recomputeLayers, offload}. Parsing, the checks of what
// the worker refuses (the job is Invalid naming the field and the fix), the resolved config the pods read, and the
// elastic sizes the expert degree allows.
#include <doctest/doctest.h>

#include <string>

#include "operator/api.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::config_json;
using railyard::op::testing::job_with;
using Json = nlohmann::json;

namespace {

// A small MoE job: 4 pods x 1 proc, tiny (4 layers, 4 heads, seqLen 64), 4 experts, top-2, expert parallelism 2.
Json moe_job(const Json& patch = Json::object()) {
  Json j = job_with(Json::parse(R"({"spec": {"replicas": 4,
      "model": {"preset": "tiny", "moe": {"experts": 4, "topK": 2, "capacityFactor": 2.0, "auxLossCoef": 0.02}},
      "training": {"globalBatch": 8, "microBatch": 2, "seqLen": 64},
      "parallelism": {"data": null, "expert": 2, "expertAllToAll": "hierarchical"},
      "memory": {"recompute": "full", "recomputeLayers": 2}}})"));
  j.merge_patch(patch);
  return j;
}

}  // namespace

TEST_CASE("a MoE job with expert parallelism and recompute reaches the worker's resolved config") {
  ParsedJob p = parse_job(moe_job());
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  CHECK(p.spec.moe.experts == 4);
  CHECK(p.spec.moe.top_k == 2);
  CHECK(p.spec.expert == 2);
  Json cfg = config_json(p.spec, 4);
  CHECK(cfg["model"]["moe"]["experts"] == 4);
  CHECK(cfg["model"]["moe"]["topK"] == 2);
  CHECK(cfg["model"]["moe"]["capacityFactor"].get<double>() == 2.0);
  CHECK(cfg["model"]["moe"]["auxLossCoef"].get<double>() == doctest::Approx(0.02));
  CHECK(cfg["parallelism"]["expert"] == 2);
  CHECK(cfg["parallelism"]["expertAllToAll"] == "hierarchical");
  CHECK(cfg["parallelism"]["sequenceParallel"] == false);
  CHECK(cfg["parallelism"]["context"] == 1);
  CHECK(cfg["layout"]["dp"] == 4);
  CHECK(cfg["memory"]["recompute"] == "full");
  CHECK(cfg["memory"]["recomputeLayers"] == 2);
  CHECK(cfg["memory"]["offload"] == "none");
  CHECK(world_layout(p.spec, 4).expert == 2);
}

TEST_CASE("a dense job's resolved config says so: no moe, expert 1 without an all-to-all, nothing recomputed") {
  Json cfg = config_json(parse_job(railyard::op::testing::valid_job()).spec, 2);
  CHECK_FALSE(cfg["model"].contains("moe"));
  CHECK(cfg["parallelism"]["expert"] == 1);
  CHECK_FALSE(cfg["parallelism"].contains("expertAllToAll"));  // the worker refuses --ep-a2a without --ep > 1
  CHECK(cfg["memory"]["recompute"] == "none");
  CHECK_FALSE(cfg["memory"].contains("recomputeLayers"));
  CHECK(cfg["memory"]["offload"] == "none");
  // The all-to-all defaults to flat when expert > 1 and none is given.
  Json j = moe_job(Json::parse(R"({"spec": {"parallelism": {"expertAllToAll": null}}})"));
  CHECK(config_json(parse_job(j).spec, 4)["parallelism"]["expertAllToAll"] == "flat");
}

TEST_CASE("context parallelism splits the world as data x context x tensor x pipeline") {
  Json j = job_with(Json::parse(R"({"spec": {"replicas": 2, "procsPerReplica": 2,
      "training": {"globalBatch": 8, "microBatch": 2, "seqLen": 64},
      "parallelism": {"data": 2, "context": 2}}})"));
  ParsedJob p = parse_job(j);
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  WorldLayout w = world_layout(p.spec, 2);
  CHECK(w.size == 4);
  CHECK(w.data == 2);
  CHECK(w.context == 2);
  Json cfg = config_json(p.spec, 2);
  // layout is the rendezvous' rank grid (dp x tp x pp = world): dp counts the context ranks, parallelism.context
  // says how many.
  CHECK(cfg["layout"]["dp"] == 4);
  CHECK(cfg["layout"]["dp"].get<int>() * cfg["layout"]["tp"].get<int>() * cfg["layout"]["pp"].get<int>() ==
        cfg["layout"]["world"].get<int>());
  CHECK(cfg["parallelism"]["context"] == 2);
  CHECK(cfg["training"]["gradAccumulation"] == 2);  // 8 / (2 x 2): the context ranks share a replica's sequences
  // data given as if context did not exist: the message names the product with context.
  j["spec"]["parallelism"]["data"] = 4;
  ParsedJob bad = parse_job(j);
  REQUIRE(bad.violation);
  CHECK(bad.violation->field == "spec.parallelism.data");
  CHECK(bad.violation->message.find("data*context*tensor*pipeline = 8") != std::string::npos);
  CHECK(bad.violation->message.find("set data to 2") != std::string::npos);
}

TEST_CASE("what the worker refuses in the family makes the job Invalid, naming the field and the fix") {
  struct Case {
    const char* patch;
    const char* field;
    const char* says;
  } cases[] = {
      // ranges and types the schema also states
      {R"({"spec": {"model": {"moe": {"experts": 1}}}})", "spec.model.moe.experts", "use a value from 2 to 1024"},
      {R"({"spec": {"model": {"moe": {"experts": null, "topK": 2}}}})", "spec.model.moe.experts", "is missing"},
      {R"({"spec": {"model": {"moe": {"topK": 5}}}})", "spec.model.moe.topK", "exceeds the 4 experts"},
      {R"({"spec": {"model": {"moe": {"auxLossCoef": -1}}}})", "spec.model.moe.auxLossCoef", "out of range"},
      {R"({"spec": {"model": {"moe": {"capacityFactor": "big"}}}})", "spec.model.moe.capacityFactor",
       "must be a number"},
      {R"({"spec": {"parallelism": {"zero": 3}}})", "spec.parallelism.zero", "use a value from 0 to 2"},
      {R"({"spec": {"parallelism": {"expertAllToAll": "tree"}}})", "spec.parallelism.expertAllToAll",
       "use one of flat, hierarchical"},
      {R"({"spec": {"memory": {"recompute": "some"}}})", "spec.memory.recompute", "use one of none, selective, full"},
      {R"({"spec": {"memory": {"recomputeLayers": 5}}})", "spec.memory.recomputeLayers", "exceeds the model's 4"},
      {R"({"spec": {"memory": {"offload": "params"}}})", "spec.memory.offload", "not implemented"},
      {R"({"spec": {"memory": {"offload": "disk"}}})", "spec.memory.offload", "use none or optimizer"},
      // cross-field: expert parallelism
      {R"({"spec": {"parallelism": {"expert": 3}}})", "spec.parallelism.expert", "use one of 1, 2, 4"},
      {R"({"spec": {"replicas": 2, "parallelism": {"expert": 4}}})", "spec.parallelism.expert",
       "does not divide the data-parallel degree 2"},
      {R"({"spec": {"model": {"moe": null}}})", "spec.parallelism.expert", "needs a mixture-of-experts model"},
      {R"({"spec": {"parallelism": {"expert": 1}}})", "spec.parallelism.expertAllToAll",
       "set spec.parallelism.expert > 1"},
      {R"({"spec": {"replicas": 3, "procsPerReplica": 4, "training": {"globalBatch": 12, "microBatch": 1},
           "model": {"moe": {"experts": 12}}, "parallelism": {"expert": 6}}})",
       "spec.parallelism.expertAllToAll", "use flat, or an expert degree that is a multiple of procsPerReplica"},
      {R"({"spec": {"parallelism": {"context": 2}}})", "spec.model.moe", "set spec.parallelism.context to 1"},
      {R"({"spec": {"procsPerReplica": 2, "parallelism": {"tensor": 2, "deterministic": true}}})",
       "spec.parallelism.deterministic", "set deterministic false, expert 1, or tensor and pipeline 1"},
      // sequence and context parallelism
      {R"({"spec": {"model": {"moe": null}, "parallelism": {"expert": null, "expertAllToAll": null,
           "sequenceParallel": true}}})",
       "spec.parallelism.sequenceParallel", "set spec.parallelism.tensor to 2 or more"},
      {R"({"spec": {"model": {"moe": null}, "procsPerReplica": 2, "training": {"microBatch": 1, "seqLen": 63,
           "globalBatch": 4}, "parallelism": {"expert": null, "expertAllToAll": null, "tensor": 2,
           "sequenceParallel": true}}})",
       "spec.parallelism.sequenceParallel", "63 tokens are not divisible by tensor 2"},
      {R"({"spec": {"model": {"moe": null}, "replicas": 8, "training": {"seqLen": 60}, "parallelism": {"expert": null,
           "expertAllToAll": null, "context": 8}}})",
       "spec.parallelism.context", "does not divide the sequence length 60"},
      {R"({"spec": {"model": {"moe": null}, "replicas": 4, "parallelism": {"expert": null, "expertAllToAll": null,
           "context": 8}}})",
       "spec.parallelism.context", "context*tensor*pipeline = 8 does not divide the world size 4"},
      {R"({"spec": {"model": {"moe": null}, "training": {"globalBatch": 4}, "parallelism": {"expert": null,
           "expertAllToAll": null, "context": 2, "deterministic": true}}})",
       "spec.parallelism.context", "set deterministic false or context 1"},
      {R"({"spec": {"model": {"moe": null}, "parallelism": {"expert": null, "expertAllToAll": null, "context": 2,
           "auto": true}}})",
       "spec.parallelism.context", "the planner chooses context parallelism itself"},
      // offload
      {R"({"spec": {"memory": {"offload": "optimizer"}, "parallelism": {"zero": 1}}})", "spec.memory.offload",
       "set spec.parallelism.zero 0"},
      // device cuda: expert parallelism only in the plain data-parallel path, with the flat exchange
      {R"({"spec": {"device": "cuda", "procsPerReplica": 2, "parallelism": {"tensor": 2}}})", "spec.parallelism.expert",
       "set spec.device cpu, tensor and pipeline 1, or expert 1"},
      {R"({"spec": {"device": "cuda", "parallelism": {"expertAllToAll": "hierarchical"}}})",
       "spec.parallelism.expertAllToAll", "use flat, or spec.device cpu"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.patch);
    ParsedJob p = parse_job(moe_job(Json::parse(c.patch)));
    REQUIRE(p.violation);
    CHECK(p.violation->field == c.field);
    CHECK(p.violation->message.find(c.field) == 0);
    CHECK_MESSAGE(p.violation->message.find(c.says) != std::string::npos, p.violation->message);
  }
  // The same job without the fault is valid (each case breaks one thing).
  CHECK_FALSE(parse_job(moe_job()).violation);
  CHECK(parse_job(moe_job(Json::parse(R"({"spec": {"parallelism": {"zero": 2}}})"))).spec.zero == 2);
  CHECK_FALSE(parse_job(moe_job(Json::parse(R"({"spec": {"memory": {"offload": "optimizer"}}})"))).violation);
  // Experts compose with tensor and pipeline parallelism (the worker's GptStage), also deterministic without expert.
  for (const char* ok : {R"({"spec": {"procsPerReplica": 2, "parallelism": {"tensor": 2}}})",
                         R"({"spec": {"procsPerReplica": 2, "parallelism": {"pipeline": 2}}})",
                         R"({"spec": {"procsPerReplica": 2, "parallelism": {"tensor": 2, "expert": 1,
                             "expertAllToAll": null, "deterministic": true}}})",
                         // device cuda (2026-11-27): expert parallelism with plain data parallelism and the flat
                         // exchange, MoE inside tensor parallelism without it, and the offloaded optimizer
                         R"({"spec": {"device": "cuda", "parallelism": {"expertAllToAll": "flat"}}})",
                         R"({"spec": {"device": "cuda", "procsPerReplica": 2, "parallelism": {"tensor": 2,
                             "expert": 1, "expertAllToAll": null}}})",
                         R"({"spec": {"device": "cuda", "model": {"moe": null}, "parallelism": {"expert": null,
                             "expertAllToAll": null}, "memory": {"offload": "optimizer"}}})"}) {
    CAPTURE(ok);
    const ParsedJob p = parse_job(moe_job(Json::parse(ok)));
    CHECK_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  }
}

TEST_CASE("an elastic MoE job resizes only to worlds whose data-parallel degree the expert degree divides") {
  Json j = moe_job(Json::parse(R"({"spec": {"elastic": {"minReplicas": 1, "maxReplicas": 4}}})"));
  JobSpec s = parse_job(j).spec;
  REQUIRE(s.expert == 2);
  CHECK(elastic_world_replicas(s, 4) == 4);
  // 3 healthy pods: 8 % (2*3) != 0 already, but 2 is the largest world expert 2 divides
  CHECK(elastic_world_replicas(s, 3) == 2);
  CHECK(elastic_world_replicas(s, 2) == 2);
  CHECK(elastic_world_replicas(s, 1) == 0);  // dp 1: the worker would exit 2; wait for capacity instead
  // A batch that 3 replicas split (12 / (1*3) = 4): only the expert degree keeps the world at 2.
  j["spec"]["training"]["globalBatch"] = 12;
  j["spec"]["training"]["microBatch"] = 1;
  ParsedJob p12 = parse_job(j);
  REQUIRE_FALSE(p12.violation);
  JobSpec s12 = p12.spec;
  CHECK(elastic_world_replicas(s12, 3) == 2);
  s12.expert = 1;
  CHECK(elastic_world_replicas(s12, 3) == 3);
}
