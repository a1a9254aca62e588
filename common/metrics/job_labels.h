// The labels that name a TrainingJob on every per-job series (docs/monitor.md "metric contract"): set by the worker,
// the agent and the operator, read by railyard-monitor, the alert rules and the dashboards.
#pragma once

namespace railyard::metrics {

inline constexpr const char* kNamespaceLabel = "namespace";
// The TrainingJob's name. Not `job`: Prometheus gives every series the scrape job's name as `job`, and under
// honorLabels a target's own `job` would overwrite it (and Prometheus' `up` would lose it).
inline constexpr const char* kTrainingJobLabel = "trainingjob";

}  // namespace railyard::metrics
