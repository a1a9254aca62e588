// The agent's own series (docs/rendezvous.md "Agent metrics"). Labels namespace, job, pod, node: bounded by the job's
// pods. Served only when RAILYARD_AGENT_METRICS_PORT is set, on the pod IP like the worker's metrics.
#pragma once

#include <memory>

#include "common/metrics/metrics.h"
#include "worker/agent/agent_config.h"

namespace railyard::worker {

struct AgentMetrics {
  metrics::Registry registry;
  metrics::Labels labels;
  metrics::Gauge& generation;
  metrics::Counter& generations;
  metrics::Histogram& rendezvous_wait;
  metrics::Counter& worker_starts;
  metrics::Family<metrics::Counter>& worker_exits;
  metrics::Counter& unreachable;
  metrics::Histogram& peer_copy_seconds;
  metrics::Counter& peer_copy_bytes;
  metrics::Counter& peer_copy_errors;
  std::unique_ptr<metrics::Exposer> exposer;  // null unless config.metrics_port >= 0

  // Registers every series (each worker exit outcome at 0, so a rate() has a start) and, when asked, serves them.
  // Throws what metrics::Exposer throws when the metrics port cannot be served.
  explicit AgentMetrics(const AgentConfig& c);

  // labels plus outcome (succeeded, failed, signaled): the series of worker_exits.
  metrics::Labels with_outcome(const char* outcome) const;
};

}  // namespace railyard::worker
