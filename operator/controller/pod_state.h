// What the controller reads from a worker pod object (and any object's uid): phase, node, deletion, exit code.
#pragma once

#include <memory>
#include <string>

#include "common/kube/client.h"
#include "operator/api.h"

namespace railyard::op {

// A pod as the informer holds it: shared and immutable. A reconcile reads a job's 1,000 pods without copying them,
// and cannot change the cache by accident.
using PodPtr = std::shared_ptr<const Json>;

namespace pod_state_detail {
inline std::string string_or_empty(const Json& j) { return j.is_string() ? j.get<std::string>() : std::string(); }
}  // namespace pod_state_detail

inline std::string phase_of(const Json& pod) {
  return pod_state_detail::string_or_empty(kube::field(kube::field(pod, "status"), "phase"));
}
inline std::string node_of(const Json& pod) {
  return pod_state_detail::string_or_empty(kube::field(kube::field(pod, "spec"), "nodeName"));
}
inline bool terminating(const Json& pod) { return kube::field(pod, "metadata").contains("deletionTimestamp"); }
// Whether obj's controller is the TrainingJob with this uid: ownerReference controller true, the uid, kind
// TrainingJob and API group railyard.dev (any version). A uid alone could be copied by whoever can write the pod.
inline bool controlled_by(const Json& obj, const std::string& job_uid) {
  const Json& refs = kube::field(kube::field(obj, "metadata"), "ownerReferences");
  if (job_uid.empty() || !refs.is_array()) return false;
  for (const Json& o : refs) {
    const Json& controller = kube::field(o, "controller");
    if (!controller.is_boolean() || !controller.get<bool>()) continue;
    using pod_state_detail::string_or_empty;
    return string_or_empty(kube::field(o, "uid")) == job_uid &&
           string_or_empty(kube::field(o, "kind")) == "TrainingJob" &&
           string_or_empty(kube::field(o, "apiVersion")).rfind("railyard.dev/", 0) == 0;
  }
  return false;
}

inline std::string uid_of(const Json& obj) {
  return pod_state_detail::string_or_empty(kube::field(kube::field(obj, "metadata"), "uid"));
}

// The worker container's exit code from a Failed pod; -1 when the pod failed without one (e.g. evicted).
inline int pod_exit_code(const Json& pod) {
  for (const Json& cs : kube::field(kube::field(pod, "status"), "containerStatuses")) {
    if (kube::field(cs, "name") != "worker") continue;
    const Json& terminated = kube::field(kube::field(cs, "state"), "terminated");
    if (terminated.is_null()) continue;
    const Json& code = kube::field(terminated, "exitCode");
    return code.is_number_integer() ? code.get<int>() : -1;
  }
  return -1;
}

// Whether every process of the pod has ended, as its kubelet reports it: the pod Succeeded or Failed, or each of its
// containers has a terminated state and no init container still runs. A pod being deleted whose processes ended
// holds nothing but its name (the kubelet still unmounts its volumes and removes its cgroup before it confirms the
// deletion, seconds on an idle node): force-deleting it then lets its replacement start that much sooner.
inline bool processes_ended(const Json& pod) {
  const std::string phase = phase_of(pod);
  if (phase == "Succeeded" || phase == "Failed") return true;
  const Json& spec = kube::field(pod, "spec");
  const Json& status = kube::field(pod, "status");
  const Json& containers = kube::field(spec, "containers");
  const Json& statuses = kube::field(status, "containerStatuses");
  if (!containers.is_array() || containers.empty() || !statuses.is_array()) return false;
  for (const Json& init : kube::field(status, "initContainerStatuses"))
    if (!kube::field(kube::field(init, "state"), "running").is_null()) return false;
  for (const Json& c : containers) {
    const Json& name = kube::field(c, "name");
    bool ended = false;
    for (const Json& cs : statuses)
      if (kube::field(cs, "name") == name && !kube::field(kube::field(cs, "state"), "terminated").is_null())
        ended = true;
    if (!ended) return false;
  }
  return true;
}

// Whether an ownerReference names a TrainingJob (kind and API group railyard.dev, any version).
inline bool is_training_job_ref(const Json& ref) {
  using pod_state_detail::string_or_empty;
  return string_or_empty(kube::field(ref, "kind")) == "TrainingJob" &&
         string_or_empty(kube::field(ref, "apiVersion")).rfind("railyard.dev/", 0) == 0;
}

// Whose an object under a name the operator derives from a job is: this job's (its controller reference:
// controlled_by; a uid alone can be copied by whoever can write the object), an earlier job's of the same name (owned
// by a TrainingJob, awaiting garbage collection) or someone else's (never touched).
enum class Claim { kOurs, kEarlierJob, kForeign };
inline Claim claim_of(const Json& obj, const std::string& job_uid) {
  if (controlled_by(obj, job_uid)) return Claim::kOurs;
  const Json& refs = kube::field(kube::field(obj, "metadata"), "ownerReferences");
  if (refs.is_array())
    for (const Json& r : refs)
      if (is_training_job_ref(r)) return Claim::kEarlierJob;
  return Claim::kForeign;
}

// The worker container's termination message from a Failed pod (its last log lines under the
// terminationMessagePolicy FallbackToLogsOnError the operator sets; the kubelet bounds it), raw: a tenant's text,
// sanitized where it is shown. "" when there is none.
inline std::string pod_termination_message(const Json& pod) {
  for (const Json& cs : kube::field(kube::field(pod, "status"), "containerStatuses")) {
    if (kube::field(cs, "name") != "worker") continue;
    return pod_state_detail::string_or_empty(
        kube::field(kube::field(kube::field(cs, "state"), "terminated"), "message"));
  }
  return {};
}

}  // namespace railyard::op
