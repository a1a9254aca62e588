// Worker pods and the per-job rendezvous Secret, built from a TrainingJob (pure: no API calls).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/pod_env.h"
#include "common/stable_names.h"
#include "common/tls/pki.h"
#include "common/wellknown.h"
#include "operator/api.h"

namespace railyard::op {

inline constexpr const char* kSchedulerName = kRailyardScheduler;
// Gang marks on pods of a job whose spec.placement.scheduler is another scheduler (docs/scheduler.md "Another
// scheduler"): scheduler-plugins' coscheduling, Volcano, Kueue's plain-pod groups (Kueue's only with a queue label on
// the job, which is copied to the pods).
inline constexpr const char* kPodGroupLabel = "scheduling.x-k8s.io/pod-group";
inline constexpr const char* kVolcanoGroupAnnotation = "scheduling.k8s.io/group-name";
inline constexpr const char* kKueueQueueLabel = "kueue.x-k8s.io/queue-name";
inline constexpr const char* kKueuePodGroupLabel = "kueue.x-k8s.io/pod-group-name";
inline constexpr const char* kKueuePodGroupCountAnnotation = "kueue.x-k8s.io/pod-group-total-count";
// The first local rank's metrics port (rank l serves port + l): what deploy/prometheus/prometheus.yml and the
// chart's PodMonitor scrape.
inline constexpr const char* kTokenKey = "token";
// The CA of the rendezvous service's certificate in the job's Secret <job>-rendezvous (RAILYARD_RENDEZVOUS_CA).
inline constexpr const char* kRendezvousCaKey = "ca.crt";
// The worker image's user and group (deploy/docker/Dockerfile.worker: USER 65532:65532), the default runAsUser,
// runAsGroup and fsGroup of worker pods.
inline constexpr int64_t kWorkerUid = 65532;
// The writable mounts a read-only root filesystem needs, added unless the template mounts the path itself.
inline constexpr const char* kTmpVolume = "railyard-tmp";  // emptyDir at /tmp
inline constexpr const char* kShmVolume = "railyard-shm";  // emptyDir (medium Memory) at /dev/shm
// A program's home (emptyDir at kProgramHome): HOME and the common caches point there unless the template sets them
// (program_home_env), so pip, Hugging Face, torch hub, Triton, TorchInductor and matplotlib work under the read-only
// root filesystem and uid 65532, which has no home in most images.
inline constexpr const char* kHomeVolume = "railyard-home";
inline constexpr const char* kProgramHome = "/home/railyard";
// The variables and their values (under kProgramHome), in the job's ConfigMap: the template's env or envFrom of the
// same name wins. docs/programs.md "Images that just work".
std::vector<std::pair<std::string, std::string>> program_home_env();

struct PodOptions {
  std::string worker_image = "railyard/worker:latest";
  // The agent's argv before "agent"; on the local cluster the absolute path of build/bin/railyard-worker.
  std::vector<std::string> worker_command = {"railyard-worker"};
  std::string rendezvous_addr;  // host:port agents reach the rendezvous service at
  // The service speaks TLS: pods get RAILYARD_RENDEZVOUS_CA from their Secret's ca.crt (--rendezvous-tls).
  bool rendezvous_tls = false;
  // /metrics of the workers (port + local rank) and of the agent, on the pod IP; 0 = not served.
  int worker_metrics_port = 9400;
  int agent_metrics_port = 9399;
  // --data-root / --checkpoint-root: specs outside them are Invalid, and the workers get them as
  // RAILYARD_DATA_ROOT / RAILYARD_CHECKPOINT_ROOT to refuse paths that resolve (symlinks) outside.
  PathRoots roots;
  // --cluster-domain: the kubelets' clusterDomain, the last part of a pod's DNS name
  // <pod>.<job>.<namespace>.svc.<cluster domain> (RAILYARD_POD_DOMAIN, common/stable_names.h).
  std::string cluster_domain = names::kDefaultClusterDomain;
};

std::string worker_pod_name(const std::string& job_name, int index);
// The job's headless Service (operator/controller/job_service.h): the job's name. Every worker pod has it as its
// subdomain, so <pod>.<service>.<namespace>.svc.<cluster domain> resolves to the pod.
std::string job_service_name(const std::string& job_name);
std::string token_secret_name(const std::string& job_name);
// "<job>-env": the ConfigMap of the job-wide env every worker pod takes through envFrom.
std::string env_configmap_name(const std::string& job_name);
// "railyard.dev/job=<name>": the scale subresource's selector and the pod informer's filter.
std::string job_selector(const std::string& job_name);

// ownerReference to the job: controller=true, blockOwnerDeletion=true.
Json owner_reference(const Json& job);

// One worker pod: the agent command and env, labels, owner reference, hostname (the pod's name) and subdomain (the
// job's headless Service; both always Railyard's), schedulerName (spec.placement.scheduler,
// railyard by default; another scheduler's pods also get its gang marks, nodeSelector and the excluded nodes as node
// affinity), restartPolicy Never,
// merged with spec.template (labels, annotations, pod-level fields, container command/args/env/mounts override).
// Railyard's own labels, schedulerName, restartPolicy and owner always win. The worker container gets secure defaults
// (non-root uid kWorkerUid, read-only root, no privilege escalation, all capabilities dropped, RuntimeDefault seccomp,
// pod fsGroup) for every field the template's container or pod securityContext leaves unset, and emptyDirs at /tmp
// and /dev/shm (memory) unless the template mounts those paths. The job-wide env is not in the pod but in the job's
// ConfigMap (WorkerPodBuilder::env_configmap), taken through envFrom; automountServiceAccountToken is false unless
// the template sets it.
Json build_worker_pod(const Json& job, const JobSpec& spec, int index, int64_t generation, const PodOptions& opts);

// The same, for many pods of one job: the pods of a gang differ only in their replica index (name, hostname, the
// index label, RAILYARD_REPLICA_INDEX), so the merge above runs once and pod(i) stamps the index on a copy
// (a small saving: docs/benchmarks.md, 2026-12-02); build_worker_pod is this with one pod.
class WorkerPodBuilder {
 public:
  WorkerPodBuilder(const Json& job, const JobSpec& spec, int64_t generation, const PodOptions& opts);
  Json pod(int index) const;
  // The job's ConfigMap <job>-env (owned by the job, label railyard.dev/job): the env that is the same in every pod
  // (job name and namespace, procs per pod, device, rendezvous address, a program's restart/checkpoint/step values
  // and, with spec.program.addresses DNS, its pods' DNS domain RAILYARD_POD_DOMAIN; the path roots, NCCL_CROSS_NIC on
  // GPU pods), which the pods take through envFrom. It must exist before the pods:
  // a pod whose envFrom ConfigMap is missing does not start.
  const Json& env_configmap() const { return configmap_; }

