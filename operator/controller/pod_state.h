// What the controller reads from a worker pod object (and any object's uid): phase, node, deletion, exit code.
#pragma once

#include <string>

#include "operator/controller/job_spec.h"

namespace railyard::op {

inline std::string phase_of(const Json& pod) { return pod.contains("status") ? pod["status"].value("phase", "") : ""; }
inline std::string node_of(const Json& pod) { return pod.contains("spec") ? pod["spec"].value("nodeName", "") : ""; }
inline bool terminating(const Json& pod) { return pod["metadata"].contains("deletionTimestamp"); }
inline std::string uid_of(const Json& obj) { return obj["metadata"].value("uid", ""); }

// The worker container's exit code from a Failed pod; -1 when the pod failed without one (e.g. evicted).
inline int pod_exit_code(const Json& pod) {
  if (!pod.contains("status")) return -1;
  for (const Json& cs : pod["status"].value("containerStatuses", Json::array())) {
    if (cs.value("name", "") != "worker") continue;
    const Json state = cs.value("state", Json::object());
    if (state.contains("terminated")) return state["terminated"].value("exitCode", -1);
  }
  return -1;
}

}  // namespace railyard::op
