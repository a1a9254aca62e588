// Jobs that bring their own program (spec.program, docs/programs.md): parsed without the built-in trainer's fields,
// refused naming the field when mixed with them, and built into pods whose launcher reaches an image without
// Railyard in it.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "operator/api.h"
#include "operator/controller/failure_policy.h"
#include "operator/controller/pod_builder.h"
#include "tests/ctest_env.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::resolved_env;
using railyard::op::testing::valid_job;
using Json = nlohmann::json;

namespace {

// The fixture's program job, elastic from 1 to 3 replicas, with its arguments, step count, checkpoints and restarts;
// then `patch`.
Json program_job(const Json& patch = Json::object()) {
  return testing::program_job_with(Json::parse(R"({"spec": {
      "program": {"args": ["--steps", "300"], "totalSteps": 300},
      "elastic": {"minReplicas": 1, "maxReplicas": 3},
      "checkpoint": {"path": "/shared/ckpt/ddp", "intervalSteps": 20},
      "failurePolicy": {"maxRestarts": 5}}})"),
                                   patch);
}

}  // namespace

TEST_CASE("a program job needs none of the built-in trainer's fields") {
  ParsedJob p = parse_job(program_job());
  REQUIRE_FALSE(p.violation);
  CHECK(p.spec.program);
  CHECK(p.spec.program_command == std::vector<std::string>{"python3", "/app/train.py"});
  CHECK(p.spec.program_args == std::vector<std::string>{"--steps", "300"});
  CHECK(p.spec.steps == 300);
  CHECK(p.spec.checkpoint_interval_steps == 20);
  // Any world in the elastic range: the trainer's batch divisibility is not the program's concern.
  CHECK(elastic_world_replicas(p.spec, 1) == 1);
  CHECK(elastic_world_replicas(p.spec, 2) == 2);
  CHECK(progress_text(17, p.spec.steps) == "17/300");
  CHECK(progress_text(17, 0) == "17");
}

TEST_CASE("a program job mixed with the trainer's sections is refused, naming the section") {
  for (const char* section : {"model", "data", "training", "parallelism", "memory"}) {
    CAPTURE(section);
    Json patch = {{"spec", {{section, Json::object()}}}};
    ParsedJob p = parse_job(program_job(patch));
    REQUIRE(p.violation);
    CHECK(p.violation->field == std::string("spec.") + section);
    CHECK(p.violation->message.find("spec.program") != std::string::npos);
  }
  for (const char* key : {"command", "args", "image"}) {
    CAPTURE(key);
    Json patch = {{"spec", {{"template", {{"spec", {{"containers", Json::array({{{key, "x"}}})}}}}}}}};
    ParsedJob p = parse_job(program_job(patch));
    REQUIRE(p.violation);
    CHECK(p.violation->field == std::string("spec.template.spec.containers[0].") + key);
  }
  ParsedJob empty = parse_job(program_job({{"spec", {{"program", {{"command", Json::array()}}}}}}));
  REQUIRE(empty.violation);
  CHECK(empty.violation->field == "spec.program.command");
  ParsedJob wrong = parse_job(program_job({{"spec", {{"program", {{"command", Json::array({"python3", 3})}}}}}}));
  REQUIRE(wrong.violation);
  CHECK(wrong.violation->field == "spec.program.command[1]");
}

TEST_CASE("a program's failures restart it by default, as under torchrun; listed codes keep their class") {
  JobSpec spec = parse_job(program_job()).spec;
  // A rank whose peer died fails its collective and exits 1: with the trainer's default (1-127 permanent) the job
  // would fail before the lost node is noticed.
  CHECK(classify_exit(spec, 1) == ExitClass::Retryable);
  CHECK(classify_exit(spec, 127) == ExitClass::Retryable);
  CHECK(classify_exit(spec, -1, 9) == ExitClass::Retryable);
  CHECK(classify_exit(spec, 0) == ExitClass::Success);
  JobSpec listed =
      parse_job(program_job({{"spec", {{"failurePolicy", {{"permanentExitCodes", Json::array({3})}}}}}})).spec;
  CHECK(classify_exit(listed, 3) == ExitClass::Permanent);
  CHECK(classify_exit(listed, 1) == ExitClass::Retryable);
  // The restart budget still ends it.
  CHECK(decide_restart(spec, 5, 7, "WorkerExit", "rank 1 exited with code 1", false).fail);
  CHECK_FALSE(decide_restart(spec, 4, 7, "WorkerExit", "rank 1 exited with code 1", false).fail);
}

