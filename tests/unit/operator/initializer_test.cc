// spec.initializer (docs/storage.md "Initializer"): what the spec accepts and refuses, and the pod that prepares the
// data: the worker pod's volumes and constraints, one container running `railyard data prepare --reuse`, nothing of
// the gang's (env, ports, GPUs, gang marks), bound by the cluster's scheduler.
#include "operator/controller/initializer.h"

#include <doctest/doctest.h>

#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::job_with;
using Json = nlohmann::json;

namespace {
Json init_job(const Json& init, bool storage = true) {
  Json patch = {{"spec", {{"initializer", init}}}};
  if (storage) patch["spec"]["storage"] = {{"size", "1Gi"}};
  return job_with(patch);
}
}  // namespace

TEST_CASE("spec.initializer: defaults, the output under spec.storage, and each field read") {
  ParsedJob p = parse_job(init_job({{"data", {{"sources", {"https://example.org/a.txt", "/in/b.txt"}}}}}));
  REQUIRE_FALSE(p.violation);
  REQUIRE(p.spec.initializer);
  CHECK(p.spec.initializer->sources == std::vector<std::string>{"https://example.org/a.txt", "/in/b.txt"});
  CHECK(p.spec.initializer->tokenizer == "bytes");
  CHECK(p.spec.initializer->val_fraction == doctest::Approx(0.1));
  CHECK(p.spec.initializer->output == "/shared/data");  // <storage.mountPath>/data

  p = parse_job(init_job(
      {{"data", {{"sources", {"http://c/x"}}, {"tokenizer", "gpt2"}, {"valFraction", 0.25}, {"output", "/in/out"}}}},
      false));
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.initializer->tokenizer == "gpt2");
  CHECK(p.spec.initializer->val_fraction == doctest::Approx(0.25));
  CHECK(p.spec.initializer->output == "/in/out");
}

TEST_CASE("spec.initializer: each bad value names its field and the fix") {
  struct Case {
    Json init;
    bool storage;
    const char* field;
  } cases[] = {
      {Json::object(), true, "spec.initializer"},
      {{{"model", Json::object()}}, true, "spec.initializer.model.source"},
      {{{"model", {{"source", "model.bin"}}}}, true, "spec.initializer.model.source"},
      {{{"model", {{"source", "https://m/x.bin"}}}}, true, "spec.initializer.model"},  // no spec.model.initFrom
      {{{"data", Json::object()}}, true, "spec.initializer.data.sources"},
      {{{"data", {{"sources", Json::array()}}}}, true, "spec.initializer.data.sources"},
      {{{"data", {{"sources", {"ftp://x/y"}}}}}, true, "spec.initializer.data.sources[0]"},
      {{{"data", {{"sources", {"/ok", "relative.txt"}}}}}, true, "spec.initializer.data.sources[1]"},
      {{{"data", {{"sources", {"http://"}}}}}, true, "spec.initializer.data.sources[0]"},
      {{{"data", {{"sources", {"/a"}}, {"tokenizer", "sentencepiece"}}}}, true, "spec.initializer.data.tokenizer"},
      {{{"data", {{"sources", {"/a"}}, {"valFraction", 1}}}}, true, "spec.initializer.data.valFraction"},
      {{{"data", {{"sources", {"/a"}}, {"output", "data"}}}}, true, "spec.initializer.data.output"},
      {{{"data", {{"sources", {"/a"}}}}}, false, "spec.initializer.data.output"},  // no storage, no output
  };
  for (const auto& c : cases) {
    ParsedJob p = parse_job(init_job(c.init, c.storage));
    REQUIRE_MESSAGE(p.violation, c.init.dump());
    CHECK_MESSAGE(p.violation->field == c.field, (c.init.dump() + " -> " + p.violation->field));
    CHECK(p.violation->message.rfind(c.field, 0) == 0);
  }
  Json many = Json::array();
  for (size_t i = 0; i <= kMaxInitializerSources; ++i) many.push_back("/f" + std::to_string(i));
  ParsedJob p = parse_job(init_job({{"data", {{"sources", many}}}}));
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.initializer.data.sources");
}

