// Pod spec -> what to exec: the first container's command, args, env, working directory and log file.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace railyard::node_agent {

// A pod that cannot start as specified. reason() is the Kubernetes-style reason put in the pod's status
// ("NoCommand", "CreateContainerConfigError"); permanent() says whether retrying can help (a missing secret may
// appear later; a missing command never will, since the spec is immutable).
class PlanError : public Error {
 public:
  PlanError(std::string reason, bool permanent, const std::string& message)
      : Error(message), reason_(std::move(reason)), permanent_(permanent) {}
  const std::string& reason() const { return reason_; }
  bool permanent() const { return permanent_; }

 private:
  std::string reason_;
  bool permanent_;
};

enum class RefKind { Secret, ConfigMap };
// The decoded data of a Secret or ConfigMap in a namespace, or nullopt if it does not exist. Other failures throw.
using RefLookup = std::function<std::optional<std::map<std::string, std::string>>(RefKind kind, const std::string& ns,
                                                                                  const std::string& name)>;

struct PodContext {
  std::string node_name;
  std::string pod_ip;
  std::string host_ip = "127.0.0.1";
  std::string state_dir;  // pods' default working dirs and logs live under <state_dir>/pods/
};

struct LaunchPlan {
  std::string container_name;
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // the full environment of the process, in order
  std::string working_dir;
  std::string pod_dir;  // <state_dir>/pods/<ns>_<name>
  std::string log_path;
};

// Throws PlanError. `base_env` is inherited from the agent (PATH, HOME, ...) before the pod's own variables.
LaunchPlan build_launch_plan(const nlohmann::json& pod, const PodContext& ctx, const RefLookup& lookup,
                             const std::vector<std::pair<std::string, std::string>>& base_env);

// The agent's variables a pod process inherits (PATH, HOME, LANG, TZ, TMPDIR, LD_LIBRARY_PATH, USER) when set.
std::vector<std::pair<std::string, std::string>> inherited_env();

// Kubernetes $(VAR) expansion: known names are replaced, $$ escapes a dollar, unknown references stay as they are.
std::string expand_vars(const std::string& s, const std::map<std::string, std::string>& vars);

// Resolves a downward-API field path ("metadata.name", "metadata.labels['app']", "status.podIP", ...).
std::string resolve_field_ref(const nlohmann::json& pod, const std::string& path, const PodContext& ctx);

}  // namespace railyard::node_agent