 private:
  std::string job_name_;
  Json base_;
  Json configmap_;
  bool index_env_ours_ = true;  // false when the template sets RAILYARD_REPLICA_INDEX itself
};

// The Secret holding the job's rendezvous token (and, when the service speaks TLS, the CA pods trust; and, when given,
// the job's own CA, keys job-ca.crt and job-ca.key: common/tls/job_identity.h), owned by the job.
Json build_token_secret(const Json& job, const std::string& token, const std::string& ca_pem = "",
                        const tls::CertKey& job_ca = {});

// What a job's Secret (as read, never changed) lacks of the job's own CA: nullopt when job-ca.crt and job-ca.key hold a
// CA and its key valid for a day more; else a merge patch ({"stringData": ...}) with a new pair for both keys at once
// (one patch: a crash leaves the old pair or the new one, never half). Pods made before the patch fail to start
// until it lands (their env refers to the keys), so it lands before any pod: ensure_token runs first.
std::optional<Json> job_ca_patch(const Json& secret, const Json& job);

// 32 random bytes as hex (OpenSSL RAND_bytes); throws railyard::Error if the RNG fails.
std::string random_token();

// WorkerPodBuilder(job, spec, 0, opts).env_configmap().
Json build_env_configmap(const Json& job, const JobSpec& spec, const PodOptions& opts);

// Replica index from a pod's label; -1 when absent or malformed.
int replica_index_of(const Json& pod);

}  // namespace railyard::op
