// Worker pod construction: owner references, labels, agent command and env, template merge.
#include "operator/controller/pod_builder.h"

#include <doctest/doctest.h>
#include <openssl/evp.h>

#include <set>

#include "common/tls/job_identity.h"
#include "common/wellknown.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
namespace wellknown = railyard::wellknown;
namespace pod_env = railyard::pod_env;
using railyard::op::testing::find_env;
using railyard::op::testing::job_with;
using railyard::op::testing::resolved_env;
using railyard::op::testing::valid_job;
using Json = nlohmann::json;

namespace {
PodOptions options() {
  PodOptions o;
  o.worker_image = "img:1";
  o.worker_command = {"/abs/bin/railyard-worker"};
  o.rendezvous_addr = "127.0.0.1:9090";
  return o;
}
}  // namespace

TEST_CASE("a worker pod carries owner, labels, scheduler and the agent command") {
  Json job = valid_job();
  JobSpec spec = parse_job(job).spec;
  Json pod = build_worker_pod(job, spec, 1, 3, options());
  CHECK(pod["metadata"]["name"] == "tiny-worker-1");
  CHECK(pod["metadata"]["namespace"] == "team-a");
  const Json& owner = pod["metadata"]["ownerReferences"][0];
  CHECK(owner["uid"] == "uid-1");
  CHECK(owner["kind"] == "TrainingJob");
  CHECK(owner["controller"] == true);
  CHECK(owner["blockOwnerDeletion"] == true);
  CHECK(pod["metadata"]["labels"][wellknown::kJobLabel] == "tiny");
  CHECK(pod["metadata"]["labels"][wellknown::kReplicaIndexLabel] == "1");
  CHECK(pod["metadata"]["labels"][wellknown::kGenerationLabel] == "3");
  CHECK(pod["spec"]["schedulerName"] == "railyard");
  CHECK(pod["spec"]["restartPolicy"] == "Never");
  // A pod that fails without its agent's report keeps its log's last lines as its termination message.
  CHECK(pod["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError");
  CHECK_FALSE(pod["spec"].contains("nodeName"));
  const Json& c = pod["spec"]["containers"][0];
  CHECK(c["image"] == "img:1");
  CHECK(c["command"] == Json::array({"/abs/bin/railyard-worker"}));
  CHECK(c["args"] == Json::array({"agent"}));
  CHECK(replica_index_of(pod) == 1);
}

TEST_CASE("the agent env names the job, the pod through the downward API, and the token through a Secret") {
  Json job = valid_job();
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
  const Json cm = build_env_configmap(job, parse_job(job).spec, options());
  CHECK(resolved_env(pod, cm, "RAILYARD_JOB_NAME") == "tiny");
  CHECK(resolved_env(pod, cm, "RAILYARD_JOB_UID") == "uid-1");  // the checkpoint fence tells re-created jobs apart
  CHECK(resolved_env(pod, cm, "RAILYARD_JOB_NAMESPACE") == "team-a");
  CHECK(resolved_env(pod, cm, "RAILYARD_POD_NAMESPACE") == "team-a");
  CHECK(resolved_env(pod, cm, "RAILYARD_RENDEZVOUS_ADDR") == "127.0.0.1:9090");
  CHECK(resolved_env(pod, cm, "RAILYARD_PROCS_PER_POD") == "1");
  CHECK(resolved_env(pod, cm, "RAILYARD_DEVICE") == "cpu");
  CHECK((*find_env(pod, "RAILYARD_POD_IP"))["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP");
  // Fencing: the agent tells the rendezvous its pod UID (a replacement reuses the name, never the UID).
  CHECK((*find_env(pod, "RAILYARD_POD_UID"))["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid");
  CHECK((*find_env(pod, "RAILYARD_POD_NAME"))["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name");
  const Json& token = (*find_env(pod, "RAILYARD_RENDEZVOUS_TOKEN"))["valueFrom"]["secretKeyRef"];
  CHECK(token["name"] == "tiny-rendezvous");
  CHECK(token["key"] == "token");
  CHECK_FALSE(find_env(pod, "RAILYARD_RENDEZVOUS_CA"));  // --rendezvous-tls off: the agent speaks plain HTTP
  PodOptions tls = options();
  tls.rendezvous_tls = true;
  Json tls_pod = build_worker_pod(job, parse_job(job).spec, 0, 1, tls);
  REQUIRE(find_env(tls_pod, "RAILYARD_RENDEZVOUS_CA"));
  const Json& ca = (*find_env(tls_pod, "RAILYARD_RENDEZVOUS_CA"))["valueFrom"]["secretKeyRef"];
  CHECK(ca["name"] == "tiny-rendezvous");
  CHECK(ca["key"] == "ca.crt");
}

TEST_CASE("the job-wide env is the job's ConfigMap, which every pod takes through envFrom before the template's") {
  Json job = job_with(Json::parse(R"({"spec": {"template": {"spec": {"containers": [
      {"envFrom": [{"configMapRef": {"name": "team-settings"}}]}]}}}})"));
  const JobSpec spec = parse_job(job).spec;
  WorkerPodBuilder builder(job, spec, 1, options());
  const Json& cm = builder.env_configmap();
  CHECK(cm["kind"] == "ConfigMap");
  CHECK(cm["metadata"]["name"] == "tiny-env");
  CHECK(cm["metadata"]["namespace"] == "team-a");
  CHECK(cm["metadata"]["labels"]["railyard.dev/job"] == "tiny");
  CHECK(cm["metadata"]["ownerReferences"][0]["uid"] == "uid-1");
  // (no structured bindings here: clang cannot capture them in doctest's macros)
  for (auto it = cm["data"].begin(); it != cm["data"].end(); ++it) CHECK_MESSAGE(it.value().is_string(), it.key());
  for (int i : {0, 1}) {
    const Json pod = builder.pod(i);
    const Json& c = pod["spec"]["containers"][0];
    REQUIRE(c["envFrom"].size() == 2);
    CHECK(c["envFrom"][0]["configMapRef"]["name"] == "tiny-env");       // ours first ...
    CHECK(c["envFrom"][1]["configMapRef"]["name"] == "team-settings");  // ... so the template's wins by name
    // What is the same in every pod is not repeated in each: the pod's env holds only what differs per pod, refers
    // to the Secret, or must win over the template (the metrics ports).
    for (auto it = cm["data"].begin(); it != cm["data"].end(); ++it)
      CHECK_MESSAGE(find_env(pod, it.key()) == nullptr, it.key());
    CHECK(find_env(pod, pod_env::kReplicaIndex));
  }
  CHECK(cm == build_env_configmap(job, spec, options()));
}

