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

LaunchPlan build_launch_plan(const nlohmann::json& pod, const PodContext& ctx, const RefLookup& lookup,
                             const std::vector<std::pair<std::string, std::string>>& base_env) {
  const std::string key = pod_key(pod);
  const auto md = pod.value("metadata", nlohmann::json::object());
  const std::string ns = str_at(md, "namespace");
  const auto spec = pod.value("spec", nlohmann::json::object());
  auto containers = spec.value("containers", nlohmann::json::array());
  if (!containers.is_array() || containers.empty()) {
    throw PlanError("NoCommand", true, "pod " + key + ": spec.containers is empty");
  }
  const auto& c = containers[0];
  LaunchPlan plan;
  plan.container_name = str_at(c, "name");
  if (plan.container_name.empty()) plan.container_name = "main";
  plan.pod_dir = ctx.state_dir + "/pods/" + ns + "_" + str_at(md, "name");
  plan.log_path = plan.pod_dir + "/" + plan.container_name + ".log";
  plan.working_dir = str_at(c, "workingDir");
  if (plan.working_dir.empty()) plan.working_dir = plan.pod_dir + "/work";

  auto command = c.value("command", nlohmann::json::array());
  if (!command.is_array() || command.empty()) {
    throw PlanError("NoCommand", true,
                    "pod " + key + ": container " + plan.container_name +
                        " has no command: railyard-node-agent runs spec.containers[0].command (+args) as a local "
                        "process and does not run images; set command");
  }

  // Later entries override earlier ones with the same name (like a container runtime), keeping first position.
  std::vector<std::pair<std::string, std::string>> env;
  std::map<std::string, std::string> vars;
  auto set = [&](const std::string& name, const std::string& value) {
    auto [it, inserted] = vars.insert_or_assign(name, value);
    (void)it;
    if (inserted) {
      env.emplace_back(name, value);
    } else {
      for (auto& e : env) {
        if (e.first == name) e.second = value;
      }
    }
  };
  for (const auto& [k, v] : base_env) set(k, v);
  set("HOSTNAME", str_at(md, "name"));
  set("RAILYARD_POD_IP", ctx.pod_ip);
  set("RAILYARD_NODE_NAME", ctx.node_name);
  // Only the pod's own variables are available to $(VAR) expansion, as in Kubernetes.
  std::map<std::string, std::string> pod_vars;

  auto fetch = [&](RefKind kind, const std::string& name, bool optional,
                   const std::string& what) -> std::optional<std::map<std::string, std::string>> {
    const char* kind_name = kind == RefKind::Secret ? "secret" : "configmap";
    std::optional<std::map<std::string, std::string>> data;
    try {
      data = lookup(kind, ns, name);
    } catch (const std::exception& e) {
      throw PlanError(
          "CreateContainerConfigError", false,
          "pod " + key + ": " + what + ": cannot read " + kind_name + " " + ns + "/" + name + ": " + e.what());
    }
    if (!data && !optional) {
      throw PlanError("CreateContainerConfigError", false,
                      "pod " + key + ": " + what + ": " + kind_name + " \"" + name + "\" not found in namespace " + ns +
                          ": create it or mark the reference optional");
    }
    return data;
  };

  auto env_from = c.value("envFrom", nlohmann::json::array());
  for (size_t i = 0; i < env_from.size(); ++i) {
    const auto& ef = env_from[i];
    std::string prefix = str_at(ef, "prefix");
    for (auto [field, kind] :
         {std::pair{"secretRef", RefKind::Secret}, std::pair{"configMapRef", RefKind::ConfigMap}}) {
      if (!ef.contains(field)) continue;
      const auto& ref = ef[field];
      auto data =
          fetch(kind, str_at(ref, "name"), ref.value("optional", false), "envFrom[" + std::to_string(i) + "]." + field);
      if (!data) continue;
      for (const auto& [k, v] : *data) {
        set(prefix + k, v);
        pod_vars[prefix + k] = v;
      }
    }
  }

  auto env_list = c.value("env", nlohmann::json::array());
  for (size_t i = 0; i < env_list.size(); ++i) {
    const auto& e = env_list[i];
    std::string name = str_at(e, "name");
    std::string where = "containers[0].env[" + std::to_string(i) + "] (" + name + ")";
    if (name.empty()) throw PlanError("CreateContainerConfigError", true, "pod " + key + ": " + where + " has no name");
    if (!e.contains("valueFrom")) {
      std::string value = expand_vars(str_at(e, "value"), pod_vars);
      set(name, value);
      pod_vars[name] = value;
      continue;
    }
    const auto& vf = e["valueFrom"];
    std::string value;
    bool skip = false;
    if (vf.contains("fieldRef")) {
      value = resolve_field_ref(pod, str_at(vf["fieldRef"], "fieldPath"), ctx);
    } else if (vf.contains("secretKeyRef") || vf.contains("configMapKeyRef")) {
      bool secret = vf.contains("secretKeyRef");
      const auto& ref = secret ? vf["secretKeyRef"] : vf["configMapKeyRef"];
      bool optional = ref.value("optional", false);
      std::string obj = str_at(ref, "name");
      std::string k = str_at(ref, "key");
      auto data = fetch(secret ? RefKind::Secret : RefKind::ConfigMap, obj, optional,
                        where + ".valueFrom." + (secret ? "secretKeyRef" : "configMapKeyRef"));
      if (!data) {
        skip = true;
      } else if (auto it = data->find(k); it != data->end()) {
        value = it->second;
      } else if (optional) {
        skip = true;
      } else {
        throw PlanError("CreateContainerConfigError", false,
                        "pod " + key + ": " + where + ": key \"" + k + "\" not found in " +
                            (secret ? "secret " : "configmap ") + ns + "/" + obj);
      }
    } else {
      throw PlanError("CreateContainerConfigError", true,
                      "pod " + key + ": " + where +
                          ".valueFrom: only fieldRef, secretKeyRef and configMapKeyRef are supported by "
                          "railyard-node-agent");
    }
    if (skip) continue;
    set(name, value);
    pod_vars[name] = value;
  }
  plan.env = std::move(env);

  for (const auto& a : command)
    plan.argv.push_back(expand_vars(a.is_string() ? a.get<std::string>() : a.dump(), pod_vars));
  for (const auto& a : c.value("args", nlohmann::json::array())) {
    plan.argv.push_back(expand_vars(a.is_string() ? a.get<std::string>() : a.dump(), pod_vars));
  }
  return plan;
}

}  // namespace railyard::node_agent
