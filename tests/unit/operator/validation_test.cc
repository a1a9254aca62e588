// Cross-field validation of TrainingJobs: each malformed manifest is Invalid with a reason and message naming the
// field and a fix.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "operator/api.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::config_json;
using railyard::op::testing::job_with;
using railyard::op::testing::valid_job;
using Json = nlohmann::json;

TEST_CASE("a valid job parses with the CRD defaults and resolves its preset") {
  ParsedJob p = parse_job(valid_job());
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.replicas == 2);
  CHECK(p.spec.model.layers == 4);
  CHECK(p.spec.model.heads == 4);
  CHECK(p.spec.model.hidden == 128);
  CHECK(p.spec.seq_len == 64);
  CHECK(p.spec.max_restarts == 3);
  CHECK(p.spec.clean_pod_policy == "Running");
  CHECK(*p.spec.data == 2);
}

TEST_CASE("a gpt2 preset with tensor and pipeline parallelism is valid") {
  Json j = job_with(Json::parse(R"({"spec": {"replicas": 4, "procsPerReplica": 8, "device": "cuda",
      "model": {"preset": "gpt2-350m"}, "training": {"globalBatch": 64, "microBatch": 2, "seqLen": 1024},
      "parallelism": {"tensor": 8, "pipeline": 2, "data": 2}}})"));
  ParsedJob p = parse_job(j);
  CHECK_FALSE(p.violation);
  WorldLayout w = world_layout(p.spec, 4);
  CHECK(w.size == 32);
  CHECK(w.tensor == 8);
  CHECK(w.pipeline == 2);
  CHECK(w.data == 2);
}

struct BadCase {
  const char* what;
  const char* patch;
  const char* field;
};