TEST_CASE("the command: railyard data prepare --reuse, next to the agent binary when that is a path") {
  InitializerSpec init;
  init.sources = {"http://corpus/a.txt", "/in/b.txt"};
  init.output = "/shared/data";
  init.val_fraction = 0.05;
  PodOptions o = railyard::op::testing::pod_options();
  CHECK(initializer_command(init, o) == std::vector<std::string>{"railyard", "data", "prepare", "--input",
                                                                 "http://corpus/a.txt", "/in/b.txt", "--output",
                                                                 "/shared/data", "--tokenizer", "bytes",
                                                                 "--val-fraction", "0.05", "--reuse"});
  o.worker_command = {"/repo/build/bin/railyard-worker"};
  CHECK(initializer_command(init, o).front() == "/repo/build/bin/railyard");
}

TEST_CASE("the initializer pod: the workers' volumes and constraints, none of the gang's env, ports or GPUs") {
  Json job = init_job({{"data", {{"sources", {"http://corpus/a.txt"}}}}});
  job["spec"]["device"] = "cuda";
  job["spec"]["template"] = Json::parse(R"({"metadata": {"labels": {"team": "a"}},
    "spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}],
             "volumes": [{"name": "in", "persistentVolumeClaim": {"claimName": "corpus"}}],
             "containers": [{"env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                             "volumeMounts": [{"name": "in", "mountPath": "/in"}],
                             "resources": {"requests": {"cpu": "2", "memory": "4Gi", "rdma/hca": "1"}},
                             "readinessProbe": {"exec": {"command": ["true"]}}},
                            {"name": "sidecar", "image": "busybox"}]}})");
  ParsedJob p = parse_job(job);
  REQUIRE_FALSE(p.violation);
  Json pod = build_initializer_pod(job, p.spec, railyard::op::testing::pod_options());
  CHECK(pod["metadata"]["name"] == "tiny-initializer");
  CHECK(pod["metadata"]["labels"]["railyard.dev/job"] == "tiny");
  CHECK(pod["metadata"]["labels"]["railyard.dev/role"] == "initializer");
  CHECK(pod["metadata"]["labels"]["team"] == "a");
  CHECK_FALSE(pod["metadata"]["labels"].contains("railyard.dev/replica-index"));
  CHECK(pod["metadata"]["ownerReferences"][0]["uid"] == "uid-1");
  CHECK(is_initializer_pod(pod));
  const Json& ps = pod["spec"];
  CHECK(ps["restartPolicy"] == "Never");
  CHECK(ps["schedulerName"] == "default-scheduler");  // the job's pods are Railyard's: kube-scheduler binds this one
  CHECK_FALSE(ps.contains("nodeName"));
  CHECK_FALSE(ps.contains("hostname"));
  CHECK(ps["tolerations"][0]["key"] == "gpu");
  REQUIRE(ps["containers"].size() == 1);  // no sidecar
  const Json& c = ps["containers"][0];
  CHECK(c["name"] == "initializer");
  CHECK(c["command"][3] == "--input");
  CHECK_FALSE(c.contains("args"));
  CHECK_FALSE(c.contains("ports"));
  CHECK_FALSE(c.contains("envFrom"));
  CHECK_FALSE(c.contains("readinessProbe"));
  CHECK(c["env"] == Json::array({{{"name", "HTTPS_PROXY"}, {"value", "http://proxy:3128"}}}));
  CHECK(c["resources"]["requests"] == Json{{"cpu", "2"}, {"memory", "4Gi"}});
  CHECK_FALSE(c["resources"]["limits"].contains("nvidia.com/gpu"));
  CHECK(c["securityContext"]["runAsNonRoot"] == true);
  bool in = false, storage = false;
  for (const Json& m : c["volumeMounts"]) {
    in = in || (m["name"] == "in" && m["mountPath"] == "/in");
    storage = storage || (m["name"] == "railyard-storage" && m["mountPath"] == "/shared");
  }
  CHECK(in);
  CHECK(storage);
  CHECK_FALSE(is_initializer_pod(build_worker_pod(job, p.spec, 0, 1, railyard::op::testing::pod_options())));

  // Another scheduler binds it like the job's pods, without the gang marks that would make it wait for the gang.
  job["spec"]["placement"] = {{"scheduler", "volcano"}};
  job["metadata"]["labels"] = {{"kueue.x-k8s.io/queue-name", "q"}};
  p = parse_job(job);
  REQUIRE_FALSE(p.violation);
  pod = build_initializer_pod(job, p.spec, railyard::op::testing::pod_options());
  CHECK(pod["spec"]["schedulerName"] == "volcano");
  CHECK_FALSE(pod["metadata"]["labels"].contains("scheduling.x-k8s.io/pod-group"));
  CHECK_FALSE(pod["metadata"]["labels"].contains("kueue.x-k8s.io/queue-name"));
  CHECK_FALSE(pod["metadata"].contains("annotations"));
}

