#include "operator/controller/pod_builder.h"

#include <openssl/rand.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <string_view>

#include "common/error.h"
#include "common/flash_checkpoint.h"
#include "common/kube/client.h"
#include "common/pod_env.h"
#include "common/rendezvous_protocol.h"
#include "common/tls/job_identity.h"
#include "common/torchrun.h"
#include "common/wellknown.h"
#include "operator/scheduler/nccl_env.h"
#include "operator/scheduler/placement.h"

namespace railyard::op {

std::string worker_pod_name(const std::string& job_name, int index) {
  return job_name + "-worker-" + std::to_string(index);
}
std::string job_service_name(const std::string& job_name) { return job_name; }
std::string token_secret_name(const std::string& job_name) { return job_name + "-rendezvous"; }
std::string env_configmap_name(const std::string& job_name) { return job_name + "-env"; }
std::string job_selector(const std::string& job_name) { return std::string(wellknown::kJobLabel) + "=" + job_name; }

Json owner_reference(const Json& job) {
  return {{"apiVersion", job.value("apiVersion", "railyard.dev/v1alpha1")},
          {"kind", job.value("kind", "TrainingJob")},
          {"name", job["metadata"].value("name", "")},
          {"uid", job["metadata"].value("uid", "")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

namespace {

Json env_value(const std::string& name, const std::string& value) { return {{"name", name}, {"value", value}}; }
Json env_field(const std::string& name, const std::string& path) {
  return {{"name", name}, {"valueFrom", {{"fieldRef", {{"apiVersion", "v1"}, {"fieldPath", path}}}}}};
}

// Appends `extra` entries to `list` (both arrays of objects with "name"), replacing entries of the same name.
void merge_named(Json& list, const Json& extra) {
  if (!extra.is_array()) return;
  for (const Json& e : extra) {
    if (!e.is_object() || !e.contains("name")) continue;
    bool replaced = false;
    for (Json& x : list)
      if (x.value("name", "") == e["name"]) {
        x = e;
        replaced = true;
      }
    if (!replaced) list.push_back(e);
  }
}

bool mounts_path(const Json& mounts, const std::string& path) {
  for (const Json& m : mounts) {
    if (!m.is_object() || !m.contains("mountPath") || !m["mountPath"].is_string()) continue;
    std::string p = m["mountPath"].get<std::string>();
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    if (p == path) return true;
  }
  return false;
}

bool has_named(const Json& list, const std::string& name) {
  for (const Json& e : list)
    if (e.is_object() && e.value("name", "") == name) return true;
  return false;
}

// Secure defaults for the worker container, each only where neither the template's container nor its pod-level
// securityContext says otherwise: a user who needs root or privileges sets them explicitly in spec.template.
void apply_security_defaults(Json& container, Json& pod_spec) {
  Json sc = container.contains("securityContext") && container["securityContext"].is_object()
                ? container["securityContext"]
                : Json::object();
  const bool pod_sc_ok = !pod_spec.contains("securityContext") || pod_spec["securityContext"].is_object();
  Json psc = pod_spec.contains("securityContext") && pod_spec["securityContext"].is_object()
                 ? pod_spec["securityContext"]
                 : Json::object();
  auto unset = [&](const char* k) { return !sc.contains(k) && !psc.contains(k); };
  // The API server refuses allowPrivilegeEscalation=false next to privileged or an added CAP_SYS_ADMIN.
  bool needs_escalation = sc.value("privileged", false) == true;
  if (sc.contains("capabilities") && sc["capabilities"].is_object() && sc["capabilities"].contains("add") &&
      sc["capabilities"]["add"].is_array()) {
    for (const Json& c : sc["capabilities"]["add"])
      if (c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN") needs_escalation = true;
  }
  if (!sc.contains("allowPrivilegeEscalation") && !needs_escalation) sc["allowPrivilegeEscalation"] = false;
  if (!sc.contains("readOnlyRootFilesystem")) sc["readOnlyRootFilesystem"] = true;
  if (!sc.contains("capabilities")) sc["capabilities"] = {{"drop", Json::array({"ALL"})}};
  const Json* uid = sc.contains("runAsUser")    ? &sc["runAsUser"]
                    : psc.contains("runAsUser") ? &psc["runAsUser"]
                                                : nullptr;
  if (unset("runAsNonRoot")) sc["runAsNonRoot"] = !(uid && uid->is_number() && uid->get<double>() == 0);
  if (unset("runAsUser")) sc["runAsUser"] = kWorkerUid;
  if (unset("runAsGroup")) sc["runAsGroup"] = kWorkerUid;
  if (unset("seccompProfile")) sc["seccompProfile"] = {{"type", "RuntimeDefault"}};
  container["securityContext"] = sc;
  // Volumes (checkpoint PVCs) writable by the worker's group; OnRootMismatch skips the recursive chown when the
  // volume root already matches, so large checkpoint volumes do not slow every pod start.
  if (pod_sc_ok && !psc.contains("fsGroup")) {
    psc["fsGroup"] = kWorkerUid;
    if (!psc.contains("fsGroupChangePolicy")) psc["fsGroupChangePolicy"] = "OnRootMismatch";
    pod_spec["securityContext"] = psc;
  }
}

// A read-only root filesystem still needs /tmp (the agent writes /tmp/railyard-agent) and a /dev/shm large enough for
// the in-memory checkpoint tier (POSIX shm; containers default to 64 MiB). The template's own mounts of either path
// win. The memory-backed emptyDir has no sizeLimit: its pages count against the container's memory limit.
void add_writable_mounts(Json& container, Json& pod_spec, bool program) {
  Json mounts = container.contains("volumeMounts") && container["volumeMounts"].is_array() ? container["volumeMounts"]
                                                                                           : Json::array();
  Json volumes = pod_spec.contains("volumes") && pod_spec["volumes"].is_array() ? pod_spec["volumes"] : Json::array();
  const struct {
    const char* name;
    const char* path;
    bool memory;
  } wanted[] = {{kTmpVolume, "/tmp", false}, {kShmVolume, "/dev/shm", true}, {kHomeVolume, kProgramHome, false}};
  bool changed = false;
  for (const auto& w : wanted) {
    if (!program && std::string_view(w.name) == kHomeVolume) continue;  // the built-in trainer writes no home
    if (mounts_path(mounts, w.path) || has_named(volumes, w.name)) continue;
    volumes.push_back({{"name", w.name}, {"emptyDir", w.memory ? Json{{"medium", "Memory"}} : Json::object()}});
    mounts.push_back({{"name", w.name}, {"mountPath", w.path}});
    changed = true;
  }
  if (!changed) return;
  container["volumeMounts"] = mounts;
  pod_spec["volumes"] = volumes;
}

// spec.storage: the pod's volume of the job's claim and the worker container's mount of it (docs/storage.md).
void add_storage_mount(Json& container, Json& pod_spec, const StorageSpec& st, const std::string& job_name) {
  Json volumes = pod_spec.contains("volumes") && pod_spec["volumes"].is_array() ? pod_spec["volumes"] : Json::array();
  volumes.push_back({{"name", api::kStorageVolumeName},
                     {"persistentVolumeClaim", {{"claimName", api::storage_claim_name(job_name)}}}});
  pod_spec["volumes"] = volumes;
  Json mounts = container.contains("volumeMounts") && container["volumeMounts"].is_array() ? container["volumeMounts"]
                                                                                           : Json::array();
  mounts.push_back({{"name", api::kStorageVolumeName}, {"mountPath", st.mount_path}});
  container["volumeMounts"] = mounts;
}

// A program job's launcher: the init container copies railyard-worker (the agent) with every shared library it
// links, the dynamic loader included, into an emptyDir, so that the agent runs in any image on the same CPU
// architecture (no Railyard binary, no Debian 12 libraries needed there). The worker container starts the loader
// on the copied binary; the program it runs (spec.program) is the image's own.
constexpr const char* kLauncherVolume = "railyard-launcher";
constexpr const char* kLauncherDir = "/railyard";
constexpr const char* kLauncherScript =
    "set -eu\n"
    "d=/railyard/launcher; mkdir -p \"$d/lib\"\n"
    "b=$(command -v railyard-worker)\n"
    "cp \"$b\" \"$d/railyard-worker\"\n"
    "ldd \"$b\" | awk '$2 == \"=>\" && $3 ~ /^\\// {print $3} $1 ~ /^\\// {print $1}' | while read -r l; do\n"
    "  case \"$l\" in */ld-linux*) cp -L \"$l\" \"$d/ld.so\" ;; *) cp -L \"$l\" \"$d/lib/\" ;; esac\n"
    "done\n"
    "test -x \"$d/ld.so\"\n";

void add_launcher(Json& container, Json& pod_spec, const JobSpec& spec, const PodOptions& opts) {
  const std::string dir = std::string(kLauncherDir) + "/launcher";
  container["command"] = Json::array({dir + "/ld.so", "--library-path", dir + "/lib", dir + "/railyard-worker"});
  Json args = Json::array({"agent", "--"});
  for (const auto& a : spec.program_command) args.push_back(a);
  for (const auto& a : spec.program_args) args.push_back(a);
  container["args"] = args;
  Json mounts = container.value("volumeMounts", Json::array());
  mounts.push_back({{"name", kLauncherVolume}, {"mountPath", kLauncherDir}, {"readOnly", true}});
  container["volumeMounts"] = mounts;
  Json volumes = pod_spec.value("volumes", Json::array());
  volumes.push_back({{"name", kLauncherVolume}, {"emptyDir", Json::object()}});
  pod_spec["volumes"] = volumes;
  Json init = {{"name", "railyard-launcher"},
               {"image", opts.worker_image},
               {"command", Json::array({"sh", "-c", kLauncherScript})},
               {"volumeMounts", Json::array({{{"name", kLauncherVolume}, {"mountPath", kLauncherDir}}})},
               {"resources", {{"requests", {{"cpu", "10m"}, {"memory", "32Mi"}}}, {"limits", {{"memory", "128Mi"}}}}}};
  Json unused = pod_spec;  // the init container gets the same secure defaults, judged against the pod's context
  apply_security_defaults(init, unused);
  Json inits = pod_spec.value("initContainers", Json::array());
  inits.insert(inits.begin(), init);
  pod_spec["initContainers"] = inits;
}

// A pod that the cluster's scheduler binds (spec.placement.scheduler is not railyard): what Railyard's own placement
// would have applied becomes pod fields that scheduler reads, and the pod is marked as one of a gang the way the
// common gang-scheduling schedulers and Kueue read it (docs/scheduler.md "Another scheduler").
void for_other_scheduler(const Json& job, const JobSpec& spec, Json& labels, Json& annotations, Json& pod_spec) {
  const std::string job_name = job["metadata"].value("name", "");
  // spec.placement.nodeSelector, on top of the template's own nodeSelector.
  for (const auto& [k, v] : spec.node_selector) pod_spec["nodeSelector"][k] = v;
  // Nodes the monitor or the operator excluded after failures (railyard.dev/exclude-nodes): a required node affinity
  // term (every term of the template gets the expression, since terms are ORed).
  const Json job_ann = job["metadata"].value("annotations", Json::object());
  if (job_ann.contains(kExcludeNodesAnnotation) && job_ann[kExcludeNodesAnnotation].is_string()) {
    const std::set<std::string> excluded = parse_node_list(job_ann[kExcludeNodesAnnotation].get<std::string>());
    if (!excluded.empty()) {
      const Json expr = {{"key", "kubernetes.io/hostname"},
                         {"operator", "NotIn"},
                         {"values", Json(std::vector<std::string>(excluded.begin(), excluded.end()))}};
      Json& required = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
      Json& terms = required["nodeSelectorTerms"];
      if (!terms.is_array() || terms.empty()) terms = Json::array({Json::object()});
      for (Json& t : terms) t["matchExpressions"].push_back(expr);
    }
  }
  // The gang: scheduler-plugins' coscheduling (label; its PodGroup named after the job), Volcano (annotation; its
  // PodGroup likewise), and Kueue's plain-pod groups when the job names a queue (all pods or none admitted).
  labels[kPodGroupLabel] = job_name;
  annotations[kVolcanoGroupAnnotation] = job_name;
  const Json job_labels = job["metadata"].value("labels", Json::object());
  if (job_labels.contains(kKueueQueueLabel) && job_labels[kKueueQueueLabel].is_string()) {
    labels[kKueueQueueLabel] = job_labels[kKueueQueueLabel];
    labels[kKueuePodGroupLabel] = job_name;
    annotations[kKueuePodGroupCountAnnotation] = std::to_string(spec.replicas);
  }
}

}  // namespace

// Everything of a worker pod but its replica index (metadata.name, spec.hostname, the index label and the
// RAILYARD_REPLICA_INDEX env, left for WorkerPodBuilder::pod to stamp).
WorkerPodBuilder::WorkerPodBuilder(const Json& job, const JobSpec& spec, int64_t generation, const PodOptions& opts)
    : job_name_(job["metadata"].value("name", "")) {
  const std::string& job_name = job_name_;
  const std::string ns = job["metadata"].value("namespace", "");
  const Json tmpl = job.contains("spec") && job["spec"].contains("template") && job["spec"]["template"].is_object()
                        ? job["spec"]["template"]
                        : Json::object();
  const Json tmeta = tmpl.value("metadata", Json::object());
  const Json tspec = tmpl.value("spec", Json::object());

  Json labels = tmeta.value("labels", Json::object());
  labels[wellknown::kJobLabel] = job_name;
  labels[wellknown::kGenerationLabel] = std::to_string(generation);
  Json annotations = tmeta.value("annotations", Json::object());

  std::vector<std::string> command = opts.worker_command;
  Json container = {{"name", "worker"},
                    {"image", spec.image.empty() ? opts.worker_image : spec.image},
                    {"command", command},
                    {"args", Json::array({"agent"})}};
  // Job-wide values go to the job's ConfigMap (env_configmap(), envFrom): written once per job, not once per pod,
  // which keeps the pod small (each of 1,000 pods is decoded, stored and sent to every watcher: docs/benchmarks.md,
  // 2026-12-02). Only what differs per pod, refers to the Secret, or must win over the template stays in env.
  Json shared = {{pod_env::kJobName, job_name},
                 // Tells this job from an earlier one of the same name (the checkpoint fence compares generations
                 // only within one job: docs/checkpointing.md).
                 {pod_env::kJobUid, job["metadata"].value("uid", "")},
                 {pod_env::kJobNamespace, ns},
                 {pod_env::kPodNamespace, ns},  // a pod's namespace is its job's
                 {pod_env::kProcsPerReplica, std::to_string(spec.procs_per_replica)},
                 {pod_env::kProcsPerPod, std::to_string(spec.procs_per_replica)},
                 {pod_env::kDevice, spec.device},
                 {pod_env::kRendezvousAddr, opts.rendezvous_addr}};
  Json env = Json::array({
      env_value(pod_env::kReplicaIndex, ""),  // stamped per pod
      env_field(pod_env::kPodName, "metadata.name"),
      // The name is reused by a replacement pod; the UID is not (the rendezvous fences by it).
      env_field(rdzv::kPodUidEnv, "metadata.uid"),
      env_field(pod_env::kPodIp, "status.podIP"),
      env_field(pod_env::kNodeName, "spec.nodeName"),
      {{"name", pod_env::kRendezvousToken},
       {"valueFrom", {{"secretKeyRef", {{"name", token_secret_name(job_name)}, {"key", kTokenKey}}}}}},
  });
  // The job's own CA: the agent issues its pod's certificate for the peer copies and the bootstrap store with it.
  for (auto [var, key] : {std::pair{tls::kJobCaCertEnv, tls::kJobCaCertKey}, {tls::kJobCaKeyEnv, tls::kJobCaKeyKey}})
    env.push_back(
        {{"name", var}, {"valueFrom", {{"secretKeyRef", {{"name", token_secret_name(job_name)}, {"key", key}}}}}});
  if (opts.rendezvous_tls)
    env.push_back(
        {{"name", pod_env::kRendezvousCa},
         {"valueFrom", {{"secretKeyRef", {{"name", token_secret_name(job_name)}, {"key", kRendezvousCaKey}}}}}});

  if (spec.program) {
    // What a program may use beside torchrun's variables (the agent adds the per-rank ones): docs/programs.md.
    shared[pod_env::kMaxRestarts] = std::to_string(spec.max_restarts);
    // spec.program.launcher as resolved: torchrun mode starts the command once per pod with PET_* (common/torchrun.h).
    shared[torchrun::kLauncherEnv] = spec.program_torchrun ? torchrun::kLauncherTorchrun : torchrun::kLauncherPerRank;
    if (!spec.checkpoint_path.empty()) shared[flash::kCheckpointDirEnv] = spec.checkpoint_path;
    if (spec.checkpoint_interval_steps > 0)
      shared[flash::kIntervalEnv] = std::to_string(spec.checkpoint_interval_steps);
    // The flash checkpoint module's memory interval (0: snapshots only as the staging of disk saves) and retention.
    shared[flash::kMemoryIntervalEnv] = std::to_string(spec.memory_interval_steps);
    if (spec.checkpoint_keep && *spec.checkpoint_keep > 0)
      shared[flash::kKeepEnv] = std::to_string(*spec.checkpoint_keep);
    if (spec.steps > 0) shared[pod_env::kTotalSteps] = std::to_string(spec.steps);
    for (const auto& [name, value] : program_home_env()) shared[name] = value;
    // Stable names: the agent gives the ranks MASTER_ADDR and the hostfile as <pod>.<this domain> (docs/programs.md
    // "Stable names"); without it, pod IPs. The built-in trainer keeps pod IPs: its store needs no name.
    if (spec.dns_addresses)
      shared[names::kPodDomainEnv] = names::pod_domain(job_service_name(job_name), ns, opts.cluster_domain);
  }
  if (!opts.roots.data.empty()) shared[pod_env::kDataRoot] = opts.roots.data;
  if (!opts.roots.checkpoint.empty()) shared[pod_env::kCheckpointRoot] = opts.roots.checkpoint;

  // Resources: the job's, plus GPUs for cuda jobs that did not ask for them explicitly.
  Json resources = job["spec"].value("resources", Json::object());
  if (spec.device == "cuda") {
    for (const char* part : {"limits", "requests"})
      if (!resources.contains(part) || !resources[part].contains("nvidia.com/gpu"))
        resources[part]["nvidia.com/gpu"] = spec.procs_per_replica;
  }
  if (!resources.empty()) container["resources"] = resources;

  Json pod_spec = tspec;  // pod-level fields (volumes, tolerations, serviceAccountName, ...) come from the template
  Json containers = Json::array();
  if (tspec.contains("containers") && tspec["containers"].is_array() && !tspec["containers"].empty()) {
    const Json& tc = tspec["containers"][0];
    if (tc.is_object()) {
      for (auto it = tc.begin(); it != tc.end(); ++it) {
        if (it.key() == "env" || it.key() == "name") continue;
        if (it.key() == "resources" && it.value().is_object()) {
          for (auto r = it.value().begin(); r != it.value().end(); ++r) container["resources"][r.key()] = r.value();
          continue;
        }
        container[it.key()] = it.value();
      }
      // A template command without args means "run exactly this", not "this plus the agent's args".
      if (tc.contains("command") && !tc.contains("args")) container.erase("args");
      const Json tenv = tc.value("env", Json::array());
      // A template that sets the index env itself keeps its value in every pod (it wins like any template env).
      index_env_ours_ = !tenv.is_array() || !has_named(tenv, pod_env::kReplicaIndex);
      merge_named(env, tenv);
    }
    for (size_t i = 1; i < tspec["containers"].size(); ++i) containers.push_back(tspec["containers"][i]);
  }
  // Metrics ports: env for the processes, named container ports for PodMonitors and people. Appended after the
  // template's env so a template cannot silently disagree with the ports declared here.
  Json ports = container.value("ports", Json::array());
  if (opts.worker_metrics_port > 0) {
    annotations[wellknown::kMetricsPortAnnotation] = std::to_string(opts.worker_metrics_port);
    merge_named(env, Json::array({env_value(pod_env::kMetricsPort, std::to_string(opts.worker_metrics_port))}));
    // A program serves no railyard_worker_* series: its agent serves them there, from the ranks' progress files and
    // output, so the monitor's rules see a program's ranks like the trainer's (docs/programs.md).
    if (spec.program) shared[pod_env::kAgentRankMetrics] = "1";
    for (int l = 0; l < spec.procs_per_replica; ++l) {
      // One named port per local rank (metrics, metrics-1 ... metrics-63: procsPerReplica is at most 64, names fit
      // in 15 characters): Prometheus' pod discovery makes each a target, so every rank is scraped.
      ports.push_back({{"name", l == 0 ? std::string("metrics") : "metrics-" + std::to_string(l)},
                       {"containerPort", opts.worker_metrics_port + l},
                       {"protocol", "TCP"}});
    }
  }
  if (opts.agent_metrics_port > 0) {
    merge_named(env, Json::array({env_value(pod_env::kAgentMetricsPort, std::to_string(opts.agent_metrics_port))}));
    ports.push_back({{"name", "agent-metrics"}, {"containerPort", opts.agent_metrics_port}, {"protocol", "TCP"}});
  }
  if (!ports.empty()) container["ports"] = ports;
  // GPU pods: rail-aligned NCCL settings (nccl_env.h). The template's env wins: only names it does not set are added.
  if (pod_resource({{"spec", {{"containers", Json::array({container})}}}}, kGpuResource) > 0) {
    for (const Json& e : nccl_pod_env())
      if (e.contains("value"))
        shared[e["name"].get<std::string>()] = e["value"];
      else if (std::none_of(env.begin(), env.end(), [&](const Json& x) { return x.value("name", "") == e["name"]; }))
        env.push_back(e);
  }
  container["env"] = env;
  // Ours first: a later source wins, so the template's own envFrom and env override the job-wide values by name.
  Json env_from = Json::array({{{"configMapRef", {{"name", env_configmap_name(job_name)}}}}});
  if (container.contains("envFrom") && container["envFrom"].is_array())
    for (const Json& e : container["envFrom"]) env_from.push_back(e);
  container["envFrom"] = env_from;
  // A pod that fails without its agent's report still says why: the kubelet keeps the last lines of its log as the
  // termination message, which the operator shows (pod_termination_message). The template may choose otherwise.
  if (!container.contains("terminationMessagePolicy")) container["terminationMessagePolicy"] = "FallbackToLogsOnError";
  apply_security_defaults(container, pod_spec);
  if (spec.storage) add_storage_mount(container, pod_spec, *spec.storage, job_name);
  add_writable_mounts(container, pod_spec, spec.program);
  if (spec.program) add_launcher(container, pod_spec, spec, opts);
  containers.insert(containers.begin(), container);
  pod_spec["containers"] = containers;
  pod_spec["schedulerName"] = spec.scheduler;
  pod_spec["restartPolicy"] = "Never";
  // <pod>.<job>.<namespace>.svc.<cluster domain> through the job's headless Service (the hostname, the pod's name, is
  // stamped per pod). Railyard's: a template's subdomain would name a Service the operator does not keep.
  pod_spec["subdomain"] = job_service_name(job_name);
  pod_spec.erase("nodeName");  // binding is the operator's or the chosen scheduler's job, never the template's
  // The worker never calls the API server: no token in its pods unless the template asks for one (least privilege,
  // and a volume less in each pod).
  if (!pod_spec.contains("automountServiceAccountToken")) pod_spec["automountServiceAccountToken"] = false;
  if (spec.scheduler != kRailyardScheduler) for_other_scheduler(job, spec, labels, annotations, pod_spec);

  base_ = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", ""}, {"namespace", ns}, {"labels", labels}, {"ownerReferences", Json::array({owner_reference(job)})}}},
      {"spec", pod_spec}};
  if (!annotations.empty()) base_["metadata"]["annotations"] = annotations;
  configmap_ = {{"apiVersion", "v1"},
                {"kind", "ConfigMap"},
                {"metadata",
                 {{"name", env_configmap_name(job_name)},
                  {"namespace", ns},
                  {"labels", {{wellknown::kJobLabel, job_name}}},
                  {"ownerReferences", Json::array({owner_reference(job)})}}},
                {"data", shared}};
}

Json WorkerPodBuilder::pod(int index) const {
  Json pod = base_;
  const std::string name = worker_pod_name(job_name_, index), idx = std::to_string(index);
  pod["metadata"]["name"] = name;
  pod["metadata"]["labels"][wellknown::kReplicaIndexLabel] = idx;
  pod["spec"]["hostname"] = name;
  if (index_env_ours_)
    for (Json& e : pod["spec"]["containers"][0]["env"])
      if (e.value("name", "") == pod_env::kReplicaIndex) e["value"] = idx;
  return pod;
}

std::vector<std::pair<std::string, std::string>> program_home_env() {
  const std::string home = kProgramHome;
  // Each tool's own variable as well as HOME and XDG_CACHE_HOME: some read only their own (TORCHINDUCTOR_CACHE_DIR's
  // default needs a user name uid 65532 lacks; Triton's is ~/.triton), and naming each shows where it goes.
  return {{"HOME", home},
          {"XDG_CACHE_HOME", home + "/.cache"},
          {"PIP_CACHE_DIR", home + "/.cache/pip"},
          {"HF_HOME", home + "/.cache/huggingface"},
          {"TORCH_HOME", home + "/.cache/torch"},
          {"TRITON_CACHE_DIR", home + "/.cache/triton"},
          {"TORCHINDUCTOR_CACHE_DIR", home + "/.cache/torchinductor"},
          {"MPLCONFIGDIR", home + "/.config/matplotlib"}};
}

Json build_worker_pod(const Json& job, const JobSpec& spec, int index, int64_t generation, const PodOptions& opts) {
  return WorkerPodBuilder(job, spec, generation, opts).pod(index);
}

Json build_env_configmap(const Json& job, const JobSpec& spec, const PodOptions& opts) {
  return WorkerPodBuilder(job, spec, 0, opts).env_configmap();
}

Json build_token_secret(const Json& job, const std::string& token, const std::string& ca_pem,
                        const tls::CertKey& job_ca) {
  const std::string job_name = job["metadata"].value("name", "");
  Json data = {{kTokenKey, token}};
  if (!ca_pem.empty()) data[kRendezvousCaKey] = ca_pem;
  if (!job_ca.cert_pem.empty()) {
    data[tls::kJobCaCertKey] = job_ca.cert_pem;
    data[tls::kJobCaKeyKey] = job_ca.key_pem;
  }
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"type", "Opaque"},
          {"metadata",
           {{"name", token_secret_name(job_name)},
            {"namespace", job["metadata"].value("namespace", "")},
            {"labels", {{wellknown::kJobLabel, job_name}}},
            {"ownerReferences", Json::array({owner_reference(job)})}}},
          {"stringData", data}};
}

std::optional<Json> job_ca_patch(const Json& secret, const Json& job) {
  const Json data = secret.value("data", Json::object());
  auto value = [&](const char* key) {
    return data.contains(key) && data[key].is_string() ? kube::base64_decode(data[key].get<std::string>()) : "";
  };
  if (tls::usable_job_ca({value(tls::kJobCaCertKey), value(tls::kJobCaKeyKey)})) return std::nullopt;
  const tls::CertKey ca = tls::make_job_ca(job["metadata"].value("namespace", ""), job["metadata"].value("name", ""));
  return Json{{"stringData", {{tls::kJobCaCertKey, ca.cert_pem}, {tls::kJobCaKeyKey, ca.key_pem}}}};
}

std::string random_token() {
  unsigned char buf[32];
  if (RAND_bytes(buf, sizeof buf) != 1) throw Error("rendezvous token: OpenSSL RAND_bytes failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : buf) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

int replica_index_of(const Json& pod) {
  const Json& labels = pod["metadata"].value("labels", Json::object());
  if (!labels.contains(wellknown::kReplicaIndexLabel) || !labels[wellknown::kReplicaIndexLabel].is_string()) return -1;
  const std::string v = labels[wellknown::kReplicaIndexLabel].get<std::string>();
  int out = -1;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || out < 0) return -1;
  return out;
}

}  // namespace railyard::op