TEST_CASE("a job with neither spec.program nor spec.model names both") {
  Json j = program_job({{"spec", {{"program", nullptr}}}});
  ParsedJob p = parse_job(j);
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.model");
  CHECK(p.violation->message.find("spec.program") != std::string::npos);
}

TEST_CASE("a program pod: the launcher copied by an init container runs the program in the job's image") {
  Json job = program_job(
      {{"spec",
        {{"template",
          {{"spec",
            {{"containers",
              Json::array({{{"volumeMounts", Json::array({{{"name", "shared"}, {"mountPath", "/shared"}}})}}})},
             {"volumes", Json::array({{{"name", "shared"}, {"emptyDir", Json::object()}}})}}}}}}}});
  ParsedJob p = parse_job(job);
  REQUIRE_FALSE(p.violation);
  PodOptions opts;
  opts.worker_image = "railyard/worker:0.1.0";
  opts.rendezvous_addr = "rdzv:9090";
  Json pod = build_worker_pod(job, p.spec, 1, 2, opts);
  const Json& c = pod["spec"]["containers"][0];
  CHECK(c["image"] == "example/pytorch:1");
  CHECK(c["command"] == Json::array({"/railyard/launcher/ld.so", "--library-path", "/railyard/launcher/lib",
                                     "/railyard/launcher/railyard-worker"}));
  CHECK(c["args"] == Json::array({"agent", "--", "python3", "/app/train.py", "--steps", "300"}));
  // The launcher volume read-only in the program's container, next to the template's own mount.
  bool launcher_ro = false, shared = false;
  for (const Json& m : c["volumeMounts"]) {
    if (m["name"] == "railyard-launcher") launcher_ro = m["mountPath"] == "/railyard" && m.value("readOnly", false);
    if (m["name"] == "shared") shared = true;
  }
  CHECK(launcher_ro);
  CHECK(shared);
  REQUIRE(pod["spec"]["initContainers"].size() == 1);
  const Json& init = pod["spec"]["initContainers"][0];
  CHECK(init["image"] == "railyard/worker:0.1.0");
  CHECK(init["command"][0] == "sh");
  CHECK(init["command"][2].get<std::string>().find("ldd") != std::string::npos);
  CHECK(init["securityContext"]["runAsNonRoot"] == true);
  CHECK(init["securityContext"]["readOnlyRootFilesystem"] == true);
  // What the program reads beside torchrun's variables.
  const Json cm = build_env_configmap(job, p.spec, opts);
  CHECK(resolved_env(pod, cm, "RAILYARD_CHECKPOINT_DIR") == "/shared/ckpt/ddp");
  CHECK(resolved_env(pod, cm, "RAILYARD_CHECKPOINT_INTERVAL_STEPS") == "20");
  CHECK(resolved_env(pod, cm, "RAILYARD_MAX_RESTARTS") == "5");
  CHECK(resolved_env(pod, cm, "RAILYARD_TOTAL_STEPS") == "300");
  // The agent serves the ranks' series on the port the monitor scrapes (the program serves none).
  CHECK(resolved_env(pod, cm, "RAILYARD_AGENT_RANK_METRICS") == "1");
  CHECK(resolved_env(pod, cm, "RAILYARD_METRICS_PORT") == "9400");
  CHECK(pod["metadata"]["annotations"]["railyard.dev/metrics-port"] == "9400");
  // A built-in trainer job gets none of it.
  ParsedJob gpt = parse_job(railyard::op::testing::valid_job());
  Json gpod = build_worker_pod(railyard::op::testing::valid_job(), gpt.spec, 0, 1, opts);
  CHECK_FALSE(gpod["spec"].contains("initContainers"));
  const Json gcm = build_env_configmap(railyard::op::testing::valid_job(), gpt.spec, opts);
  CHECK_FALSE(resolved_env(gpod, gcm, "RAILYARD_CHECKPOINT_DIR"));
  CHECK_FALSE(resolved_env(gpod, gcm, "RAILYARD_AGENT_RANK_METRICS"));
}

