#include "deploy/local/node_agent/topology.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <regex>
#include <set>

#include "common/error.h"

namespace railyard::node_agent {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool is_label_value(const std::string& s) {
  static const std::regex re("^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$");
  return s.size() <= 63 && std::regex_match(s, re);
}

[[noreturn]] void fail(const std::string& source, const std::string& field, const std::string& what) {
  throw ConfigError("topology " + source + ": " + field + " " + what);
}

int read_int(const YAML::Node& v, const std::string& source, const std::string& field, int min, int max) {
  long long x = 0;
  try {
    x = v.as<long long>();
  } catch (const YAML::Exception&) {
    fail(source, field, "must be an integer between " + std::to_string(min) + " and " + std::to_string(max));
  }
  if (x < min || x > max) {
    fail(source, field,
         "is " + std::to_string(x) + ": must be between " + std::to_string(min) + " and " + std::to_string(max));
  }
  return static_cast<int>(x);
}

std::string read_string(const YAML::Node& v, const std::string& source, const std::string& field) {
  if (!v.IsScalar()) fail(source, field, "must be a string");
  return v.Scalar();
}

void validate(const Topology& t, const std::string& source) {
  if (!is_label_value(t.gpu_type) || t.gpu_type.empty()) {
    fail(source, "gpuType", "'" + t.gpu_type + "' is not a valid label value: use letters, digits, '-', '_' or '.'");
  }
  if (!is_quantity(t.cpu))
    fail(source, "cpu", "'" + t.cpu + "' is not a Kubernetes quantity (e.g. \"32\" or \"500m\")");
  if (!is_quantity(t.memory)) {
    fail(source, "memory", "'" + t.memory + "' is not a Kubernetes quantity (e.g. \"256Gi\")");
  }
  // The longest node name is "<prefix>-u<units-1>-n<nodesPerUnit-1>" and must stay a DNS label.
  std::string longest =
      t.name_prefix + "-u" + std::to_string(t.units - 1) + "-n" + std::to_string(t.nodes_per_unit - 1);
  if (!is_dns_label(t.name_prefix) || !is_dns_label(longest)) {
    fail(source, "namePrefix",
         "'" + t.name_prefix + "' is not usable: use lowercase letters, digits and '-', at most 50 characters");
  }
}

// Built with append: GCC 12 reports a false -Wrestrict on `"literal" + std::to_string(...)`.
std::string tag(const char* prefix, int n) { return std::string(prefix).append(std::to_string(n)); }

}  // namespace

bool is_quantity(const std::string& s) {
  static const std::regex re("^[+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$");
  return !s.empty() && std::regex_match(s, re);
}

bool is_dns_label(const std::string& s) {
  static const std::regex re("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
  return !s.empty() && s.size() <= 63 && std::regex_match(s, re);
}

Topology parse_topology(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("topology " + source + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap())
    throw ConfigError("topology " + source + ": must be a YAML mapping of fields (gpuType, units, ...)");
  Topology t;
  static const std::set<std::string> known = {"gpuType",        "gpusPerNode", "nodesPerUnit", "unitsPerLeaf",
                                              "leavesPerSpine", "units",       "nodes",        "cpu",
                                              "memory",         "pods",        "namePrefix"};
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    if (!known.count(key)) {
      fail(source, key,
           "is not a known field: use gpuType, gpusPerNode, nodesPerUnit, unitsPerLeaf, leavesPerSpine, units, nodes, "
           "cpu, memory, pods or namePrefix");
    }
    const YAML::Node& v = kv.second;
    if (key == "gpuType") t.gpu_type = read_string(v, source, key);
    if (key == "gpusPerNode") t.gpus_per_node = read_int(v, source, key, 0, 64);
    if (key == "nodesPerUnit") t.nodes_per_unit = read_int(v, source, key, 1, 1024);
    if (key == "unitsPerLeaf") t.units_per_leaf = read_int(v, source, key, 1, 1024);
    if (key == "leavesPerSpine") t.leaves_per_spine = read_int(v, source, key, 1, 1024);
    if (key == "units") t.units = read_int(v, source, key, 1, 4096);
    if (key == "nodes") t.max_nodes = read_int(v, source, key, 1, 100000);
    if (key == "cpu") t.cpu = read_string(v, source, key);
    if (key == "memory") t.memory = read_string(v, source, key);
    if (key == "pods") t.pods = read_int(v, source, key, 1, 10000);
    if (key == "namePrefix") t.name_prefix = read_string(v, source, key);
  }
  validate(t, source);
  if (t.max_nodes > t.units * t.nodes_per_unit) {
    fail(source, "nodes",
         "is " + std::to_string(t.max_nodes) + " but units * nodesPerUnit is only " +
             std::to_string(t.units * t.nodes_per_unit) + ": raise units or lower nodes");
  }
  return t;
}

