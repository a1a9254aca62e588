// railyard convert (cli/convert.h): Kubeflow's PyTorchJob and TrainJob as TrainingJobs that Railyard's own parser
// (common/job_spec.h) accepts, field by field; what cannot be converted is refused naming the field.
#include "cli/convert.h"

#include <doctest/doctest.h>

#include <fstream>
#include <iterator>

#include "cli/manifest_yaml.h"
#include "common/error.h"
#include "operator/api.h"
#include "tests/ctest_env.h"

using nlohmann::json;
using railyard::cli::convert_manifests;
using railyard::cli::parse_manifests;

namespace {

std::vector<json> manifests(const std::string& name) {
  const std::string path = railyard::test::source_path("tests/unit/cli/manifests/" + name);
  std::ifstream in(path);
  REQUIRE(in);
  return parse_manifests(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

bool has_note(const railyard::cli::Conversion& c, const std::string& part) {
  for (const auto& n : c.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// The TrainingJob must pass the operator's parser, and survive a YAML round trip unchanged.
railyard::op::JobSpec accepted(const json& job) {
  auto parsed = railyard::op::parse_job(job);
  if (parsed.violation) FAIL_CHECK(parsed.violation->field << ": " << parsed.violation->message);
  const auto back = parse_manifests(railyard::cli::to_yaml(job), "round trip");
  REQUIRE(back.size() == 1);
  CHECK(back[0] == job);
  return parsed.spec;
}

}  // namespace

TEST_CASE("a PyTorchJob with Master and Workers under torchrun: one gang of 3 pods x 2 processes") {
  const auto c = convert_manifests(manifests("pytorchjob-ddp.yaml"));
  const json& j = c.job;
  CHECK(j["apiVersion"] == "railyard.dev/v1alpha1");
  CHECK(j["kind"] == "TrainingJob");
  CHECK(j["metadata"]["name"] == "mnist-ddp");
  CHECK(j["metadata"]["namespace"] == "team-a");
  CHECK(j["metadata"]["labels"]["team"] == "vision");
  CHECK(j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue");
  CHECK(j["metadata"]["annotations"]["railyard.dev/converted-from"] == "kubeflow.org/v1 PyTorchJob team-a/mnist-ddp");
  const json& s = j["spec"];
  CHECK(s["replicas"] == 3);  // Master + 2 Workers
  CHECK(s["procsPerReplica"] == 2);
  CHECK(s["device"] == "cpu");
  CHECK(s["image"] == "example/mnist:1.0");
  // torchrun kept, in torchrun mode (one per pod, the world in PET_*); its --nproc-per-node is procsPerReplica.
  CHECK(s["program"]["command"] == json({"torchrun", "/opt/mnist/train.py"}));
  CHECK(s["program"]["args"] == json({"--epochs", "3"}));
  CHECK(s["program"]["launcher"] == "torchrun");
  CHECK(has_note(c, "torchrun kept, in Railyard's torchrun mode"));
  CHECK(s["resources"]["limits"]["memory"] == "8Gi");
  CHECK(s["failurePolicy"]["maxRestarts"] == 4);  // runPolicy.backoffLimit
  CHECK(s["runPolicy"]["cleanPodPolicy"] == "None");
  CHECK(s["runPolicy"]["ttlSecondsAfterFinished"] == 3600);
  // The template keeps volumes, mounts, env and pod annotations, without what Railyard sets itself.
  const json& tc = s["template"]["spec"]["containers"][0];
  CHECK_FALSE(tc.contains("image"));
  CHECK_FALSE(tc.contains("command"));
  CHECK_FALSE(tc.contains("resources"));
  CHECK(tc["env"] ==
        json::parse(R"([{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "PYTHONUNBUFFERED", "value": "1"}])"));
  CHECK(has_note(c, "PYTHONUNBUFFERED=1 added"));
  CHECK(tc["volumeMounts"][0]["mountPath"] == "/data");
  CHECK(s["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "mnist-data");
  CHECK(s["template"]["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false");
  CHECK(has_note(c, "env WORLD_SIZE: dropped"));
  CHECK(has_note(c, "restartPolicy OnFailure"));
  CHECK(has_note(c, "WORLD_SIZE and RANK count processes"));
  const auto spec = accepted(j);
  CHECK(spec.program);
  CHECK(spec.replicas == 3);
  CHECK(spec.procs_per_replica == 2);
  CHECK(spec.program_command == std::vector<std::string>{"torchrun", "/opt/mnist/train.py"});
  CHECK(spec.program_torchrun);
}

TEST_CASE("an elastic PyTorchJob: python -m torch.distributed.run, GPUs per node, the elastic range and restarts") {
  const auto c = convert_manifests(manifests("pytorchjob-elastic.json"));
  const json& s = c.job["spec"];
  CHECK(s["replicas"] == 2);
  CHECK(s["procsPerReplica"] == 8);  // --nproc_per_node gpu with 8 GPUs a pod
  CHECK(s["device"] == "cuda");
  CHECK(s["program"]["command"] == json({"python3", "-m", "torch.distributed.run", "train.py"}));
  CHECK(s["program"]["args"] == json({"--batch", "32"}));
  CHECK(s["elastic"] == json({{"minReplicas", 1}, {"maxReplicas", 4}}));
  CHECK(s["failurePolicy"]["maxRestarts"] == 10);
  CHECK(s["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu");
  CHECK(has_note(c,
                 "its flags that set those left out: --nnodes 1:4 --rdzv_backend=c10d "
                 "--rdzv_endpoint=elastic-gpt-worker-0:29400"));
  CHECK(has_note(c, "spec.elasticPolicy.rdzvBackend: not carried over"));
  CHECK(has_note(c, "cleanPodPolicy: not given"));
  const auto spec = accepted(c.job);
  CHECK(spec.procs_per_replica == 8);
  CHECK(spec.device == "cuda");
}

TEST_CASE("a TrainJob on a torch runtime: the trainer's settings over the runtime's, the runtime's template kept") {
  const auto c = convert_manifests(manifests("trainjob-torch.yaml"));
  const json& s = c.job["spec"];
  CHECK(c.job["metadata"]["annotations"]["railyard.dev/converted-from"] ==
        "trainer.kubeflow.org/v1alpha1 TrainJob team-c/fashion-mnist");
  CHECK(s["replicas"] == 2);         // trainer.numNodes over mlPolicy.numNodes
  CHECK(s["procsPerReplica"] == 2);  // numProcPerNode auto: the 2 GPUs per node
  CHECK(s["image"] == "example/fashion-mnist:1");
  CHECK(s["program"]["command"] == json({"torchrun", "/app/train.py"}));
  CHECK(s["program"]["args"] == json({"--epochs", "2"}));
  CHECK(s["resources"]["limits"]["nvidia.com/gpu"] == 2);
  // env: the runtime's, with the trainer's LR winning.
  CHECK(s["template"]["spec"]["containers"][0]["env"] ==
        json::parse(R"([{"name": "LR", "value": "0.01"}, {"name": "OMP_NUM_THREADS", "value": "4"}])"));
  CHECK(has_note(c, "replicatedJob 'dataset-initializer': not carried over"));
  CHECK(has_note(c, "spec.initializer: not carried over"));
  accepted(c.job);
  // The input order does not matter: the runtime first.
  auto docs = manifests("trainjob-torch.yaml");
  std::swap(docs[0], docs[1]);
  CHECK(convert_manifests(docs).job == c.job);
}

TEST_CASE("what would change meaning is refused, naming the field and the fix") {
  auto refused = [](const std::vector<json>& docs, const std::string& part) {
    try {
      convert_manifests(docs);
      FAIL_CHECK("converted, expected a refusal naming " << part);
    } catch (const railyard::Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
    }
  };
  // A TrainJob without its runtime: say which, and how to get it.
  auto tj = manifests("trainjob-torch.yaml");
  refused({tj[0]}, "kubectl get clustertrainingruntime torch-distributed -o yaml");
  refused(manifests("trainjob-mpi.yaml"), "spec.mlPolicy: no torch policy");
  // Master and Worker running different images.
  auto ddp = manifests("pytorchjob-ddp.yaml");
  ddp[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"] = "example/other:1";
  refused(ddp, "Master and Worker have different templates");
  // No command: the image's entrypoint is not in the manifest.
  auto nocmd = manifests("pytorchjob-ddp.yaml");
  for (const char* r : {"Master", "Worker"})
    nocmd[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][0].erase("command");
  refused(nocmd, ".command: not given");
  // A role Railyard has no place for.
  auto extra = manifests("pytorchjob-ddp.yaml");
  extra[0]["spec"]["pytorchReplicaSpecs"]["Launcher"] = extra[0]["spec"]["pytorchReplicaSpecs"]["Worker"];
  refused(extra, "spec.pytorchReplicaSpecs.Launcher");
  refused({json::parse(R"({"kind": "Deployment"})")}, "no PyTorchJob");
  refused({ddp[0], ddp[0]}, "more than one");
  // An elastic range that does not hold the job's pods.
  auto el = manifests("pytorchjob-elastic.json");
  el[0]["spec"]["elasticPolicy"]["maxReplicas"] = 1;
  refused(el, "spec.elasticPolicy: the range 1..1 does not hold the job's 2 pods");
}

TEST_CASE("a sidecar listed first: the training container becomes the template's first, the sidecar kept as is") {
  const auto c = convert_manifests(manifests("pytorchjob-sidecar.yaml"));
  const json& s = c.job["spec"];
  CHECK(s["replicas"] == 2);
  CHECK(s["procsPerReplica"] == 4);
  CHECK(s["device"] == "cuda");
  CHECK(s["image"] == "example/bert:2.1");
  CHECK(s["program"]["command"] == json({"torchrun", "/app/finetune.py"}));
  CHECK(s["runPolicy"] == json({{"cleanPodPolicy", "All"}, {"activeDeadlineSeconds", 86400}}));
  const json& ps = s["template"]["spec"];
  REQUIRE(ps["containers"].size() == 2);
  // The pod builder makes containers[0] the worker: it must be the training container, not the sidecar.
  CHECK(ps["containers"][0]["name"] == "pytorch");
  CHECK_FALSE(ps["containers"][0].contains("image"));
  CHECK(ps["containers"][1] == json::parse(R"({"name": "log-shipper", "image": "example/log-shipper:3",
      "args": ["--path", "/var/log/train"], "volumeMounts": [{"name": "logs", "mountPath": "/var/log/train"}]})"));
  CHECK(ps["serviceAccountName"] == "trainer");
  CHECK(ps["nodeSelector"]["node.kubernetes.io/instance-type"] == "gpu-a100");
  CHECK(ps["tolerations"][0]["key"] == "nvidia.com/gpu");
  CHECK(has_note(c, "serviceAccountName trainer: kept, but Railyard's pods mount no service account token"));
  CHECK(has_note(c, "securityContext: not set, so the program runs with Railyard's secure defaults, uid 65532"));
  accepted(c.job);
  // A template that sets both (and the token) gets neither note.
  auto docs = manifests("pytorchjob-sidecar.yaml");
  for (const char* r : {"Master", "Worker"}) {
    json& pod = docs[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"];
    pod["automountServiceAccountToken"] = true;
    pod["securityContext"] = {{"runAsUser", 1000}};
    pod["containers"][1]["securityContext"] = {{"readOnlyRootFilesystem", false}};
    pod["containers"][1]["env"] = json::parse(R"([{"name": "PYTHONUNBUFFERED", "value": ""}])");
  }
  const auto quiet = convert_manifests(docs);
  CHECK_FALSE(has_note(quiet, "serviceAccountName"));
  CHECK_FALSE(has_note(quiet, "securityContext"));
  CHECK_FALSE(has_note(quiet, "PYTHONUNBUFFERED"));  // the template's own value stays
  CHECK(quiet.job["spec"]["template"]["spec"]["containers"][0]["env"] ==
        json::parse(R"([{"name": "PYTHONUNBUFFERED", "value": ""}])"));
}

TEST_CASE(
    "torchrun started by a shell script: kept as written, in torchrun mode, its --nproc-per-node as the pod's "
    "process count") {
  auto docs = manifests("pytorchjob-sidecar.yaml");
  const json shell = {"bash", "-c",
                      "pip install --user -r /app/requirements.txt && torchrun --nproc-per-node=4 /app/finetune.py"};
  for (const char* r : {"Master", "Worker"})
    docs[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][1]["command"] = shell;
  const auto c = convert_manifests(docs);
  CHECK(c.job["spec"]["replicas"] == 2);
  CHECK(c.job["spec"]["program"]["command"] == shell);
  CHECK(c.job["spec"]["program"]["launcher"] == "torchrun");
  CHECK(c.job["spec"]["procsPerReplica"] == 4);
  CHECK(has_note(c,
                 "spec.pytorchReplicaSpecs.Worker.template.spec.containers[pytorch].command: the shell script "
                 "'pip install"));
  CHECK(has_note(c, "kept as written, with spec.program.launcher torchrun"));
  accepted(c.job);
  // python -m torch.distributed.run inside `sh -ec` is the same thing, "--nproc_per_node 3" read too.
  auto module = docs;
  for (const char* r : {"Master", "Worker"})
    module[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][1]["command"] =
        json({"/bin/sh", "-ec", "cd /app\npython3 -m torch.distributed.run --nproc_per_node 3 finetune.py"});
  const auto m = convert_manifests(module);
  CHECK(m.job["spec"]["program"]["launcher"] == "torchrun");
  CHECK(m.job["spec"]["procsPerReplica"] == 3);
  // Without --nproc-per-node in the script: the PyTorchJob's nprocPerNode, as its PET_NPROC_PER_NODE was.
  auto plain = docs;
  for (const char* r : {"Master", "Worker"})
    plain[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][1]["command"] =
        json({"sh", "-c", "torchrun /app/finetune.py"});
  plain[0]["spec"]["nprocPerNode"] = "2";
  const auto n = convert_manifests(plain);
  CHECK(n.job["spec"]["procsPerReplica"] == 2);
  CHECK(n.job["spec"]["program"]["launcher"] == "torchrun");
  // A plain command that is not torchrun: no launcher field (auto picks perRank).
  auto py = manifests("pytorchjob-sidecar.yaml");
  for (const char* r : {"Master", "Worker"})
    py[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][1]["command"] =
        json({"python3", "/app/finetune.py"});
  CHECK_FALSE(convert_manifests(py).job["spec"]["program"].contains("launcher"));
  // A long script (1 MiB of one word, then torchrun) is read without recursion per character.
  auto big = docs;
  for (const char* r : {"Master", "Worker"})
    big[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][1]["command"] =
        json({"sh", "-c", "echo " + std::string(1 << 20, 'a') + "\ntorchrun x.py"});
  CHECK(convert_manifests(big).job["spec"]["program"]["launcher"] == "torchrun");
  // A path that merely contains the word is not torchrun.
  auto path = manifests("pytorchjob-sidecar.yaml");
  for (const char* r : {"Master", "Worker"})
    path[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][1]["command"] =
        json({"bash", "-c", "python3 /opt/torchrun-recipes/finetune.py"});
  const auto p = convert_manifests(path);
  CHECK(p.job["spec"]["replicas"] == 2);
  CHECK(p.job["spec"]["procsPerReplica"] == 1);
}

TEST_CASE("a PyTorchJob whose command is not torchrun: WORLD_SIZE counts pods in Railyard, pods x nprocPerNode there") {
  auto docs = manifests("pytorchjob-sidecar.yaml");
  for (const char* r : {"Master", "Worker"})
    docs[0]["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["containers"][1]["command"] =
        json({"python3", "/app/finetune.py"});
  const auto c = convert_manifests(docs);
  CHECK(c.job["spec"]["procsPerReplica"] == 1);
  CHECK(has_note(c, "spec.nprocPerNode '4': the command is not torchrun"));
  CHECK(has_note(c, "WORLD_SIZE is the pod count 2, where the PyTorchJob set pods x nprocPerNode = 8"));
  accepted(c.job);
}

TEST_CASE("kubectl's List of objects: its items are the documents") {
  const auto docs = manifests("trainjob-torch.yaml");
  const json list = {{"apiVersion", "v1"}, {"kind", "List"}, {"items", json::array({docs[1], docs[0]})}};
  CHECK(convert_manifests({list}).job == convert_manifests(docs).job);
  // A TrainJob in one List, its runtime in another file.
  const json tj_list = {
      {"apiVersion", "trainer.kubeflow.org/v1alpha1"}, {"kind", "TrainJobList"}, {"items", json::array({docs[0]})}};
  CHECK(convert_manifests({tj_list, docs[1]}).job["spec"]["replicas"] == 2);
}

TEST_CASE("torchrun's command line: flags with and without values, -m, --no-python, not torchrun") {
  using railyard::cli::split_torchrun;
  auto t = split_torchrun({"torchrun", "--standalone", "--nproc-per-node", "4", "-m", "pkg.train", "--x"});
  REQUIRE(t);
  CHECK(t->nproc_per_node == "4");
  CHECK(t->program == std::vector<std::string>{"python", "-m", "pkg.train", "--x"});
  t = split_torchrun({"/usr/bin/torchrun", "--no-python", "--nproc_per_node=2", "./run.sh", "a"});
  REQUIRE(t);
  CHECK(t->program == std::vector<std::string>{"./run.sh", "a"});
  CHECK(t->nproc_per_node == "2");
  CHECK_FALSE(split_torchrun({"python3", "train.py"}));
  CHECK_FALSE(split_torchrun({"torchrun", "--nnodes", "2"}));  // no script
}

TEST_CASE("manifest YAML: plain scalars typed, quoted ones strings; the emitter quotes what would change type") {
  const auto docs =
      parse_manifests("a: 3\nb: \"3\"\nc: true\nd: 'yes'\ne: 1.5\nf: ~\ng: 0x1F\n---\n---\nh: [1, two]\n", "t");
  REQUIRE(docs.size() == 2);
  CHECK(docs[0] == json::parse(R"({"a": 3, "b": "3", "c": true, "d": "yes", "e": 1.5, "f": null, "g": 31})"));
  const json tricky = {{"s", json::array({"3", "true", "yes", "a: b", "#x", "", "-1", "1e3", "plain text", "x #y",
                                          "@at", "%pct", "{x}", "[y]", ",z", "a:b", "x:"})},
                       {"n", json::object()},
                       {"l", json::array({json::object(), json::array(), json::array({1, 2})})},
                       {"needs quote: key", 1}};
  CHECK(parse_manifests(railyard::cli::to_yaml(tricky), "emitted")[0] == tricky);
  CHECK_THROWS_AS(parse_manifests("a: [1, 2\n", "bad.yaml"), railyard::Error);
}