TEST_CASE("worker pods mount no service account token unless the template asks for one") {
  Json job = valid_job();
  CHECK(build_worker_pod(job, parse_job(job).spec, 0, 1, options())["spec"]["automountServiceAccountToken"] == false);
  Json wants = job_with(Json::parse(R"({"spec": {"template": {"spec": {"automountServiceAccountToken": true}}}})"));
  CHECK(build_worker_pod(wants, parse_job(wants).spec, 0, 1, options())["spec"]["automountServiceAccountToken"] ==
        true);
}

TEST_CASE("the template merges labels, pod fields, env and overrides the command") {
  Json job = job_with(Json::parse(R"({"spec": {"image": "user:2", "template": {
      "metadata": {"labels": {"team": "nlp", "railyard.dev/job": "spoofed"}, "annotations": {"a": "b"}},
      "spec": {"tolerations": [{"key": "k", "operator": "Exists"}], "volumes": [{"name": "data", "hostPath": {"path": "/d"}}],
               "schedulerName": "default-scheduler", "nodeName": "n9",
               "containers": [{"command": ["sh", "-c", "exit 0"],
                               "env": [{"name": "FOO", "value": "1"}, {"name": "RAILYARD_DEVICE", "value": "cuda"}],
                               "volumeMounts": [{"name": "data", "mountPath": "/d"}]},
                              {"name": "sidecar", "image": "side:1"}]}}}})"));
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
  CHECK(pod["metadata"]["labels"]["team"] == "nlp");
  CHECK(pod["metadata"]["labels"]["railyard.dev/job"] == "tiny");  // ours win
  CHECK(pod["metadata"]["annotations"]["a"] == "b");
  CHECK(pod["spec"]["tolerations"][0]["key"] == "k");
  CHECK(pod["spec"]["volumes"][0]["name"] == "data");
  CHECK(pod["spec"]["schedulerName"] == "railyard");
  CHECK_FALSE(pod["spec"].contains("nodeName"));
  const Json& c = pod["spec"]["containers"][0];
  CHECK(c["name"] == "worker");
  CHECK(c["image"] == "user:2");
  CHECK(c["command"] == Json::array({"sh", "-c", "exit 0"}));
  CHECK_FALSE(c.contains("args"));  // a user command runs as given
  CHECK(c["volumeMounts"][0]["mountPath"] == "/d");
  const Json cm = build_env_configmap(job, parse_job(job).spec, options());
  CHECK((*find_env(pod, "FOO"))["value"] == "1");
  CHECK(resolved_env(pod, cm, "RAILYARD_DEVICE") == "cuda");  // user env wins by name over the job-wide env
  CHECK(cm["data"]["RAILYARD_DEVICE"] == "cpu");
  CHECK(resolved_env(pod, cm, "RAILYARD_JOB_NAME") == "tiny");  // and keeps the rest
  CHECK(find_env(pod, "RAILYARD_RENDEZVOUS_TOKEN"));
  REQUIRE(pod["spec"]["containers"].size() == 2);
  CHECK(pod["spec"]["containers"][1]["name"] == "sidecar");
}