Topology load_topology_file(const std::string& path) { return parse_topology(read_file(path, "topology file"), path); }

Topology default_topology(int n) {
  if (n < 1 || n > 10000) throw ConfigError("--nodes " + std::to_string(n) + ": must be between 1 and 10000");
  Topology t;
  t.units = (n + t.nodes_per_unit - 1) / t.nodes_per_unit;
  t.max_nodes = n;
  return t;
}

std::vector<SimNode> expand_nodes(const Topology& t) {
  std::vector<SimNode> out;
  int limit = t.max_nodes > 0 ? t.max_nodes : t.units * t.nodes_per_unit;
  for (int u = 0; u < t.units; ++u) {
    for (int i = 0; i < t.nodes_per_unit; ++i) {
      if (static_cast<int>(out.size()) >= limit) return out;
      SimNode n;
      n.name = t.name_prefix + "-u" + std::to_string(u) + "-n" + std::to_string(i);
      n.unit = u;
      n.index_in_unit = i;
      n.leaf = u / t.units_per_leaf;
      n.spine = n.leaf / t.leaves_per_spine;
      out.push_back(n);
    }
  }
  return out;
}

nlohmann::json node_labels(const Topology& t, const SimNode& n) {
  return {
      {"railyard.dev/simulated", "true"},
      {"railyard.dev/gpu-type", t.gpu_type},
      {"railyard.dev/unit", tag("u", n.unit)},
      {"railyard.dev/leaf", tag("leaf", n.leaf)},
      {"railyard.dev/spine", tag("spine", n.spine)},
      {"railyard.dev/rails", std::to_string(t.gpus_per_node)},
      {"kubernetes.io/hostname", n.name},
      {"kubernetes.io/os", "linux"},
      {"node.kubernetes.io/instance-type",
       std::string("sim-").append(lower(t.gpu_type)).append(tag("-", t.gpus_per_node)).append("gpu")},
  };
}

nlohmann::json node_conditions(const std::string& now) {
  auto cond = [&](const char* type, const char* status, const char* reason, const char* message) {
    return nlohmann::json{{"type", type},       {"status", status},         {"reason", reason},
                          {"message", message}, {"lastHeartbeatTime", now}, {"lastTransitionTime", now}};
  };
  return nlohmann::json::array({
      cond("Ready", "True", "KubeletReady", "railyard-node-agent is posting ready status"),
      cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "simulated node"),
      cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "simulated node"),
      cond("PIDPressure", "False", "KubeletHasSufficientPID", "simulated node"),
  });
}

nlohmann::json node_object(const Topology& t, const SimNode& n, const std::string& now) {
  nlohmann::json resources = {{"cpu", t.cpu},
                              {"memory", t.memory},
                              {"pods", std::to_string(t.pods)},
                              {"nvidia.com/gpu", std::to_string(t.gpus_per_node)}};
  return {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata", {{"name", n.name}, {"labels", node_labels(t, n)}}},
      {"spec", nlohmann::json::object()},
      {"status",
       {{"capacity", resources},
        {"allocatable", resources},
        {"conditions", node_conditions(now)},
        {"addresses",
         {{{"type", "InternalIP"}, {"address", "127.0.0.1"}}, {{"type", "Hostname"}, {"address", n.name}}}},
        {"nodeInfo",
         {{"machineID", n.name},
          {"systemUUID", n.name},
          {"bootID", n.name},
          {"kernelVersion", "simulated"},
          {"osImage", "railyard simulated node"},
          {"containerRuntimeVersion", "railyard-node-agent://0.1.0"},
          {"kubeletVersion", "v1.20.2-railyard-sim"},
          {"kubeProxyVersion", "v1.20.2-railyard-sim"},
          {"operatingSystem", "linux"},
          {"architecture", "amd64"}}}}},
  };
}

}  // namespace railyard::node_agent
