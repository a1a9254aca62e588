// spec.initializer (docs/storage.md "Initializer"): what the spec accepts and refuses, and the pod that prepares the
// data: the worker pod's volumes and constraints, one container running `railyard data prepare --reuse`, nothing of
// the gang's (env, ports, GPUs, gang marks), bound by the cluster's scheduler.
#include "operator/controller/initializer.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

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

TEST_CASE(
    "spec.initializer.data.image: read and checked; an init container of the image copies it for the initializer") {
  Json job = init_job(
      {{"data",
        {{"sources", {"http://corpus/a.txt"}},
         {"image",
          {{"reference", "registry.example/corpus:v1"}, {"path", "/corpus"}, {"pullPolicy", "IfNotPresent"}}}}}});
  job["spec"]["model"]["initFrom"] = "/shared/model/initial.bin";
  job["spec"]["initializer"]["model"] = {{"source", "https://m/x.bin"}};
  ParsedJob p = parse_job(job);
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  const InitializerSpec& init = *p.spec.initializer;
  CHECK(init.image == "registry.example/corpus:v1");
  CHECK(init.image_path == "/corpus");
  CHECK(init.image_pull_policy == "IfNotPresent");
  const PodOptions opts = railyard::op::testing::pod_options();
  // The copy is an input directory after the sources.
  const std::vector<std::string> cmd = initializer_command(init, opts);
  REQUIRE(cmd.size() > 6);
  CHECK(cmd[4] == "http://corpus/a.txt");
  CHECK(cmd[5] == "/railyard-image-data");
  CHECK(cmd[6] == "--output");

  Json pod = build_initializer_pod(job, p.spec, opts);
  const Json& ps = pod["spec"];
  REQUIRE(ps["initContainers"].size() == 2);  // the image's copy first, then the model
  const Json& d = ps["initContainers"][0];
  const Json& c = ps["containers"][0];
  CHECK(d["name"] == "data-image");
  CHECK(ps["initContainers"][1]["name"] == "model");
  CHECK(d["image"] == "registry.example/corpus:v1");
  CHECK(d["imagePullPolicy"] == "IfNotPresent");
  CHECK(d["command"][0] == "sh");
  CHECK(d["command"].back() == "/corpus");
  CHECK(d["env"] == Json::array());
  // It mounts the emptyDir alone: nothing of the job's volumes.
  CHECK(d["volumeMounts"] == Json::array({{{"name", "railyard-image-data"}, {"mountPath", "/railyard-image-data"}}}));
  CHECK(d["securityContext"] == c["securityContext"]);
  CHECK(d.value("resources", Json()) == c.value("resources", Json()));
  bool empty_dir = false, read_only = false;
  for (const Json& v : ps["volumes"])
    empty_dir = empty_dir || (v["name"] == "railyard-image-data" && v.contains("emptyDir"));
  for (const Json& m : c["volumeMounts"])
    read_only = read_only || (m["name"] == "railyard-image-data" && m["mountPath"] == "/railyard-image-data" &&
                              m["readOnly"] == true);
  CHECK(empty_dir);
  CHECK(read_only);
  // The model's init container reads no image data.
  for (const Json& m : ps["initContainers"][1]["volumeMounts"]) CHECK(m["name"] != "railyard-image-data");

  // The image alone is data enough; no pull policy: the cluster's default.
  job["spec"]["initializer"] = {{"data", {{"image", {{"reference", "corpus:v1"}, {"path", "/corpus/all.txt"}}}}}};
  p = parse_job(job);
  REQUIRE_MESSAGE(!p.violation, (p.violation ? p.violation->message : ""));
  CHECK(p.spec.initializer->sources.empty());
  pod = build_initializer_pod(job, p.spec, opts);
  CHECK(pod["spec"]["containers"][0]["command"][2] == "prepare");
  CHECK(pod["spec"]["containers"][0]["command"][4] == "/railyard-image-data");
  CHECK_FALSE(pod["spec"]["initContainers"][0].contains("imagePullPolicy"));

  // Each bad value names its field.
  struct Case {
    Json image;
    const char* field;
  } cases[] = {
      {{{"path", "/c"}}, "spec.initializer.data.image.reference"},
      {{{"reference", ""}, {"path", "/c"}}, "spec.initializer.data.image.reference"},
      {{{"reference", "corpus v1"}, {"path", "/c"}}, "spec.initializer.data.image.reference"},
      {{{"reference", "corpus:v1\n"}, {"path", "/c"}}, "spec.initializer.data.image.reference"},
      {{{"reference", "x:1"}}, "spec.initializer.data.image.path"},
      {{{"reference", "x:1"}, {"path", "corpus"}}, "spec.initializer.data.image.path"},
      {{{"reference", "x:1"}, {"path", "/a/../etc"}}, "spec.initializer.data.image.path"},
      {{{"reference", "x:1"}, {"path", "/c"}, {"pullPolicy", "Sometimes"}}, "spec.initializer.data.image.pullPolicy"},
      {"x:1", "spec.initializer.data.image"},
  };
  for (const auto& k : cases) {
    ParsedJob bad = parse_job(init_job({{"data", {{"image", k.image}}}}));
    REQUIRE_MESSAGE(bad.violation, k.image.dump());
    CHECK_MESSAGE(bad.violation->field == k.field, (k.image.dump() + " -> " + bad.violation->field));
  }
  // The template's own volume of the initializer's volume name.
  Json clash = init_job({{"data", {{"image", {{"reference", "x:1"}, {"path", "/c"}}}}}});
  clash["spec"]["template"] =
      Json::parse(R"({"spec": {"volumes": [{"name": "railyard-image-data", "emptyDir": {}}], "containers": [{}]}})");
  ParsedJob bad = parse_job(clash);
  REQUIRE(bad.violation);
  CHECK(bad.violation->field == "spec.template.spec.volumes");

  // Its failure is the one named.
  Json failed = {
      {"status",
       {{"initContainerStatuses",
         Json::array({{{"name", "data-image"},
                       {"state", {{"terminated", {{"exitCode", 1}, {"message", "cp: /corpus: No such file"}}}}}}})}}}};
  CHECK(initializer_message(failed) == "cp: /corpus: No such file");
}