TEST_CASE("one builder per gang: each pod differs from another only in its index, on its own copy") {
  Json job = job_with(Json::parse(R"({"spec": {"template": {"metadata": {"labels": {"team": "nlp"}},
      "spec": {"containers": [{"env": [{"name": "FOO", "value": "1"}]}, {"name": "sidecar", "image": "side:1"}]}}}})"));
  const JobSpec spec = parse_job(job).spec;
  const WorkerPodBuilder builder(job, spec, 4, options());
  const Json p7 = builder.pod(7), p0 = builder.pod(0);
  CHECK(p7["metadata"]["name"] == "tiny-worker-7");
  CHECK(p7["spec"]["hostname"] == "tiny-worker-7");
  CHECK(p7["metadata"]["labels"][wellknown::kReplicaIndexLabel] == "7");
  CHECK((*find_env(p7, pod_env::kReplicaIndex))["value"] == "7");
  CHECK(replica_index_of(p0) == 0);
  CHECK((*find_env(p0, pod_env::kReplicaIndex))["value"] == "0");
  CHECK(p0["metadata"]["labels"]["team"] == "nlp");
  // Stamping index 7's four fields on pod 0 gives pod 7 exactly: nothing else depends on the index, and pod(0) after
  // pod(7) kept nothing of 7.
  Json stamped = p0;
  stamped["metadata"]["name"] = stamped["spec"]["hostname"] = "tiny-worker-7";
  stamped["metadata"]["labels"][wellknown::kReplicaIndexLabel] = "7";
  for (Json& e : stamped["spec"]["containers"][0]["env"])
    if (e["name"] == pod_env::kReplicaIndex) e["value"] = "7";
  CHECK(stamped == p7);
  CHECK(builder.pod(7) == p7);
  CHECK(build_worker_pod(job, spec, 7, 4, options()) == p7);
}

TEST_CASE("a template that sets the index env keeps its value in every pod") {
  Json job = job_with(Json::parse(R"({"spec": {"template": {"spec": {"containers": [
      {"env": [{"name": "RAILYARD_REPLICA_INDEX", "value": "mine"}]}]}}}})"));
  const WorkerPodBuilder builder(job, parse_job(job).spec, 1, options());
  for (int i : {0, 5}) {
    const Json pod = builder.pod(i);
    CHECK((*find_env(pod, pod_env::kReplicaIndex))["value"] == "mine");
    CHECK(replica_index_of(pod) == i);  // the label is always ours
  }
}

