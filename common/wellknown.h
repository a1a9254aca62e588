// Labels and annotations that cross a component boundary: the operator writes them on worker pods and reads them
// back, railyard-monitor selects and scrapes pods by them, a platform team puts the node labels on its nodes for the
// placement, the planner's inventory and the job's status. One definition each, used by every side (docs/scheduler.md
// lists the node labels, docs/operator.md the pod labels).
#pragma once

namespace railyard::wellknown {

// --- On every worker pod (operator/controller/pod_builder.cc).
inline constexpr const char* kJobLabel = "railyard.dev/job";  // the TrainingJob's name: selector of its pods
inline constexpr const char* kReplicaIndexLabel = "railyard.dev/replica-index";
inline constexpr const char* kGenerationLabel = "railyard.dev/generation";
// The port of the pod's first metrics endpoint (rank i's at port + i): railyard-monitor's embedded scrapes read it.
inline constexpr const char* kMetricsPortAnnotation = "railyard.dev/metrics-port";

// --- On nodes, set by the platform (docs/scheduler.md "Topology labels").
inline constexpr const char* kRailsLabel = "railyard.dev/rails";  // rails per node (else its nvidia.com/gpu)
inline constexpr const char* kUnitLabel = "railyard.dev/unit";    // the scalable unit (one leaf switch group)
inline constexpr const char* kLeafLabel = "railyard.dev/leaf";
inline constexpr const char* kSpineLabel = "railyard.dev/spine";
inline constexpr const char* kGpuTypeLabel = "railyard.dev/gpu-type";

// Node annotation: the node's InfiniBand/RoCE HCAs in rail order, comma separated ("mlx5_0,mlx5_1,...": rail i's NIC
// at position i; NCCL's "name:port" form is allowed). Default when absent: mlx5_0 ... mlx5_{R-1}, R = node_rails().
// An annotation, not a label: label values cannot hold commas.
inline constexpr const char* kRailHcasAnnotation = "railyard.dev/rail-hcas";
// Node annotation (optional): the interface NCCL's bootstrap and socket transport should use (NCCL_SOCKET_IFNAME).
inline constexpr const char* kSocketIfnameAnnotation = "railyard.dev/nccl-socket-ifname";

}  // namespace railyard::wellknown