TEST_CASE("malformed manifests are Invalid, naming the field and the fix") {
  const std::vector<BadCase> cases = {
      {"tensor does not divide heads", R"({"spec": {"procsPerReplica": 4, "replicas": 1,
          "parallelism": {"tensor": 3, "data": null}}})",
       "spec.parallelism.tensor"},
      {"tensor exceeds procs per pod", R"({"spec": {"parallelism": {"tensor": 2, "data": 1}}})",
       "spec.parallelism.tensor"},
      {"pipeline does not divide layers", R"({"spec": {"replicas": 3, "parallelism": {"pipeline": 3, "data": 1}}})",
       "spec.parallelism.pipeline"},
      {"dp*tp*pp differs from world", R"({"spec": {"parallelism": {"data": 3}}})", "spec.parallelism.data"},
      {"world not divisible by tp*pp", R"({"spec": {"replicas": 3, "parallelism": {"pipeline": 2, "data": null}}})",
       "spec.parallelism.pipeline"},
      {"global batch not divisible", R"({"spec": {"training": {"globalBatch": 6}}})", "spec.training.globalBatch"},
      {"min above max", R"({"spec": {"elastic": {"minReplicas": 4, "maxReplicas": 2}}})", "spec.elastic.minReplicas"},
      {"replicas below min", R"({"spec": {"elastic": {"minReplicas": 3, "maxReplicas": 4}}})", "spec.replicas"},
      {"replicas above max", R"({"spec": {"elastic": {"minReplicas": 1, "maxReplicas": 1}}})", "spec.replicas"},
      {"custom preset missing a size", R"({"spec": {"model": {"preset": "custom", "layers": 2, "hidden": 64,
          "heads": 4, "seqLen": 128}}})",
       "spec.model.vocab"},
      {"custom hidden not divisible by heads", R"({"spec": {"model": {"preset": "custom", "layers": 2,
          "hidden": 66, "heads": 4, "seqLen": 128, "vocab": 256}}})",
       "spec.model.hidden"},
      {"unknown preset", R"({"spec": {"model": {"preset": "gpt5"}}})", "spec.model.preset"},
      {"negative replicas", R"({"spec": {"replicas": -1}})", "spec.replicas"},
      {"replicas as a string", R"({"spec": {"replicas": "two"}})", "spec.replicas"},
      {"zero procs per replica", R"({"spec": {"procsPerReplica": 0}})", "spec.procsPerReplica"},
      {"steps missing", R"({"spec": {"training": {"steps": null}}})", "spec.training.steps"},
      {"training seqLen longer than the model's", R"({"spec": {"training": {"seqLen": 512}}})", "spec.training.seqLen"},
      {"no training data", R"({"spec": {"data": {"train": null}}})", "spec.data.train"},
      {"model missing", R"({"spec": {"model": null}})", "spec.model"},
      {"unknown device", R"({"spec": {"device": "tpu"}})", "spec.device"},
      {"template not an object", R"({"spec": {"template": "sh -c true"}})", "spec.template"},
      {"template command not a list", R"({"spec": {"template": {"spec": {"containers": [{"command": "sh"}]}}}})",
       "spec.template.spec.containers[0].command"},
      {"exit code out of range", R"({"spec": {"failurePolicy": {"permanentExitCodes": [1, 300]}}})",
       "spec.failurePolicy.permanentExitCodes[1]"},
      {"exit code in both lists", R"({"spec": {"failurePolicy": {"permanentExitCodes": [3],
          "retryableExitCodes": [3]}}})",
       "spec.failurePolicy.retryableExitCodes"},
      {"unknown cleanPodPolicy", R"({"spec": {"runPolicy": {"cleanPodPolicy": "Some"}}})",
       "spec.runPolicy.cleanPodPolicy"},
      {"suspend not a boolean", R"({"spec": {"runPolicy": {"suspend": "yes"}}})", "spec.runPolicy.suspend"},
      {"name too long for pod names",
       R"({"metadata": {"name": "a-very-long-training-job-name-that-exceeds-the-limits"}})", "metadata.name"},
      {"learningRate zero", R"({"spec": {"training": {"learningRate": 0}}})", "spec.training.learningRate"},
      {"minLrFraction above 1", R"({"spec": {"training": {"minLrFraction": 1.5}}})", "spec.training.minLrFraction"},
      {"seed not an integer", R"({"spec": {"training": {"seed": "x"}}})", "spec.training.seed"},
      {"checkpoint.async not a boolean", R"({"spec": {"checkpoint": {"async": "yes"}}})", "spec.checkpoint.async"},
      {"initFrom not a string", R"({"spec": {"model": {"initFrom": 7}}})", "spec.model.initFrom"},
      {"initFrom empty", R"({"spec": {"model": {"initFrom": ""}}})", "spec.model.initFrom"},
      {"initFrom with experts", R"({"spec": {"model": {"initFrom": "/data/gpt2.bin", "moe": {"experts": 4}}}})",
       "spec.model.initFrom"},
      {"val not a string", R"({"spec": {"data": {"val": ["/data/val_*.bin"]}}})", "spec.data.val"},
      {"scheduler not a name", R"({"spec": {"placement": {"scheduler": "Default Scheduler"}}})",
       "spec.placement.scheduler"},
      {"hard mode with another scheduler", R"({"spec": {"placement": {"scheduler": "default-scheduler",
          "mode": "hard"}}})",
       "spec.placement.mode"},
      {"topology keys with another scheduler", R"({"spec": {"placement": {"scheduler": "volcano",
          "topologyKeys": ["rail"]}}})",
       "spec.placement.topologyKeys"},
  };
  CHECK(cases.size() >= 15);
  for (const auto& c : cases) {
    std::string what = c.what;
    CAPTURE(what);
    ParsedJob p = parse_job(job_with(Json::parse(c.patch)));
    REQUIRE(p.violation);
    CHECK(p.violation->field == c.field);
    // The message starts with the field and carries a fix after the last colon.
    CHECK(p.violation->message.rfind(c.field, 0) == 0);
    CHECK(p.violation->message.size() > std::string(c.field).size() + 10);
    CHECK(p.violation->reason.rfind("Invalid", 0) == 0);
    CHECK(p.violation->reason.find('.') == std::string::npos);
  }
}

TEST_CASE("reasons are CamelCase names of the field") {
  ParsedJob p = parse_job(job_with(Json::parse(R"({"spec": {"procsPerReplica": 4, "replicas": 1,
      "parallelism": {"tensor": 3, "data": null}}})")));
  REQUIRE(p.violation);
  CHECK(p.violation->reason == "InvalidParallelismTensor");
  CHECK(p.violation->message.find("use one of 1, 2, 4") != std::string::npos);
}

TEST_CASE("non-object input never throws") {
  CHECK(parse_job(Json::array()).violation);
  CHECK(parse_job(Json::parse(R"({"metadata": {"name": "x"}})")).violation->field == "spec");
  CHECK(parse_job(Json::parse(R"({"metadata": {"name": "x"}, "spec": 5})")).violation->field == "spec");
}

