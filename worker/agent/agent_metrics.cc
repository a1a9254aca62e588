#include "worker/agent/agent_metrics.h"

#include "common/metrics/job_labels.h"

namespace railyard::worker {

AgentMetrics::AgentMetrics(const AgentConfig& c)
    : labels{{metrics::kNamespaceLabel, c.ns}, {metrics::kTrainingJobLabel, c.job}, {"pod", c.pod}, {"node", c.node}},
      generation(registry.gauge(metrics::names::kAgentGeneration, "Generation this agent's workers run in (0: none).")
                     .add(labels)),
      generations(registry
                      .counter(metrics::names::kAgentGenerationsTotal,
                               "Generations this agent joined; every one after the first is an in-place restart.")
                      .add(labels)),
      rendezvous_wait(registry
                          .histogram(metrics::names::kAgentRendezvousWaitSeconds,
                                     "From the first join request of a round to the assignment.",
                                     metrics::exponential_buckets(0.05, 2, 14))
                          .add(labels)),
      worker_starts(registry.counter(metrics::names::kAgentWorkerStartsTotal, "Worker processes this agent started.")
                        .add(labels)),
      worker_exits(registry.counter(metrics::names::kAgentWorkerExitsTotal,
                                    "Worker process exits by outcome (succeeded, failed, signaled).")),
      unreachable(registry
                      .counter(metrics::names::kAgentRendezvousErrorsTotal,
                               "Requests to the rendezvous service that failed (unreachable, 5xx).")
                      .add(labels)),
      peer_copy_seconds(registry
                            .histogram(metrics::names::kAgentPeerCopySeconds,
                                       "Time to send one in-memory snapshot slot to the peer pod (off the training "
                                       "path).",
                                       metrics::exponential_buckets(0.001, 2, 16))
                            .add(labels)),
      peer_copy_bytes(
          registry.counter(metrics::names::kAgentPeerCopyBytesTotal, "Bytes of snapshot slots sent to the peer pod.")
              .add(labels)),
      peer_copy_errors(registry
                           .counter(metrics::names::kAgentPeerCopyErrorsTotal,
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