TEST_CASE("cuda jobs request one GPU per local rank unless they say otherwise") {
  Json job = job_with(Json::parse(R"({"spec": {"device": "cuda", "procsPerReplica": 4}})"));
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
  CHECK(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4);
  Json job2 = job_with(Json::parse(R"({"spec": {"device": "cuda", "procsPerReplica": 4,
      "resources": {"limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 2}}}})"));
  Json pod2 = build_worker_pod(job2, parse_job(job2).spec, 0, 1, options());
  CHECK(pod2["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2);
}

TEST_CASE("the token Secret is owned by the job and tokens are random") {
  Json s = build_token_secret(valid_job(), "abc");
  CHECK(s["metadata"]["name"] == "tiny-rendezvous");
  CHECK(s["metadata"]["ownerReferences"][0]["uid"] == "uid-1");
  CHECK(s["stringData"]["token"] == "abc");
  CHECK_FALSE(s["stringData"].contains("ca.crt"));
  CHECK(build_token_secret(valid_job(), "abc", "PEM")["stringData"]["ca.crt"] == "PEM");
  std::string a = random_token(), b = random_token();
  CHECK(a.size() == 64);
  CHECK(a != b);
}

TEST_CASE("replica index parsing refuses malformed labels") {
  CHECK(replica_index_of(Json::parse(R"({"metadata": {"labels": {"railyard.dev/replica-index": "12"}}})")) == 12);
  CHECK(replica_index_of(Json::parse(R"({"metadata": {"labels": {"railyard.dev/replica-index": "1x"}}})")) == -1);
  CHECK(replica_index_of(Json::parse(R"({"metadata": {"labels": {}}})")) == -1);
}

TEST_CASE("metrics ports: env for the worker and agent, one named container port per local rank, or none") {
  Json job = valid_job();
  job["spec"]["procsPerReplica"] = 2;
  JobSpec spec = parse_job(job).spec;
  REQUIRE(spec.procs_per_replica == 2);
  Json pod = build_worker_pod(job, spec, 0, 1, options());
  REQUIRE(find_env(pod, "RAILYARD_METRICS_PORT"));
  CHECK((*find_env(pod, "RAILYARD_METRICS_PORT"))["value"] == "9400");
  CHECK((*find_env(pod, "RAILYARD_AGENT_METRICS_PORT"))["value"] == "9399");
  const Json& ports = pod["spec"]["containers"][0]["ports"];
  REQUIRE(ports.size() == 3);
  CHECK(ports[0] == Json({{"name", "metrics"}, {"containerPort", 9400}, {"protocol", "TCP"}}));
  CHECK(ports[1]["name"] == "metrics-1");
  CHECK(ports[1]["containerPort"] == 9401);
  CHECK(ports[2]["name"] == "agent-metrics");
  CHECK(ports[2]["containerPort"] == 9399);
  // The embedded monitor reads the base port from this annotation; Prometheus scrapes the named ports.
  CHECK(pod["metadata"]["annotations"]["railyard.dev/metrics-port"] == "9400");

  // Every local rank has its named port, up to procsPerReplica's maximum of 64 (Prometheus scrapes each).
  job["spec"]["procsPerReplica"] = 64;
  Json wide = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
  const Json& wports = wide["spec"]["containers"][0]["ports"];
  REQUIRE(wports.size() == 65);
  CHECK(wports[63]["name"] == "metrics-63");
  CHECK(wports[63]["containerPort"] == 9463);
  std::set<std::string> names;
  for (const Json& p : wports) {
    CHECK(p["name"].get<std::string>().size() <= 15);
    names.insert(p["name"].get<std::string>());
  }
  CHECK(names.size() == 65);

  PodOptions off = options();
  off.worker_metrics_port = 0;
  off.agent_metrics_port = 0;
  Json quiet = build_worker_pod(job, spec, 0, 1, off);
  CHECK(find_env(quiet, "RAILYARD_METRICS_PORT") == nullptr);
  CHECK(find_env(quiet, "RAILYARD_AGENT_METRICS_PORT") == nullptr);
  CHECK_FALSE(quiet["spec"]["containers"][0].contains("ports"));
  CHECK_FALSE(quiet["metadata"].value("annotations", Json::object()).contains("railyard.dev/metrics-port"));
}

namespace {
const Json* find_named(const Json& list, const std::string& name) {
  for (const Json& e : list)
    if (e.value("name", "") == name) return &e;
  return nullptr;
}
}  // namespace

TEST_CASE("the worker container runs non-root, read-only, unprivileged, with writable /tmp and /dev/shm") {
  Json job = valid_job();
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
  const Json& sc = pod["spec"]["containers"][0]["securityContext"];
  CHECK(sc["allowPrivilegeEscalation"] == false);
  CHECK(sc["readOnlyRootFilesystem"] == true);
  CHECK(sc["capabilities"]["drop"] == Json::array({"ALL"}));
  CHECK(sc["runAsNonRoot"] == true);
  CHECK(sc["runAsUser"] == 65532);  // USER 65532:65532 in deploy/docker/Dockerfile.worker
  CHECK(sc["runAsGroup"] == 65532);
  CHECK(sc["seccompProfile"]["type"] == "RuntimeDefault");
  CHECK(pod["spec"]["securityContext"]["fsGroup"] == 65532);
  CHECK(pod["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch");
  const Json& mounts = pod["spec"]["containers"][0]["volumeMounts"];
  const Json& volumes = pod["spec"]["volumes"];
  REQUIRE(find_named(mounts, kTmpVolume));
  CHECK((*find_named(mounts, kTmpVolume))["mountPath"] == "/tmp");
  REQUIRE(find_named(mounts, kShmVolume));
  CHECK((*find_named(mounts, kShmVolume))["mountPath"] == "/dev/shm");
  REQUIRE(find_named(volumes, kTmpVolume));
  CHECK((*find_named(volumes, kTmpVolume))["emptyDir"] == Json::object());
  REQUIRE(find_named(volumes, kShmVolume));
  CHECK((*find_named(volumes, kShmVolume))["emptyDir"]["medium"] == "Memory");
  CHECK_FALSE((*find_named(volumes, kShmVolume))["emptyDir"].contains("sizeLimit"));
}

TEST_CASE("the template's security context and mounts win over the defaults") {
  SUBCASE("root, asked for explicitly in the container") {
    Json job = job_with(Json::parse(R"({"spec": {"template": {"spec": {"containers": [{"securityContext":
        {"runAsUser": 0, "readOnlyRootFilesystem": false, "capabilities": {"add": ["SYS_ADMIN"]}}}]}}}})"));
    Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
    const Json& sc = pod["spec"]["containers"][0]["securityContext"];
    CHECK(sc["runAsUser"] == 0);
    CHECK(sc["runAsNonRoot"] == false);  // a default of true would make the kubelet refuse uid 0
    CHECK(sc["readOnlyRootFilesystem"] == false);
    CHECK(sc["capabilities"] == Json::parse(R"({"add": ["SYS_ADMIN"]})"));
    CHECK_FALSE(sc.contains("allowPrivilegeEscalation"));  // the API server refuses false next to SYS_ADMIN
    CHECK(sc["seccompProfile"]["type"] == "RuntimeDefault");
  }
  SUBCASE("pod-level user, group, fsGroup and seccomp; own /dev/shm") {
    Json job = job_with(Json::parse(R"({"spec": {"template": {"spec": {
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000,
                            "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
        "containers": [{"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm/"}]}]}}}})"));
    Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
    const Json& sc = pod["spec"]["containers"][0]["securityContext"];
    // The container must not shadow what the pod level says.
    CHECK_FALSE(sc.contains("runAsUser"));
    CHECK_FALSE(sc.contains("runAsGroup"));
    CHECK_FALSE(sc.contains("seccompProfile"));
    CHECK(sc["runAsNonRoot"] == true);
    CHECK(sc["readOnlyRootFilesystem"] == true);
    CHECK(pod["spec"]["securityContext"]["fsGroup"] == 2000);
    CHECK_FALSE(pod["spec"]["securityContext"].contains("fsGroupChangePolicy"));
    const Json& mounts = pod["spec"]["containers"][0]["volumeMounts"];
    CHECK(mounts.size() == 2);  // the template's /dev/shm and our /tmp
    CHECK_FALSE(find_named(mounts, kShmVolume));
    CHECK(find_named(mounts, kTmpVolume));
    CHECK_FALSE(find_named(pod["spec"]["volumes"], kShmVolume));
    CHECK((*find_named(pod["spec"]["volumes"], "shm"))["emptyDir"]["sizeLimit"] == "8Gi");
  }
  SUBCASE("privileged keeps escalation possible") {
    Json job = job_with(Json::parse(
        R"({"spec": {"template": {"spec": {"containers": [{"securityContext": {"privileged": true}}]}}}})"));
    const Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, options());
    const Json& sc = pod["spec"]["containers"][0]["securityContext"];
    CHECK(sc["privileged"] == true);
    CHECK_FALSE(sc.contains("allowPrivilegeEscalation"));
  }
}