TEST_CASE("data-parallel degree follows the replica count when not given (generation math on resize)") {
  Json j = job_with(Json::parse(R"({"spec": {"replicas": 4, "elastic": {"minReplicas": 2, "maxReplicas": 4},
      "training": {"globalBatch": 16, "microBatch": 2}, "parallelism": {"data": null}}})"));
  ParsedJob p = parse_job(j);
  REQUIRE_FALSE(p.violation);
  CHECK(world_layout(p.spec, 4).data == 4);
  CHECK(world_layout(p.spec, 2).data == 2);
  Json cfg4 = config_json(p.spec, 4), cfg2 = config_json(p.spec, 2);
  CHECK(cfg4["layout"]["dp"] == 4);
  CHECK(cfg2["layout"]["dp"] == 2);
  // Global batch stays constant: accumulation absorbs the change.
  CHECK(cfg4["training"]["gradAccumulation"] == 2);
  CHECK(cfg2["training"]["gradAccumulation"] == 4);
  CHECK(cfg2["training"]["globalBatch"] == 16);
}

TEST_CASE("an elastic job shrinks to the largest world its batch and degrees allow, never below minReplicas") {
  Json j = job_with(Json::parse(R"({"spec": {"replicas": 4, "elastic": {"minReplicas": 2, "maxReplicas": 4},
      "training": {"globalBatch": 16, "microBatch": 2}, "parallelism": {"data": null}}})"));
  JobSpec s = parse_job(j).spec;
  CHECK(elastic_world_replicas(s, 4) == 4);
  CHECK(elastic_world_replicas(s, 3) == 2);  // 16 % (2*3) != 0: run 2 of the 3 healthy pods
  CHECK(elastic_world_replicas(s, 2) == 2);
  CHECK(elastic_world_replicas(s, 1) == 0);     // below minReplicas: wait instead
  CHECK(elastic_world_replicas(s, 9) == 4);     // never above replicas
  JobSpec fixed = parse_job(valid_job()).spec;  // not elastic
  CHECK(elastic_world_replicas(fixed, 1) == 0);
}

TEST_CASE("spec.checkpoint.memoryIntervalSteps reaches the worker's resolved config; 0 when unset; negative refused") {
  CHECK(config_json(parse_job(valid_job()).spec, 2)["checkpoint"]["memoryIntervalSteps"] == 0);
  Json j = job_with(Json::parse(R"({"spec": {"checkpoint": {"path": "/ckpt", "memoryIntervalSteps": 2}}})"));
  ParsedJob p = parse_job(j);
  REQUIRE_FALSE(p.violation);
  CHECK(config_json(p.spec, 2)["checkpoint"]["memoryIntervalSteps"] == 2);
  ParsedJob bad = parse_job(job_with(Json::parse(R"({"spec": {"checkpoint": {"memoryIntervalSteps": -1}}})")));
  REQUIRE(bad.violation);
  CHECK(bad.violation->field == "spec.checkpoint.memoryIntervalSteps");
}

TEST_CASE("data and checkpoint paths outside the operator's roots are Invalid, naming the field") {
  const PathRoots roots{"/data", "/ckpt"};
  CHECK_FALSE(check_path_roots(parse_job(valid_job()).spec, PathRoots{}));  // no roots: no restriction
  CHECK_FALSE(check_path_roots(parse_job(valid_job()).spec, roots));        // /data/train_*.bin
  Json ok = job_with(Json::parse(R"({"spec": {"data": {"train": "/data/a/../b/train_*.bin", "val": "/data/v"},
                                    "checkpoint": {"path": "/ckpt/team-a/run1"}}})"));
  CHECK_FALSE(check_path_roots(parse_job(ok).spec, roots));

  struct Case {
    const char* patch;
    const char* field;
    const char* says;
  } cases[] = {
      {R"({"spec": {"data": {"train": "/data/../etc/train_*.bin"}}})", "spec.data.train",
       "spec.data.train '/data/../etc/train_*.bin' (resolves to /etc/train_*.bin) is outside the operator's "
       "--data-root /data"},
      {R"({"spec": {"data": {"train": "/data2/train_*.bin"}}})", "spec.data.train",
       "outside the operator's --data-root"},
      {R"({"spec": {"data": {"val": "/data/../../val"}}})", "spec.data.val", "outside the operator's --data-root"},
      {R"({"spec": {"data": {"train": "data/train_*.bin"}}})", "spec.data.train", "must be an absolute path"},
      {R"({"spec": {"checkpoint": {"path": "/ckpt/../data/x"}}})", "spec.checkpoint.path",
       "outside the operator's --checkpoint-root /ckpt"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.patch);
    ParsedJob p = parse_job(job_with(Json::parse(c.patch)));
    REQUIRE_FALSE(p.violation);  // the spec itself is fine; only the roots refuse it
    auto v = check_path_roots(p.spec, roots);
    REQUIRE(v);
    CHECK(v->field == c.field);
    CHECK(v->reason == "PathOutsideRoot");
    CHECK(v->message.find(c.field) == 0);
    CHECK(v->message.find(c.says) != std::string::npos);
  }
}