TEST_CASE("the failed initializer's own words, sanitized") {
  Json pod = {
      {"status",
       {{"containerStatuses",
         Json::array(
             {{{"name", "initializer"},
               {"state", {{"terminated", {{"exitCode", 1}, {"message", "fetching\n\x1b[31mHTTP 404\x1b[0m"}}}}}}})}}}};
  CHECK(initializer_message(pod) == "fetching\nHTTP 404");
  CHECK(initializer_message(Json::object()).empty());
}

TEST_CASE("spec.initializer.model: fetched into spec.model.initFrom, before the data or alone") {
  Json job = init_job(
      {{"model", {{"source", "https://models.example/gpt2.bin"}}}, {"data", {{"sources", {"http://corpus/a.txt"}}}}});
  job["spec"]["model"]["initFrom"] = "/shared/model/initial.bin";
  ParsedJob p = parse_job(job);
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  CHECK(p.spec.initializer->model_source == "https://models.example/gpt2.bin");
  Json pod = build_initializer_pod(job, p.spec, railyard::op::testing::pod_options());
  REQUIRE(pod["spec"]["initContainers"].size() == 1);
  const Json& m = pod["spec"]["initContainers"][0];
  CHECK(m["name"] == "model");
  CHECK(m["command"] == Json::array({"railyard", "model", "fetch", "https://models.example/gpt2.bin", "--output",
                                     "/shared/model/initial.bin"}));
  CHECK(m["volumeMounts"] == pod["spec"]["containers"][0]["volumeMounts"]);
  CHECK(pod["spec"]["containers"][0]["command"][2] == "prepare");

  // The model alone: the one container fetches it.
  job["spec"]["initializer"].erase("data");
  p = parse_job(job);
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.initializer->sources.empty());
  pod = build_initializer_pod(job, p.spec, railyard::op::testing::pod_options());
  CHECK_FALSE(pod["spec"].contains("initContainers"));
  CHECK(pod["spec"]["containers"][0]["command"][1] == "model");

  // A program loads its own model.
  Json prog = job_with(Json::parse(R"({"spec": {"model": null, "data": null, "training": null, "parallelism": null,
    "program": {"command": ["python3", "/app/train.py"]}, "storage": {"size": "1Gi"},
    "initializer": {"model": {"source": "https://m/x.bin"}}}})"));
  p = parse_job(prog);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.initializer.model");
  // A program's data: prepared in Railyard's worker image (the program's own image need not have the CLI).
  prog["spec"]["initializer"] = {{"data", {{"sources", {"http://corpus/a.txt"}}}}};
  prog["spec"]["image"] = "example/pytorch:1";
  p = parse_job(prog);
  REQUIRE_FALSE(p.violation);
  const PodOptions opts = railyard::op::testing::pod_options();
  Json prog_pod = build_initializer_pod(prog, p.spec, opts);
  CHECK(prog_pod["spec"]["containers"][0]["image"] == opts.worker_image);
  CHECK_FALSE(prog_pod["spec"].contains("initContainers"));  // no launcher
  CHECK(build_worker_pod(prog, p.spec, 0, 1, opts)["spec"]["containers"][0]["image"] == "example/pytorch:1");

  // A failed model fetch speaks for the pod (its init container), not the container that never ran.
  Json failed = {
      {"status",
       {{"initContainerStatuses",
         Json::array({{{"name", "model"}, {"state", {{"terminated", {{"exitCode", 1}, {"message", "bad magic"}}}}}}})},
        {"containerStatuses", Json::array({{{"name", "initializer"}, {"state", {{"waiting", Json::object()}}}}})}}}};
  CHECK(initializer_message(failed) == "bad magic");
}
