#include "operator/scheduler/nccl_env.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "common/wellknown.h"

namespace railyard::op {

namespace {

// HCA device names (mlx5_0, ibp12s0, bnxt_re0) with an optional ":port".
bool valid_hca(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  const size_t colon = s.find(':');
  const std::string name = s.substr(0, colon);
  if (name.empty()) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  if (colon == std::string::npos) return true;
  const std::string port = s.substr(colon + 1);
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  return !port.empty() && ec == std::errc() && end == port.data() + port.size() && p >= 1;
}

}  // namespace

int node_rails(const NodeInfo& node) {
  int rails = 0;
  if (auto it = node.labels.find(wellknown::kRailsLabel); it != node.labels.end()) {
    const std::string& v = it->second;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), rails);
    if (ec != std::errc() || end != v.data() + v.size()) rails = 0;
  }
  if (rails <= 0) rails = static_cast<int>(std::max<int64_t>(1, node.gpu_allocatable));
  return rails;
}

RailHcas rail_hcas(const NodeInfo& node) {
  RailHcas out;
  const int rails = node_rails(node);
  if (node.rail_hcas.empty()) {
    for (int i = 0; i < rails; ++i) out.hcas.push_back("mlx5_" + std::to_string(i));
    return out;
  }
  out.from_annotation = true;
  std::vector<std::string> names;
  size_t start = 0;
  for (;;) {
    const size_t comma = node.rail_hcas.find(',', start);
    names.push_back(node.rail_hcas.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const std::string where =
      "node " + node.name + ": annotation " + wellknown::kRailHcasAnnotation + "='" + node.rail_hcas + "'";
  for (const auto& n : names)
    if (!valid_hca(n)) {
      out.error = where + ": '" + n +
                  "' is not an HCA name (letters, digits, '_', '-', '.', optionally ':port'); write the node's HCAs "
                  "in rail order, e.g. mlx5_0,mlx5_1";
      return out;
    }
  if (static_cast<int>(names.size()) != rails) {
    out.error = where + ": lists " + std::to_string(names.size()) + " HCAs but the node has " + std::to_string(rails) +
                " rails (label " + wellknown::kRailsLabel +
                ", else its nvidia.com/gpu): list one HCA per rail, in rail order";
    return out;
  }
  out.hcas = std::move(names);
  return out;
}

std::string nccl_ib_hca(const std::vector<std::string>& hcas) {
  if (hcas.empty()) return "";
  std::string out = "=";
  for (size_t i = 0; i < hcas.size(); ++i) out += (i ? "," : "") + hcas[i];
  return out;
}

Json nccl_binding_annotations(const NodeInfo& node, std::string* warning) {
  RailHcas h = rail_hcas(node);
  if (!h.error.empty() && warning != nullptr) *warning = h.error;
  Json out = {{kPodIbHcaAnnotation, nccl_ib_hca(h.hcas)}};
  if (!node.socket_ifname.empty()) out[kPodSocketIfnameAnnotation] = node.socket_ifname;
  return out;
}

Json nccl_pod_env() {
  auto from_annotation = [](const char* env, const char* annotation) {
    return Json{{"name", env},
                {"valueFrom",
                 {{"fieldRef",
                   {{"apiVersion", "v1"}, {"fieldPath", std::string("metadata.annotations['") + annotation + "']"}}}}}};
  };
  return Json::array({{{"name", "NCCL_CROSS_NIC"}, {"value", "0"}},
                      from_annotation("NCCL_IB_HCA", kPodIbHcaAnnotation),
                      from_annotation("NCCL_SOCKET_IFNAME", kPodSocketIfnameAnnotation)});
}

}  // namespace railyard::op
