// A valid TrainingJob for tests to start from and break one field at a time.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "operator/api.h"
#include "operator/controller/pod_builder.h"

namespace railyard::op::testing {

inline nlohmann::json valid_job() {
  return nlohmann::json::parse(R"({
    "apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
    "metadata": {"name": "tiny", "namespace": "team-a", "uid": "uid-1", "generation": 1},
    "spec": {
      "replicas": 2, "procsPerReplica": 1, "device": "cpu",
      "model": {"preset": "tiny"},
      "data": {"train": "/data/train_*.bin"},
      "training": {"steps": 200, "globalBatch": 8, "microBatch": 4, "seqLen": 64},
      "parallelism": {"data": 2},
      "failurePolicy": {"maxRestarts": 3}
    }
  })");
}

// valid_job() with a JSON merge patch applied (null deletes a field).
inline nlohmann::json job_with(const nlohmann::json& patch) {
  nlohmann::json j = valid_job();
  j.merge_patch(patch);
  return j;
}

// A valid program-mode job (spec.program: the image's own command, no Railyard trainer): ddp in team-a, 2 replicas of
// example/pytorch:1 running python3 /app/train.py, with the JSON merge patches `patch`, then `then`, applied.
inline nlohmann::json program_job_with(const nlohmann::json& patch,
                                       const nlohmann::json& then = nlohmann::json::object()) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
    "metadata": {"name": "ddp", "namespace": "team-a", "uid": "uid-9", "generation": 1},
    "spec": {"replicas": 2, "image": "example/pytorch:1", "program": {"command": ["python3", "/app/train.py"]}}
  })");
  j.merge_patch(patch);
  j.merge_patch(then);
  return j;
}

// The env entry `name` of a worker pod's first container, or null.
inline const nlohmann::json* find_env(const nlohmann::json& pod, const std::string& name) {
  for (const nlohmann::json& e : pod["spec"]["containers"][0]["env"])
    if (e["name"] == name) return &e;
  return nullptr;
}

// The plain value `name` gets in a worker pod's first container, resolved as the kubelet does: the container's env
// wins by name over its envFrom sources, of which `configmap` (the job's <job>-env, build_env_configmap) is the
// first; nullopt when neither gives a plain value (a valueFrom entry, or the pod does not take that ConfigMap).
inline std::optional<std::string> resolved_env(const nlohmann::json& pod, const nlohmann::json& configmap,
                                               const std::string& name) {
  if (const nlohmann::json* e = find_env(pod, name))
    return e->contains("value") ? std::optional<std::string>((*e)["value"].get<std::string>()) : std::nullopt;
  const nlohmann::json& c = pod["spec"]["containers"][0];
  if (!c.contains("envFrom") || c["envFrom"].empty() ||
      c["envFrom"][0]["configMapRef"]["name"] != configmap["metadata"]["name"])
    return std::nullopt;
  const nlohmann::json& data = configmap["data"];
  if (!data.contains(name)) return std::nullopt;
  return data[name].get<std::string>();
}

// The worker configuration of `replicas` pods as it goes over the wire (what the agent and the worker read).
inline nlohmann::json config_json(const JobSpec& spec, int replicas) {
  return railyard::to_json(resolved_config(spec, replicas));
}

// The operator's pod options with a rendezvous address, as the flags give one.
inline PodOptions pod_options() {
  PodOptions o;
  o.rendezvous_addr = "railyard-rendezvous.railyard-system.svc:29400";
  return o;
}

}  // namespace railyard::op::testing