TEST_CASE("the data-image container's script copies a directory's contents, or a file, with sh and cp") {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / ("railyard-image-copy-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "image/corpus/sub");
  std::ofstream(tmp / "image/corpus/a.txt") << "alpha";
  std::ofstream(tmp / "image/corpus/sub/b.txt") << "beta";
  auto run = [&](const std::string& path, const fs::path& dest) {
    fs::create_directories(dest);
    InitializerSpec init;
    init.image_path = path;
    std::vector<std::string> argv = data_image_command(init);
    argv[3] = dest.string();  // $0: the emptyDir's mount, here a directory of the test's
    std::string line;
    for (const std::string& a : argv) {
      std::string q = "'";
      for (char ch : a) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      line += q + "' ";
    }
    return std::system((line + ">/dev/null 2>&1").c_str());
  };
  REQUIRE(data_image_command(InitializerSpec{}).size() == 5);
  CHECK(run((tmp / "image/corpus").string(), tmp / "dir") == 0);
  CHECK(fs::exists(tmp / "dir/a.txt"));
  CHECK(fs::exists(tmp / "dir/sub/b.txt"));
  CHECK_FALSE(fs::exists(tmp / "dir/corpus"));  // the contents, not the directory itself
  CHECK(run((tmp / "image/corpus/a.txt").string(), tmp / "file") == 0);
  CHECK(fs::exists(tmp / "file/a.txt"));
  CHECK(run((tmp / "image/missing").string(), tmp / "none") != 0);  // fails: the pod's message names it
  fs::remove_all(tmp);
}
