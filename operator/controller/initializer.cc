#include "operator/controller/initializer.h"

#include <cstdio>

#include "common/kube/client.h"
#include "common/log_tail.h"
#include "common/wellknown.h"
#include "operator/controller/failure_policy.h"

namespace railyard::op {

std::string initializer_pod_name(const std::string& job_name) { return job_name + "-initializer"; }

bool is_initializer_pod(const Json& pod) {
  return kube::field(kube::field(kube::field(pod, "metadata"), "labels"), kRoleLabel) == kInitializerRole;
}

namespace {
std::string railyard_cli(const PodOptions& opts) {
  const std::string agent = opts.worker_command.empty() ? "" : opts.worker_command.front();
  if (!agent.empty() && agent.front() == '/') return agent.substr(0, agent.rfind('/')) + "/railyard";
  return "railyard";
}
}  // namespace

std::vector<std::string> model_fetch_command(const InitializerSpec& init, const std::string& init_from,
                                             const PodOptions& opts) {
  return {railyard_cli(opts), "model", "fetch", init.model_source, "--output", init_from};
}

std::vector<std::string> data_image_command(const InitializerSpec& init) {
  // $0: where to (the pod's new emptyDir: restartPolicy Never, so never a copy of an earlier try), $1: what (a file,
  // or a directory: its contents).
  return {
      "sh", "-c",
      R"(set -e; if [ -d "$1" ]; then cp -R "$1"/. "$0"/; else cp "$1" "$0"/; fi; echo "copied $1 out of the image")",
      kImageDataMountPath, init.image_path};
}

std::vector<std::string> initializer_command(const InitializerSpec& init, const PodOptions& opts) {
  std::vector<std::string> argv = {railyard_cli(opts), "data", "prepare", "--input"};
  argv.insert(argv.end(), init.sources.begin(), init.sources.end());
  if (!init.image.empty()) argv.push_back(kImageDataMountPath);  // a directory: its files, in name order
  char fraction[32];
  std::snprintf(fraction, sizeof fraction, "%.6g", init.val_fraction);
  for (const std::string& a : {std::string("--output"), init.output, std::string("--tokenizer"), init.tokenizer,
                               std::string("--val-fraction"), std::string(fraction), std::string("--reuse")})
    argv.push_back(a);
  return argv;
}

Json build_initializer_pod(const Json& job, const JobSpec& spec, const PodOptions& opts) {
  Json pod = WorkerPodBuilder(job, spec, 0, opts).pod(0);
  const std::string job_name = kube::name_of(job);
  Json& meta = pod["metadata"];
  meta["name"] = initializer_pod_name(job_name);
  meta["labels"].erase(wellknown::kReplicaIndexLabel);
  meta["labels"].erase(wellknown::kGenerationLabel);
  // Not a member of the gang another scheduler or Kueue waits for.
  for (const char* gang : {kPodGroupLabel, kKueuePodGroupLabel, kKueueQueueLabel}) meta["labels"].erase(gang);
  meta["labels"][kRoleLabel] = kInitializerRole;
  meta.erase("annotations");  // the metrics port and the scheduler's gang marks are the workers'
  Json& ps = pod["spec"];
  ps.erase("hostname");
  ps.erase("subdomain");
  ps.erase("initContainers");  // a program's launcher: the initializer runs Railyard's own CLI
  ps["restartPolicy"] = "Never";
  ps["schedulerName"] = spec.scheduler == kRailyardScheduler ? std::string("default-scheduler") : spec.scheduler;
  Json c = ps["containers"][0];
  c["name"] = kInitializerContainer;
  // A program's image is the user's and need not hold Railyard's CLI: the initializer runs in Railyard's worker image.
  if (spec.program) c["image"] = opts.worker_image;
  const InitializerSpec& init = *spec.initializer;
  c["command"] = init.has_data() ? initializer_command(init, opts) : model_fetch_command(init, spec.init_from, opts);
  c.erase("args");
  c.erase("ports");
  c.erase("envFrom");  // the job's ConfigMap and Secret are the workers' (and need not exist yet)
  for (const char* probe : {"livenessProbe", "readinessProbe", "startupProbe"}) c.erase(probe);
  // The template's own env (a proxy, credentials from its Secrets) stays; the agent's env does not.
  Json env = Json::array();
  const Json& tmpl = kube::field(kube::field(kube::field(job, "spec"), "template"), "spec");
  const Json& tcs = kube::field(tmpl, "containers");
  if (tcs.is_array() && !tcs.empty() && tcs[0].is_object() && tcs[0].contains("env") && tcs[0]["env"].is_array())
    env = tcs[0]["env"];
  c["env"] = env;
  // CPU, memory and ephemeral storage only: GPUs, RDMA devices and other extended resources are the gang's.
  if (c.contains("resources") && c["resources"].is_object())
    for (const char* part : {"requests", "limits"}) {
      if (!c["resources"].contains(part) || !c["resources"][part].is_object()) continue;
      Json kept = Json::object();
      for (auto it = c["resources"][part].begin(); it != c["resources"][part].end(); ++it)
        if (it.key() == "cpu" || it.key() == "memory" || it.key() == "ephemeral-storage") kept[it.key()] = it.value();
      c["resources"][part] = kept;
    }
  Json inits = Json::array();
  Json model_fetch;  // the same image, mounts, env and limits as the initializer container (not the image's copy)
  if (!init.model_source.empty() && init.has_data()) {
    model_fetch = c;
    model_fetch["name"] = kModelInitContainer;
    model_fetch["command"] = model_fetch_command(init, spec.init_from, opts);
  }
  if (!init.image.empty()) {
    // The data image's files, copied by a container of that image into an emptyDir that the initializer container
    // reads: the image needs sh and cp (any image with a shell). It mounts nothing else of the job's (least
    // privilege: a corpus image has no business with the job's volume) and gets no env; the same limits and secure
    // defaults as the initializer container.
    Json d = c;
    d["name"] = kDataImageContainer;
    d["image"] = init.image;
    if (init.image_pull_policy.empty())
      d.erase("imagePullPolicy");
    else
      d["imagePullPolicy"] = init.image_pull_policy;
    d["command"] = data_image_command(init);
    d["env"] = Json::array();
    d["volumeMounts"] = Json::array({{{"name", kImageDataVolumeName}, {"mountPath", kImageDataMountPath}}});
    inits.push_back(d);
    ps["volumes"].push_back({{"name", kImageDataVolumeName}, {"emptyDir", Json::object()}});
    c["volumeMounts"].push_back(
        {{"name", kImageDataVolumeName}, {"mountPath", kImageDataMountPath}, {"readOnly", true}});
  }
  if (!model_fetch.is_null()) inits.push_back(model_fetch);
  ps["containers"] = Json::array({c});
  if (!inits.empty()) ps["initContainers"] = inits;
  return pod;
}

std::string initializer_message(const Json& pod) {
  const Json& st = kube::field(pod, "status");
  for (const auto& [list, name] :
       {std::pair{"initContainerStatuses", kDataImageContainer},
        std::pair{"initContainerStatuses", kModelInitContainer}, std::pair{"containerStatuses", kInitializerContainer}})
    for (const Json& cs : kube::field(st, list)) {
      if (kube::field(cs, "name") != name) continue;
      const Json& term = kube::field(kube::field(cs, "state"), "terminated");
      const Json& msg = kube::field(term, "message");
      const Json& code = kube::field(term, "exitCode");
      if (msg.is_string() && code.is_number_integer() && code.get<int>() != 0)
        return sanitize_message(msg.get<std::string>(), kMaxCauseBytes, true);
    }
  return {};
}

}  // namespace railyard::op