TEST_CASE("spec.model.initFrom is read and reaches the worker's resolved config; absent means random init") {
  ParsedJob plain = parse_job(valid_job());
  REQUIRE_FALSE(plain.violation);
  CHECK(plain.spec.init_from.empty());
  CHECK_FALSE(config_json(plain.spec, 2)["model"].contains("initFrom"));

  ParsedJob p = parse_job(job_with(Json::parse(R"({"spec": {"model": {"preset": "gpt2-124m",
      "initFrom": "/data/models/gpt2_124M.bin"}, "training": {"seqLen": 64}}})")));
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.init_from == "/data/models/gpt2_124M.bin");
  const Json cfg = config_json(p.spec, 2);
  CHECK(cfg["model"]["initFrom"] == "/data/models/gpt2_124M.bin");
  CHECK(cfg["model"]["layers"] == 12);  // the shape the worker checks the file against

  const ParsedJob moe = parse_job(job_with(Json::parse(R"({"spec": {"model": {"initFrom": "/data/m.bin",
      "moe": {"experts": 4}}}})")));
  REQUIRE(moe.violation);
  CHECK(moe.violation->message ==
        "spec.model.initFrom: with spec.model.moe: llm.c GPT-2 files hold dense models only: drop initFrom (random "
        "init) or drop spec.model.moe");
  const ParsedJob empty = parse_job(job_with(Json::parse(R"({"spec": {"model": {"initFrom": ""}}})")));
  REQUIRE(empty.violation);
  CHECK(empty.violation->reason == "InvalidModelInitFrom");
  CHECK(empty.violation->message.find("spec.model.initFrom: is empty") == 0);
}

TEST_CASE("spec.model.initFrom must lie under the data or the checkpoint root") {
  auto check = [](const char* init_from, const PathRoots& roots) {
    Json j = job_with(Json{{"spec", {{"model", {{"initFrom", init_from}}}}}});
    ParsedJob p = parse_job(j);
    REQUIRE_FALSE(p.violation);
    return check_path_roots(p.spec, roots);
  };
  const PathRoots both{"/data", "/ckpt"};
  CHECK_FALSE(check("/data/models/gpt2.bin", both));
  CHECK_FALSE(check("/ckpt/team-a/run1/export.bin", both));  // an earlier job's export
  CHECK_FALSE(check("/anywhere/gpt2.bin", PathRoots{}));
  auto v = check("/etc/gpt2.bin", both);
  REQUIRE(v);
  CHECK(v->field == "spec.model.initFrom");
  CHECK(v->reason == "PathOutsideRoot");
  CHECK(v->message ==
        "spec.model.initFrom '/etc/gpt2.bin' is outside both the operator's --data-root /data and --checkpoint-root "
        "/ckpt: use a model file under one of them or ask the platform team to widen a root");
  v = check("/data/../etc/gpt2.bin", PathRoots{"/data", ""});
  REQUIRE(v);
  CHECK(v->message.find("spec.model.initFrom '/data/../etc/gpt2.bin' (resolves to /etc/gpt2.bin) is outside the "
                        "operator's --data-root /data") == 0);
  v = check("models/gpt2.bin", both);
  REQUIRE(v);
  CHECK(v->message.find("must be an absolute path") != std::string::npos);
}

TEST_CASE("spec.data.train and spec.data.val reach the worker's resolved config as written; val absent = default") {
  ParsedJob p = parse_job(valid_job());
  REQUIRE_FALSE(p.violation);
  Json cfg = config_json(p.spec, 2);
  CHECK(cfg["data"] == Json{{"train", "/data/train_*.bin"}});  // no val: the worker's val_*.bin beside train
  p = parse_job(job_with(Json::parse(R"({"spec": {"data": {"train": "/data/web/shard_0[0-4]*.bin",
      "val": "/data/web/shard_09*.bin"}}})")));
  REQUIRE_FALSE(p.violation);
  cfg = config_json(p.spec, 2);
  CHECK(cfg["data"]["train"] == "/data/web/shard_0[0-4]*.bin");
  CHECK(cfg["data"]["val"] == "/data/web/shard_09*.bin");
  p = parse_job(job_with(Json::parse(R"({"spec": {"data": {"val": ""}}})")));
  REQUIRE_FALSE(p.violation);
  CHECK_FALSE(config_json(p.spec, 2)["data"].contains("val"));
}