TEST_CASE("flash checkpoints: a program pod gets the memory interval and retention, and the agents keep peer copies") {
  PodOptions opts;
  opts.worker_image = "railyard/worker:0.1.0";
  opts.rendezvous_addr = "rdzv:9090";
  Json job = program_job({{"spec", {{"checkpoint", {{"memoryIntervalSteps", 2}, {"keep", 4}}}}}});
  ParsedJob p = parse_job(job);
  REQUIRE_FALSE(p.violation);
  Json pod = build_worker_pod(job, p.spec, 0, 2, opts);
  const Json cm = build_env_configmap(job, p.spec, opts);
  CHECK(resolved_env(pod, cm, "RAILYARD_CHECKPOINT_MEMORY_INTERVAL_STEPS") == "2");
  CHECK(resolved_env(pod, cm, "RAILYARD_CHECKPOINT_KEEP") == "4");
  CHECK(resolved_env(pod, cm, "RAILYARD_CHECKPOINT_INTERVAL_STEPS") == "20");
  // The in-memory tier is on in the generation's configuration: the agents copy the ranks' slots to their peers.
  CHECK(railyard::op::resolved_config(p.spec, 2).memory_tier_on());
  // Off by default: "0" tells the module to snapshot only as the staging of its disk saves.
  ParsedJob off = parse_job(program_job());
  Json opod = build_worker_pod(program_job(), off.spec, 0, 2, opts);
  const Json ocm = build_env_configmap(program_job(), off.spec, opts);
  CHECK(resolved_env(opod, ocm, "RAILYARD_CHECKPOINT_MEMORY_INTERVAL_STEPS") == "0");
  CHECK_FALSE(railyard::op::resolved_config(off.spec, 2).memory_tier_on());
}

