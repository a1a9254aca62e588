// Which series may speak for which TrainingJob and rank (issue #40: metrics cannot be spoofed across jobs).
//
// A pod's exposition is the pod's word, and any pod can write anything there, e.g.
// railyard_worker_nonfinite_total{namespace="B",trainingjob="v",rank="0"}. So the labels that name the job, the pod
// and the node are the scrape target's: Prometheus sets them from the pod's Kubernetes metadata with honor_labels
// false (a served `namespace` becomes `exported_namespace` and cannot override), and the embedded scraper sets them
// from the Pod object. Only the rank (and generation) come from the process itself: ranks change per generation
// without a pod change, and a pod's position in the world is not in its metadata. Attributor therefore checks every
// served rank against the job's world (status.world.pods x spec.procsPerReplica): a pod speaks only for its own ranks.
// Pure logic, unit-tested in tests/unit/monitor/attribution_test.cc; docs/monitor.md "Who may speak for a job".
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "monitor/rules.h"
#include "monitor/samples.h"

namespace railyard::monitor {

// The target label that names the worker pod (Prometheus' and prometheus-operator's name for it).
inline constexpr const char* kPodLabel = "pod";

// The pods of a job's current world, in rank order, and the ranks each runs.
struct JobWorld {
  std::vector<std::string> pods;  // pod i runs global ranks [i * procs_per_pod, (i + 1) * procs_per_pod)
  int procs_per_pod = 1;
  std::map<std::string, int> index;  // pod -> position (world_of fills it: thousands of pods x series per round)
  // The ranks of `pod`: [first, last); nullopt when the pod is not in the world.
  std::optional<std::pair<int, int>> ranks_of(const std::string& pod) const;
};

// status.world.pods (the operator's rendezvous order), else "<name>-worker-<i>" for i < spec.replicas (a job the
// operator has not started a world for yet; the order the operator uses then); procs from spec.procsPerReplica.
JobWorld world_of(const nlohmann::json& job);

class Attributor {
 public:
  struct Result {
    std::vector<Sample> kept;
    size_t rejected = 0;
    std::vector<std::string> notes;  // why, for the first few rejected (one per target)
  };
  // Keeps the samples whose target labels (namespace, trainingjob, pod) name a job of `worlds` and a pod of its
  // world, and whose rank is one of that pod's. An `up` sample without a rank label (the target is down, or served
  // nothing) gets the rank its target (`instance`) last served here; without one it is dropped (nothing to blame).
  // Samples without a trainingjob label are not a worker's and are dropped without counting.
  Result attribute(const std::vector<Sample>& samples, const std::map<JobKey, JobWorld>& worlds);

 private:
  std::map<std::string, int> instance_rank_;  // "ns/job instance" -> the rank it served last
};

}  // namespace railyard::monitor
