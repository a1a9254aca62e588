#include "deploy/local/node_agent/pod_spec.h"

#include <cstdlib>
#include <set>

namespace railyard::node_agent {
namespace {

std::string str_at(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

std::string pod_key(const nlohmann::json& pod) {
  const auto& md = pod.value("metadata", nlohmann::json::object());
  return str_at(md, "namespace") + "/" + str_at(md, "name");
}

// metadata.labels['key'] / metadata.annotations['key'] -> value or "".
std::optional<std::string> subscript_ref(const nlohmann::json& md, const std::string& path, const std::string& field) {
  std::string prefix = "metadata." + field + "['";
  if (path.rfind(prefix, 0) != 0 || path.size() < prefix.size() + 2 || path.substr(path.size() - 2) != "']") {
    return std::nullopt;
  }
  std::string key = path.substr(prefix.size(), path.size() - prefix.size() - 2);
  auto m = md.value(field, nlohmann::json::object());
  auto it = m.find(key);
  return (it != m.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

}  // namespace

std::string expand_vars(const std::string& s, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '$' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    if (s[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (s[i + 1] == '(') {
      size_t close = s.find(')', i + 2);
      if (close != std::string::npos) {
        std::string name = s.substr(i + 2, close - i - 2);
        auto it = vars.find(name);
        if (it != vars.end()) {
          out += it->second;
          i = close;
          continue;
        }
      }
    }
    out += s[i];
  }
  return out;
}

std::string resolve_field_ref(const nlohmann::json& pod, const std::string& path, const PodContext& ctx) {
  const auto md = pod.value("metadata", nlohmann::json::object());
  const auto spec = pod.value("spec", nlohmann::json::object());
  if (path == "metadata.name") return str_at(md, "name");
  if (path == "metadata.namespace") return str_at(md, "namespace");
  if (path == "metadata.uid") return str_at(md, "uid");
  if (path == "spec.nodeName") return ctx.node_name;
  if (path == "spec.serviceAccountName") {
    std::string sa = str_at(spec, "serviceAccountName");
    return sa.empty() ? "default" : sa;
  }
  if (path == "status.podIP" || path == "status.podIPs") return ctx.pod_ip;
  if (path == "status.hostIP") return ctx.host_ip;
  if (auto v = subscript_ref(md, path, "labels")) return *v;
  if (auto v = subscript_ref(md, path, "annotations")) return *v;
  throw PlanError("CreateContainerConfigError", true,
                  "pod " + pod_key(pod) + ": fieldRef.fieldPath '" + path +
                      "' is not supported: use metadata.name, metadata.namespace, metadata.uid, "
                      "metadata.labels['k'], metadata.annotations['k'], spec.nodeName, spec.serviceAccountName, "
                      "status.podIP or status.hostIP");
}

std::vector<std::pair<std::string, std::string>> inherited_env() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* name : {"PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "USER"}) {
    const char* v = std::getenv(name);
    if (v != nullptr) out.emplace_back(name, v);
  }
  bool has_path = false;
  for (const auto& [k, v] : out) has_path = has_path || k == "PATH";
  if (!has_path) out.emplace_back("PATH", "/usr/local/bin:/usr/bin:/bin");
  return out;
}

namespace {

// What every step of build_launch_plan reads: the pod, where it runs, how to look up its references, and the names
// its messages use.
struct PodRefs {
  const nlohmann::json& pod;
  const PodContext& ctx;
  const RefLookup& lookup;
  std::string key;  // namespace/name
  std::string ns;
};

// The process environment being built, in order. Later entries override earlier ones with the same name (like a
// container runtime), keeping first position.
struct EnvBuilder {
  std::vector<std::pair<std::string, std::string>> env;
  std::map<std::string, std::string> vars;
  // Only the pod's own variables are available to $(VAR) expansion, as in Kubernetes.
  std::map<std::string, std::string> pod_vars;

  void set(const std::string& name, const std::string& value) {
    auto [it, inserted] = vars.insert_or_assign(name, value);
    (void)it;
    if (inserted) {
      env.emplace_back(name, value);
    } else {
      for (auto& e : env) {
        if (e.first == name) e.second = value;
      }
    }
  }
  // A variable of the pod's own: set, and visible to the expansion of later ones.
  void set_pod_var(const std::string& name, const std::string& value) {
    set(name, value);
    pod_vars[name] = value;
  }
};

// The container's name, its pod directory, log file and working directory.
void place_container(LaunchPlan& plan, const nlohmann::json& c, const nlohmann::json& md, const PodContext& ctx,
                     const std::string& ns) {
  plan.container_name = str_at(c, "name");
  if (plan.container_name.empty()) plan.container_name = "main";
  plan.pod_dir = ctx.state_dir + "/pods/" + ns + "_" + str_at(md, "name");
  plan.log_path = plan.pod_dir + "/" + plan.container_name + ".log";
  plan.working_dir = str_at(c, "workingDir");
  if (plan.working_dir.empty()) plan.working_dir = plan.pod_dir + "/work";
}

// The data of a Secret or ConfigMap the container refers to (`what` names the reference); nullopt when it does not
// exist and the reference is optional.
std::optional<std::map<std::string, std::string>> fetch_ref(const PodRefs& p, RefKind kind, const std::string& name,
                                                            bool optional, const std::string& what) {
  const char* kind_name = kind == RefKind::Secret ? "secret" : "configmap";
  std::optional<std::map<std::string, std::string>> data;
  try {
    data = p.lookup(kind, p.ns, name);
  } catch (const std::exception& e) {
    throw PlanError(
        "CreateContainerConfigError", false,
        "pod " + p.key + ": " + what + ": cannot read " + kind_name + " " + p.ns + "/" + name + ": " + e.what());
  }
  if (!data && !optional) {
    throw PlanError("CreateContainerConfigError", false,
                    "pod " + p.key + ": " + what + ": " + kind_name + " \"" + name + "\" not found in namespace " +
                        p.ns + ": create it or mark the reference optional");
  }
  return data;
}

// containers[0].envFrom: every key of each Secret or ConfigMap, with the entry's prefix.
void apply_env_from(const PodRefs& p, const nlohmann::json& c, EnvBuilder& env) {
  auto env_from = c.value("envFrom", nlohmann::json::array());
  for (size_t i = 0; i < env_from.size(); ++i) {
    const auto& ef = env_from[i];
    std::string prefix = str_at(ef, "prefix");
    for (auto [field, kind] :
         {std::pair{"secretRef", RefKind::Secret}, std::pair{"configMapRef", RefKind::ConfigMap}}) {
      if (!ef.contains(field)) continue;
      const auto& ref = ef[field];
      auto data = fetch_ref(p, kind, str_at(ref, "name"), ref.value("optional", false),
                            "envFrom[" + std::to_string(i) + "]." + field);
      if (!data) continue;
      for (const auto& [k, v] : *data) env.set_pod_var(prefix + k, v);
    }
  }
}

// One env entry's valueFrom (`where` names the entry); nullopt when an optional reference is missing, which leaves
// the variable unset.
std::optional<std::string> value_from(const PodRefs& p, const nlohmann::json& vf, const std::string& where) {
  if (vf.contains("fieldRef")) return resolve_field_ref(p.pod, str_at(vf["fieldRef"], "fieldPath"), p.ctx);
  if (!vf.contains("secretKeyRef") && !vf.contains("configMapKeyRef")) {
    throw PlanError("CreateContainerConfigError", true,
                    "pod " + p.key + ": " + where +
                        ".valueFrom: only fieldRef, secretKeyRef and configMapKeyRef are supported by "
                        "railyard-node-agent");
  }
  bool secret = vf.contains("secretKeyRef");
  const auto& ref = secret ? vf["secretKeyRef"] : vf["configMapKeyRef"];
  bool optional = ref.value("optional", false);
  std::string obj = str_at(ref, "name");
  std::string k = str_at(ref, "key");
  auto data = fetch_ref(p, secret ? RefKind::Secret : RefKind::ConfigMap, obj, optional,
                        where + ".valueFrom." + (secret ? "secretKeyRef" : "configMapKeyRef"));
  if (!data) return std::nullopt;
  if (auto it = data->find(k); it != data->end()) return it->second;
  if (optional) return std::nullopt;
  throw PlanError("CreateContainerConfigError", false,
                  "pod " + p.key + ": " + where + ": key \"" + k + "\" not found in " +
                      (secret ? "secret " : "configmap ") + p.ns + "/" + obj);
}

// containers[0].env, in order: a value expands the pod's variables set before it.
void apply_env(const PodRefs& p, const nlohmann::json& c, EnvBuilder& env) {
  auto env_list = c.value("env", nlohmann::json::array());
  for (size_t i = 0; i < env_list.size(); ++i) {
    const auto& e = env_list[i];
    std::string name = str_at(e, "name");
    std::string where = "containers[0].env[" + std::to_string(i) + "] (" + name + ")";
    if (name.empty())
      throw PlanError("CreateContainerConfigError", true, "pod " + p.key + ": " + where + " has no name");
    if (!e.contains("valueFrom")) {
      env.set_pod_var(name, expand_vars(str_at(e, "value"), env.pod_vars));
      continue;
    }
    if (auto value = value_from(p, e["valueFrom"], where)) env.set_pod_var(name, *value);
  }
}

}  // namespace

LaunchPlan build_launch_plan(const nlohmann::json& pod, const PodContext& ctx, const RefLookup& lookup,
                             const std::vector<std::pair<std::string, std::string>>& base_env) {
  const auto md = pod.value("metadata", nlohmann::json::object());
  const PodRefs p{pod, ctx, lookup, pod_key(pod), str_at(md, "namespace")};
  const auto spec = pod.value("spec", nlohmann::json::object());
  auto containers = spec.value("containers", nlohmann::json::array());
  if (!containers.is_array() || containers.empty()) {
    throw PlanError("NoCommand", true, "pod " + p.key + ": spec.containers is empty");
  }
  const auto& c = containers[0];
  LaunchPlan plan;
  place_container(plan, c, md, ctx, p.ns);

  auto command = c.value("command", nlohmann::json::array());
  if (!command.is_array() || command.empty()) {
    throw PlanError("NoCommand", true,
                    "pod " + p.key + ": container " + plan.container_name +
                        " has no command: railyard-node-agent runs spec.containers[0].command (+args) as a local "
                        "process and does not run images; set command");
  }

  EnvBuilder env;
  for (const auto& [k, v] : base_env) env.set(k, v);
  env.set("HOSTNAME", str_at(md, "name"));
  env.set("RAILYARD_POD_IP", ctx.pod_ip);
  env.set("RAILYARD_NODE_NAME", ctx.node_name);
  apply_env_from(p, c, env);
  apply_env(p, c, env);
  plan.env = std::move(env.env);

  for (const auto& a : command)
    plan.argv.push_back(expand_vars(a.is_string() ? a.get<std::string>() : a.dump(), env.pod_vars));
  for (const auto& a : c.value("args", nlohmann::json::array())) {
    plan.argv.push_back(expand_vars(a.is_string() ? a.get<std::string>() : a.dump(), env.pod_vars));
  }
  return plan;
}

}  // namespace railyard::node_agent
