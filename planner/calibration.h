// Calibration files (device profiles, deploy/planner/*.yaml) and cluster topology files
// (deploy/local/topologies/*.yaml) for the planner. Format: docs/planner.md.
#pragma once

#include <string>
#include <vector>

#include "planner/cost_model.h"

namespace railyard::plan {

// Parses a profile: every field of DeviceProfile as `key: {value: V, source: "..."}`. Throws ConfigError naming
// the origin and the field.
DeviceProfile parse_profile(const std::string& yaml_text, const std::string& origin);
DeviceProfile load_profile(const std::string& path);

// The profiles compiled in from deploy/planner/ ("a100-80gb", "h100-sxm", "h200", "cpu"), looked up by name or alias
// (a100, h100, h200, cpu; case-insensitive). Throws ConfigError listing the known names.
DeviceProfile builtin_profile(const std::string& name);
std::vector<std::string> builtin_profile_names();

// Writes a profile in the same format (the `railyard plan --calibrate` output).
std::string profile_to_yaml(const DeviceProfile& p, const std::string& header_comment);

// Parses a topology file (gpuType, gpusPerNode, nodesPerUnit, unitsPerLeaf, leavesPerSpine, units, nodes, and the
// optional leafBandwidthFactor / spineBandwidthFactor). Throws ConfigError naming the file and the key.
Topology parse_topology(const std::string& yaml_text, const std::string& origin);
Topology load_topology(const std::string& path);

}  // namespace railyard::plan