namespace {
// tests/e2e/lib/pod_security.py over a pod: its violations of the "restricted" Pod Security Standard ("" when none),
// or the checker's own failure.
std::string restricted_violations(const Json& pod) {
  const auto path = std::filesystem::temp_directory_path() / ("railyard-pss-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << pod.dump();
  FILE* p = ::popen(
      ("python3 " + railyard::test::source_path("tests/e2e/lib/pod_security.py") + " " + path.string() + " 2>&1")
          .c_str(),
      "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = WEXITSTATUS(::pclose(p));
  std::filesystem::remove(path);
  if (rc == 0) {
    CHECK(out.find("restricted: 1 pod(s) pass") != std::string::npos);
    return "";
  }
  return out.empty() ? "checker exited " + std::to_string(rc) : out;
}
}  // namespace

TEST_CASE("every pod the operator builds passes the restricted Pod Security Standard; a template can opt out") {
  // The plain trainer's pod, and a program's pod with the launcher's init container.
  Json plain = valid_job();
  CHECK(restricted_violations(build_worker_pod(plain, parse_job(plain).spec, 0, 1, PodOptions{})) == "");
  Json prog = program_job();
  ParsedJob p = parse_job(prog);
  REQUIRE_FALSE(p.violation);
  PodOptions opts;
  opts.worker_image = "railyard/worker:0.1.0";
  Json pod = build_worker_pod(prog, p.spec, 0, 1, opts);
  REQUIRE(pod["spec"]["initContainers"].size() == 1);
  CHECK(restricted_violations(pod) == "");
  // The checker can fail: a template asking for root and a hostPath volume is built as asked, and named.
  Json root = program_job(
      {{"spec",
        {{"template",
          {{"spec",
            {{"containers", Json::array({{{"securityContext", {{"runAsUser", 0}}},
                                          {"volumeMounts", Json::array({{{"name", "h"}, {"mountPath", "/h"}}})}}})},
             {"volumes", Json::array({{{"name", "h"}, {"hostPath", {{"path", "/srv"}}}}})}}}}}}}});
  ParsedJob pr = parse_job(root);
  REQUIRE_FALSE(pr.violation);
  const std::string bad = restricted_violations(build_worker_pod(root, pr.spec, 0, 1, opts));
  CHECK(bad.find("spec.volumes[h]: volume type hostPath") != std::string::npos);
  CHECK(bad.find("securityContext.runAsNonRoot: must be true") != std::string::npos);
  CHECK(bad.find("securityContext.runAsUser: must not be 0") != std::string::npos);
}

TEST_CASE("a program's home: HOME and the common caches on an emptyDir, unless the template sets them") {
  auto has_mount = [](const Json& c, const std::string& path) {
    for (const Json& m : c.value("volumeMounts", Json::array()))
      if (m.value("mountPath", "") == path) return true;
    return false;
  };
  Json job = program_job();
  JobSpec spec = parse_job(job).spec;
  Json pod = build_worker_pod(job, spec, 0, 1, PodOptions{});
  const Json& c = pod["spec"]["containers"][0];
  CHECK(has_mount(c, "/home/railyard"));
  bool volume = false;
  for (const Json& v : pod["spec"]["volumes"])
    if (v["name"] == "railyard-home") volume = v.contains("emptyDir");
  CHECK(volume);
  // In the job's ConfigMap (envFrom), so a template's env of the same name wins.
  const Json data = build_env_configmap(job, spec, PodOptions{})["data"];
  CHECK(data["HOME"] == "/home/railyard");
  CHECK(data["XDG_CACHE_HOME"] == "/home/railyard/.cache");
  for (const char* v :
       {"PIP_CACHE_DIR", "HF_HOME", "TORCH_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR"}) {
    INFO(v);
    REQUIRE(data.contains(v));
    CHECK(data[v].get<std::string>().rfind("/home/railyard/", 0) == 0);
  }
  CHECK(c["envFrom"][0]["configMapRef"]["name"] == "ddp-env");
  // The template's HOME (its own env) comes after the ConfigMap in precedence: Kubernetes lets env win over envFrom.
  Json mine = program_job(
      {{"spec",
        {{"template",
          {{"spec",
            {{"containers",
              Json::array({{{"env", Json::array({{{"name", "HOME"}, {"value", "/data"}}})},
                            {"volumeMounts", Json::array({{{"name", "h"}, {"mountPath", "/home/railyard"}}})}}})},
             {"volumes", Json::array({{{"name", "h"}, {"emptyDir", Json::object()}}})}}}}}}}});
  Json pod2 = build_worker_pod(mine, parse_job(mine).spec, 0, 1, PodOptions{});
  bool home_env = false;
  for (const Json& e : pod2["spec"]["containers"][0]["env"]) home_env |= e["name"] == "HOME" && e["value"] == "/data";
  CHECK(home_env);
  // The template's own mount of the path is kept, and no second volume is added for it.
  for (const Json& v : pod2["spec"]["volumes"]) CHECK(v["name"] != "railyard-home");
  // The built-in trainer gets neither.
  Json trainer = railyard::op::testing::job_with(Json::object());
  Json tpod = build_worker_pod(trainer, parse_job(trainer).spec, 0, 1, PodOptions{});
  CHECK_FALSE(has_mount(tpod["spec"]["containers"][0], "/home/railyard"));
  CHECK_FALSE(build_env_configmap(trainer, parse_job(trainer).spec, PodOptions{})["data"].contains("HOME"));
}

TEST_CASE("a program's argv is bounded as the CRD bounds it, naming the field") {
  Json many = Json::array();
  for (int i = 0; i < 1025; ++i) many.push_back("x");
  ParsedJob p = parse_job(program_job({{"spec", {{"program", {{"args", many}}}}}}));
  REQUIRE(p.violation);
  CHECK(p.violation->field == "spec.program.args");
  CHECK(p.violation->message.find("1025 items") != std::string::npos);
  ParsedJob l = parse_job(
      program_job({{"spec", {{"program", {{"command", Json::array({"python3", std::string(65537, 'a')})}}}}}}));
  REQUIRE(l.violation);
  CHECK(l.violation->field == "spec.program.command[1]");
  many.erase(many.begin());
  CHECK_FALSE(parse_job(program_job({{"spec", {{"program", {{"args", many}}}}}})).violation);
}

TEST_CASE("spec.program.launcher: torchrun detected, chosen or refused; its conflicting flags named; the pod told") {
  auto with_program = [](const Json& program) { return program_job({{"spec", {{"program", program}}}}); };
  auto launcher_env = [](const Json& job) {
    const JobSpec spec = parse_job(job).spec;
    const Json pod = build_worker_pod(job, spec, 0, 1, PodOptions{});
    const Json cm = build_env_configmap(job, spec, PodOptions{});
    return resolved_env(pod, cm, "RAILYARD_LAUNCHER").value_or("<unset>");
  };
  // auto (the default): the command decides, the args count too (Kubeflow style: command [torchrun], args the rest).
  const Json plain = program_job();
  CHECK_FALSE(parse_job(plain).spec.program_torchrun);
  CHECK(launcher_env(plain) == "perRank");
  const Json tr = with_program({{"command", {"torchrun"}}, {"args", {"--nproc-per-node=1", "/app/train.py"}}});
  REQUIRE_FALSE(parse_job(tr).violation);
  CHECK(parse_job(tr).spec.program_torchrun);
  CHECK(launcher_env(tr) == "torchrun");
  CHECK(parse_job(with_program({{"command", {"python3", "-m", "torch.distributed.run", "/app/t.py"}}}))
            .spec.program_torchrun);
  // Said explicitly: a shell that starts torchrun is torchrun mode only when asked for; perRank keeps the old way.
  const Json shell = with_program({{"command", {"sh", "-c", "pip list && torchrun /app/t.py"}}});
  CHECK_FALSE(parse_job(shell).spec.program_torchrun);
  const Json forced = with_program({{"command", {"sh", "-c", "torchrun /app/t.py"}}, {"launcher", "torchrun"}});
  REQUIRE_FALSE(parse_job(forced).violation);
  CHECK(parse_job(forced).spec.program_torchrun);
  CHECK(launcher_env(forced) == "torchrun");
  const Json per_rank = with_program({{"command", {"torchrun", "/app/t.py"}}, {"launcher", "perRank"}});
  REQUIRE_FALSE(parse_job(per_rank).violation);
  CHECK_FALSE(parse_job(per_rank).spec.program_torchrun);
  // A launcher that is none of the three, naming the choices.
  const ParsedJob bad = parse_job(with_program({{"command", {"torchrun", "/app/t.py"}}, {"launcher", "mpirun"}}));
  REQUIRE(bad.violation);
  CHECK(bad.violation->field == "spec.program.launcher");
  CHECK(bad.violation->message.find("perRank") != std::string::npos);
  // Flags that would override the PET_* Railyard sets: refused, naming the element in command or args.
  const ParsedJob nnodes = parse_job(with_program({{"command", {"torchrun", "--nnodes=2", "/app/t.py"}}}));
  REQUIRE(nnodes.violation);
  CHECK(nnodes.violation->field == "spec.program.command[1]");
  CHECK(nnodes.violation->message.find("remove it") != std::string::npos);
  const ParsedJob nproc = parse_job(
      with_program({{"command", {"torchrun"}}, {"args", {"--log-dir=/l", "--nproc-per-node", "4", "/app/t.py"}}}));
  REQUIRE(nproc.violation);
  CHECK(nproc.violation->field == "spec.program.args[1]");
  CHECK(nproc.violation->message.find("set spec.procsPerReplica: 4") != std::string::npos);
  const Json four = program_job(
      {{"spec",
        {{"procsPerReplica", 4}, {"program", {{"command", {"torchrun", "--nproc-per-node", "4", "/app/t.py"}}}}}}});
  CHECK_FALSE(parse_job(four).violation);  // agrees with procsPerReplica: kept
  // Not checked where the flags are not torchrun's: perRank, or the script's own arguments.
  CHECK_FALSE(
      parse_job(with_program({{"command", {"torchrun", "--nnodes=2", "t.py"}}, {"launcher", "perRank"}})).violation);
  CHECK_FALSE(parse_job(with_program({{"command", {"torchrun", "t.py", "--nnodes=2"}}})).violation);
}