TEST_CASE("spec.parallelism.deterministic reaches the worker's resolved config with the ZeRO stage; false by default") {
  Json off = config_json(parse_job(valid_job()).spec, 2);
  CHECK(off["parallelism"]["deterministic"] == false);
  // The worker reads the config's `parallelism` instead of spec.parallelism, so the ZeRO stage must be in it too.
  Json j = job_with(Json::parse(R"({"spec": {"training": {"globalBatch": 16, "microBatch": 2},
      "parallelism": {"deterministic": true, "zero": 1}}})"));
  ParsedJob p = parse_job(j);
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.deterministic);
  Json cfg = config_json(p.spec, 2);
  CHECK(cfg["parallelism"]["deterministic"] == true);
  CHECK(cfg["parallelism"]["zero"] == 1);
  ParsedJob bad_type = parse_job(job_with(Json::parse(R"({"spec": {"parallelism": {"deterministic": "yes"}}})")));
  REQUIRE(bad_type.violation);
  CHECK(bad_type.violation->field == "spec.parallelism.deterministic");
}

TEST_CASE("deterministic mode needs a power-of-two accumulation per rank, also when an elastic job shrinks") {
  // 24 / (2*2) = 6 micro-batches per rank: the worker's fixed tree would refuse it (exit 2), so the operator does.
  ParsedJob bad = parse_job(job_with(Json::parse(
      R"({"spec": {"training": {"globalBatch": 24, "microBatch": 2}, "parallelism": {"deterministic": true}}})")));
  REQUIRE(bad.violation);
  CHECK(bad.violation->field == "spec.parallelism.deterministic");
  CHECK(bad.violation->message.find("= 6") != std::string::npos);
  // 16 / (2*4) = 2 at 4 replicas, 16 / (2*2) = 4 at 2; 3 replicas do not divide the batch and 1 replica is plain.
  Json el = job_with(Json::parse(R"({"spec": {"replicas": 4, "elastic": {"minReplicas": 1, "maxReplicas": 4},
      "training": {"globalBatch": 16, "microBatch": 2}, "parallelism": {"data": null, "deterministic": true}}})"));
  JobSpec s = parse_job(el).spec;
  REQUIRE(s.deterministic);
  CHECK(elastic_world_replicas(s, 4) == 4);
  CHECK(elastic_world_replicas(s, 3) == 2);
  // 12 / (2*3) = 2 would be fine but 12 / (2*2) = 3 is not: a 2-replica world is skipped for 1.
  el["spec"]["training"]["globalBatch"] = 12;
  el["spec"]["replicas"] = 3;
  el["spec"]["elastic"]["maxReplicas"] = 3;
  JobSpec s12 = parse_job(el).spec;
  CHECK(elastic_world_replicas(s12, 3) == 3);
  CHECK(elastic_world_replicas(s12, 2) == 1);
  s12.deterministic = false;
  CHECK(elastic_world_replicas(s12, 2) == 2);
}

TEST_CASE("spec.placement.scheduler: railyard by default, another scheduler's name as given") {
  CHECK(parse_job(valid_job()).spec.scheduler == "railyard");
  ParsedJob p = parse_job(job_with(Json::parse(R"({"spec": {"placement": {"scheduler": "default-scheduler",
      "railAware": true, "mode": "soft", "nodeSelector": {"pool": "a"}}}})")));
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.scheduler == "default-scheduler");
  // A malformed mode next to another scheduler is a clear violation later (the CRD's enum), never an exception here.
  CHECK_NOTHROW(parse_job(job_with(Json::parse(R"({"spec": {"placement": {"scheduler": "volcano", "mode": 7}}})"))));
  // Railyard's own placement keeps hard mode and topology keys.
  CHECK_FALSE(parse_job(job_with(Json::parse(R"({"spec": {"placement": {"scheduler": "railyard", "mode": "hard",
      "topologyKeys": ["rail"]}}})")))
                  .violation);
}
