// spec.initializer: the pod that prepares a job's data before its gang's first pod (docs/storage.md "Initializer").
// Pure builders and readers; the controller's `initialize` stage (sync_initialize.cc) makes the requests.
#pragma once

#include <string>
#include <vector>

#include "operator/api.h"
#include "operator/controller/pod_builder.h"

namespace railyard::op {

// On the initializer pod beside railyard.dev/job (which brings its events to the job): not a worker. pods_of leaves
// it out, so no worker-pod logic (indices, restarts, cleanPodPolicy) sees it.
inline constexpr const char* kRoleLabel = "railyard.dev/role";
inline constexpr const char* kInitializerRole = "initializer";
inline constexpr const char* kInitializerContainer = "initializer";
// Tries before the job fails (a fetch that fails for a moment is tried again; a wrong URL fails the job).
inline constexpr int kInitializerAttempts = 3;

std::string initializer_pod_name(const std::string& job_name);
bool is_initializer_pod(const Json& pod);

// `railyard data prepare --reuse` over spec.initializer.data: the `railyard` next to the agent binary the operator
// runs (PodOptions::worker_command: an absolute path on the local cluster), else `railyard` from the image's PATH.
std::vector<std::string> initializer_command(const InitializerSpec& init, const PodOptions& opts);
// `railyard model fetch SOURCE --output <spec.model.initFrom>` (spec.initializer.model), the same `railyard`.
std::vector<std::string> model_fetch_command(const InitializerSpec& init, const std::string& init_from,
                                             const PodOptions& opts);
inline constexpr const char* kModelInitContainer = "model";
// spec.initializer.data.image: the init container of that image that copies its path into the emptyDir
// kImageDataVolumeName, which the initializer container reads at kImageDataMountPath (an input directory).
inline constexpr const char* kDataImageContainer = "data-image";
std::vector<std::string> data_image_command(const InitializerSpec& init);

// The initializer pod: the job's worker pod as the template and the operator's flags build it (image, volumes and
// mounts, spec.storage's claim, node constraints, tolerations, secure defaults), with one container running
// initializer_command (and, with spec.initializer.data.image, an init container `data-image` of that image copying
// its files into an emptyDir the initializer reads; with spec.initializer.model, an init container `model` running
// model_fetch_command first; with the model alone, that is the one container); no Railyard env, ports, probes, sidecars
// or init containers, no GPU or other extended resources (it needs CPU and memory only); restartPolicy Never; bound by
// the cluster's default scheduler when the job's pods are Railyard's (kube-scheduler), else by the job's scheduler.
// Owned by the job.
Json build_initializer_pod(const Json& job, const JobSpec& spec, const PodOptions& opts);

// The failed container's termination message (the data-image or model init container's, else the initializer
// container's) (its last log lines when it failed: FallbackToLogsOnError), sanitized and bounded; "" when there is
// none.
std::string initializer_message(const Json& pod);

}  // namespace railyard::op
