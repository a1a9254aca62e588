#include "worker/agent/agent_metrics.h"

#include "common/metrics/job_labels.h"

namespace railyard::worker {

AgentMetrics::AgentMetrics(const AgentConfig& c)
    : labels{{metrics::kNamespaceLabel, c.ns}, {metrics::kTrainingJobLabel, c.job}, {"pod", c.pod}, {"node", c.node}},
      generation(
          registry.gauge("railyard_agent_generation", "Generation this agent's workers run in (0: none).").add(labels)),
      generations(registry
                      .counter("railyard_agent_generations_total",
                               "Generations this agent joined; every one after the first is an in-place restart.")
                      .add(labels)),
      rendezvous_wait(registry
                          .histogram("railyard_agent_rendezvous_wait_seconds",
                                     "From the first join request of a round to the assignment.",
                                     metrics::exponential_buckets(0.05, 2, 14))
                          .add(labels)),
      worker_starts(
          registry.counter("railyard_agent_worker_starts_total", "Worker processes this agent started.").add(labels)),
      worker_exits(registry.counter("railyard_agent_worker_exits_total",
                                    "Worker process exits by outcome (succeeded, failed, signaled).")),
      unreachable(registry
                      .counter("railyard_agent_rendezvous_errors_total",
                               "Requests to the rendezvous service that failed (unreachable, 5xx).")
                      .add(labels)),
      peer_copy_seconds(registry
                            .histogram("railyard_agent_peer_copy_seconds",
                                       "Time to send one in-memory snapshot slot to the peer pod (off the training "
                                       "path).",
                                       metrics::exponential_buckets(0.001, 2, 16))
                            .add(labels)),
      peer_copy_bytes(
          registry.counter("railyard_agent_peer_copy_bytes_total", "Bytes of snapshot slots sent to the peer pod.")
              .add(labels)),
      peer_copy_errors(registry
                           .counter("railyard_agent_peer_copy_errors_total",
                                    "Peer copies that failed (peer unreachable or refusing, slot overwritten while "
                                    "sent); each is retried.")
                           .add(labels)) {
  for (const char* outcome : {"succeeded", "failed", "signaled"}) worker_exits.add(with_outcome(outcome));
  if (c.metrics_port >= 0) exposer = std::make_unique<metrics::Exposer>(registry, c.pod_ip, c.metrics_port);
}

metrics::Labels AgentMetrics::with_outcome(const char* outcome) const {
  metrics::Labels l = labels;
  l["outcome"] = outcome;
  return l;
}

}  // namespace railyard::worker