TEST_CASE("the operator's path roots reach the worker as env, only when set") {
  Json job = valid_job();
  CHECK_FALSE(resolved_env(build_worker_pod(job, parse_job(job).spec, 0, 1, options()),
                           build_env_configmap(job, parse_job(job).spec, options()), "RAILYARD_DATA_ROOT"));
  PodOptions o = options();
  o.roots = {"/data", "/ckpt"};
  Json pod = build_worker_pod(job, parse_job(job).spec, 0, 1, o);
  const Json cm = build_env_configmap(job, parse_job(job).spec, o);
  CHECK(resolved_env(pod, cm, "RAILYARD_DATA_ROOT") == "/data");
  CHECK(resolved_env(pod, cm, "RAILYARD_CHECKPOINT_ROOT") == "/ckpt");
}

TEST_CASE("another scheduler: its schedulerName, gang marks, nodeSelector and excluded nodes as node affinity") {
  Json job = job_with(Json::parse(R"({
      "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a-queue"},
                   "annotations": {"railyard.dev/exclude-nodes": "n3,n1"}},
      "spec": {"placement": {"scheduler": "default-scheduler", "nodeSelector": {"pool": "gpu"}},
               "template": {"spec": {"nodeSelector": {"zone": "z1"}, "affinity": {"nodeAffinity": {
                 "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                   {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["amd64"]}]},
                   {"matchExpressions": [{"key": "arch", "operator": "In", "values": ["arm64"]}]}]}}}}}}})"));
  Json pod = build_worker_pod(job, parse_job(job).spec, 1, 1, options());
  const Json& ps = pod["spec"];
  CHECK(ps["schedulerName"] == "default-scheduler");
  CHECK_FALSE(ps.contains("nodeName"));
  CHECK(ps["nodeSelector"] == Json{{"zone", "z1"}, {"pool", "gpu"}});  // the template's and the job's
  const Json& terms =
      ps["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  REQUIRE(terms.size() == 2);
  for (const Json& t : terms) {  // terms are ORed: each one must exclude the nodes
    REQUIRE(t["matchExpressions"].size() == 2);
    CHECK(t["matchExpressions"][1] ==
          Json::parse(R"({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n3"]})"));
  }
  const Json& labels = pod["metadata"]["labels"];
  const Json& ann = pod["metadata"]["annotations"];
  CHECK(labels["scheduling.x-k8s.io/pod-group"] == "tiny");
  CHECK(ann["scheduling.k8s.io/group-name"] == "tiny");
  CHECK(labels["kueue.x-k8s.io/queue-name"] == "team-a-queue");
  CHECK(labels["kueue.x-k8s.io/pod-group-name"] == "tiny");
  CHECK(ann["kueue.x-k8s.io/pod-group-total-count"] == "2");

  // No queue label on the job: no Kueue marks (Kueue would otherwise hold pods no queue admits).
  Json plain = job_with(Json::parse(R"({"spec": {"placement": {"scheduler": "volcano"}}})"));
  Json p2 = build_worker_pod(plain, parse_job(plain).spec, 0, 1, options());
  CHECK(p2["spec"]["schedulerName"] == "volcano");
  CHECK_FALSE(p2["metadata"]["labels"].contains("kueue.x-k8s.io/pod-group-name"));
  CHECK_FALSE(p2["spec"].contains("affinity"));
  CHECK(p2["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "tiny");

  // Railyard's own scheduler: none of this (it binds the gang itself, honouring the same inputs).
  Json own =
      build_worker_pod(job_with(Json::parse(R"({"metadata": {"annotations": {"railyard.dev/exclude-nodes": "n1"}},
      "spec": {"placement": {"nodeSelector": {"pool": "gpu"}}}})")),
                       parse_job(valid_job()).spec, 0, 1, options());
  CHECK(own["spec"]["schedulerName"] == "railyard");
  CHECK_FALSE(own["spec"].contains("affinity"));
  CHECK_FALSE(own["metadata"]["labels"].contains("scheduling.x-k8s.io/pod-group"));
}

namespace {

// What the API server returns for stringData: base64 under data (EVP_EncodeBlock: standard alphabet, padded).
std::string b64(const std::string& s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Json as_read(const Json& created) {
  Json secret = created;
  Json data = Json::object();
  for (const auto& [k, v] : created["stringData"].items()) data[k] = b64(v.get<std::string>());
  secret.erase("stringData");
  secret["data"] = data;
  return secret;
}

std::string subject_of(const std::string& cert_pem) {
  auto x = railyard::tls::read_cert(cert_pem, "job CA");
  char buf[256] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(x.get()), NID_commonName, buf, sizeof buf);
  return buf;
}

}  // namespace

TEST_CASE("the job's own CA: made with the Secret, added to one without it, left alone when complete") {
  namespace tls = railyard::tls;
  const Json job = valid_job();
  // A Secret made before jobs had their own CA: the patch carries a new pair for both keys, in one patch.
  const Json old = as_read(build_token_secret(job, "abc"));
  const Json before = old;
  auto patch = job_ca_patch(old, job);
  REQUIRE(patch);
  CHECK(old == before);  // the Secret read is never changed in place
  const tls::CertKey ca{(*patch)["stringData"][tls::kJobCaCertKey], (*patch)["stringData"][tls::kJobCaKeyKey]};
  CHECK_NOTHROW(tls::check_job_ca(ca, "job-ca.crt", "job-ca.key"));
  CHECK(subject_of(ca.cert_pem) == "railyard-job/team-a/tiny");
  CHECK((*patch)["stringData"].size() == 2);  // nothing else: the token and ca.crt stay
  // A pod's leaf under it chains to it and to no other job's CA.
  const tls::PodIdentity pod = tls::issue_pod_identity(ca, {"10.1.2.3"});
  CHECK(tls::usable(pod.leaf, ca.cert_pem, std::chrono::hours(24)));
  CHECK_FALSE(tls::usable(pod.leaf, tls::make_job_ca("team-a", "other").cert_pem, std::chrono::hours(0)));

  // A Secret created with the pair, read back: complete, nothing to patch (and no new key on every pass).
  const Json created = build_token_secret(job, "abc", "", ca);
  CHECK(created["stringData"][tls::kJobCaCertKey] == ca.cert_pem);
  CHECK(created["stringData"][tls::kJobCaKeyKey] == ca.key_pem);
  CHECK_FALSE(job_ca_patch(as_read(created), job));
  // Half a pair, or a key that is not the certificate's: a whole new pair.
  Json half = as_read(created);
  half["data"].erase(tls::kJobCaKeyKey);
  CHECK(job_ca_patch(half, job));
  Json mismatched = as_read(created);
  mismatched["data"][tls::kJobCaKeyKey] = b64(tls::make_job_ca("team-a", "x").key_pem);
  CHECK(job_ca_patch(mismatched, job));
}

TEST_CASE("the agent gets the job's CA and its key from the job's Secret") {
  Json pod = build_worker_pod(valid_job(), parse_job(valid_job()).spec, 0, 1, options());
  for (auto [var, key] : {std::pair{"RAILYARD_JOB_CA", "job-ca.crt"}, {"RAILYARD_JOB_CA_KEY", "job-ca.key"}}) {
    REQUIRE(find_env(pod, var));
    const Json& ref = (*find_env(pod, var))["valueFrom"]["secretKeyRef"];
    CHECK(ref["name"] == "tiny-rendezvous");
    CHECK(ref["key"] == key);
  }
}
