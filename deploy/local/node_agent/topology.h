// Simulated GPU cluster layout: a topology file (or --nodes N) becomes the Node objects the agent registers.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace railyard::node_agent {

// Units are groups of nodes sharing the same leaf switches per rail (a "rail-optimised" scalable unit);
// leaves hang off spines. See docs/node-agent.md for the file format.
struct Topology {
  std::string gpu_type = "H100";
  int gpus_per_node = 8;
  int nodes_per_unit = 2;
  int units_per_leaf = 2;
  int leaves_per_spine = 2;
  int units = 2;
  int max_nodes = 0;  // 0: units * nodes_per_unit; otherwise the first max_nodes nodes
  std::string cpu = "32";
  std::string memory = "256Gi";
  int pods = 110;
  std::string name_prefix = "rynode";
};

struct SimNode {
  std::string name;
  int unit = 0;
  int index_in_unit = 0;
  int leaf = 0;
  int spine = 0;
};

// Parses YAML text; `source` names the file in error messages. Throws ConfigError naming the field.
Topology parse_topology(const std::string& yaml_text, const std::string& source);
Topology load_topology_file(const std::string& path);
// The built-in layout (8 x H100 per node, 2 nodes per unit, ...) truncated to n nodes.
Topology default_topology(int n);

std::vector<SimNode> expand_nodes(const Topology& t);
// A complete v1 Node (metadata, spec, status with capacity/allocatable/conditions/addresses/nodeInfo); `now` is
// an RFC 3339 time for the condition timestamps.
nlohmann::json node_object(const Topology& t, const SimNode& n, const std::string& now);
// The node conditions a healthy kubelet reports (Ready=True plus the pressure conditions False).
nlohmann::json node_conditions(const std::string& now);
// Labels alone (used to update an existing node idempotently).
nlohmann::json node_labels(const Topology& t, const SimNode& n);

// Kubernetes quantity syntax ("32", "500m", "256Gi", "1e3"), used to validate cpu/memory.
bool is_quantity(const std::string& s);
// RFC 1123 label ("rynode", "a-1"), used for names and name prefixes.
bool is_dns_label(const std::string& s);

}  // namespace railyard::node_agent
