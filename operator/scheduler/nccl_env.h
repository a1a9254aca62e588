// Rail-aligned NCCL settings for worker pods on GPU nodes (issue #11; docs/scheduler.md "NCCL settings").
// A pod's env is fixed when it is created, before it has a node; the node's values travel as pod annotations set by
// the Binding (the API server copies a Binding's annotations onto the pod together with spec.nodeName), and the
// env reads them through the downward API when the container starts. Pure: no API calls.
#pragma once

#include <string>
#include <vector>

#include "common/wellknown.h"
#include "operator/scheduler/placement.h"

namespace railyard::op {

// Pod annotations the Binding sets, read by the env below.
inline constexpr const char* kPodIbHcaAnnotation = "railyard.dev/nccl-ib-hca";
inline constexpr const char* kPodSocketIfnameAnnotation = "railyard.dev/nccl-socket-ifname";

// Rails of a node: the railyard.dev/rails label when it is a positive integer, else nvidia.com/gpu allocatable, at
// least 1. (operator/scheduler's Topology uses the same rule.)
int node_rails(const NodeInfo& node);

struct RailHcas {
  std::vector<std::string> hcas;  // in rail order; empty when `error` is set
  bool from_annotation = false;
  std::string error;  // names the node, the annotation and the fix
};
// The node's HCAs in rail order: wellknown::kRailHcasAnnotation when present (it must list exactly node_rails() valid
// names), else the default mlx5_0 ... mlx5_{R-1}.
RailHcas rail_hcas(const NodeInfo& node);

// NCCL_IB_HCA's value: "=" (exact names: mlx5_1 must not also match mlx5_10) and the HCAs in rail order, so local
// rank i, which uses GPU i, finds the NIC of rail i at position i.
std::string nccl_ib_hca(const std::vector<std::string>& hcas);

// The pod annotations a Binding of a GPU worker pod to `node` carries: kPodIbHcaAnnotation always (empty when the
// node's annotation is invalid: NCCL then picks HCAs itself), kPodSocketIfnameAnnotation when the node names one.
// `warning` gets rail_hcas()'s error, for an event.
Json nccl_binding_annotations(const NodeInfo& node, std::string* warning);

// The env entries of a GPU worker pod: NCCL_CROSS_NIC=0 (rings stay on one rail), NCCL_IB_HCA and
// NCCL_SOCKET_IFNAME from the pod annotations above (downward API; an annotation that is not there reads as empty,
// and the agent drops empty NCCL_* variables before starting the workers, so NCCL keeps its own default).
Json nccl_pod_env();

}  // namespace railyard::op
