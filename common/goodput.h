// The goodput ledger's causes (status.goodput.seconds, metric railyard_operator_job_seconds{cause}): written by the
// operator (operator/controller/goodput.h), read by `railyard report` and the Grafana dashboard. docs/observability.md
// "Where a job's time went" says what each covers.
#pragma once

#include <array>
#include <string_view>

namespace railyard::goodput {

struct Cause {
  std::string_view name;  // the key in status.goodput.seconds and the metric's `cause` label
  std::string_view what;  // for people (`railyard report`)
};

// In the order status, the metric and the report list them. `training` is the time kept; every other one is lost.
inline constexpr std::array<Cause, 11> kCauses = {{
    {"training", "training kept (the last step to Succeeded included)"},
    {"recomputing", "training again steps trained before a restart"},
    {"checkpointStall", "steps waiting for synchronous checkpoint saves (as the workers report it)"},
    {"detection", "a failed generation's last step to the restart decision"},
    {"scheduling", "pods created, bound and started, agents joining"},
    {"waitingForCapacity", "the gang did not fit the cluster"},
    {"rendezvousAndInit", "the world formed, before its first step (the restore apart)"},
    {"restore", "the checkpoint restore (as the workers report it)"},
    {"initializing", "spec.initializer preparing the data"},
    {"suspended", "runPolicy.suspend"},
    {"invalid", "the spec failed validation"},
}};

}  // namespace railyard::goodput
