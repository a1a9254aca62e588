// The per-job headless Service (pure: no API calls): what gives a job's pods stable DNS names,
// <pod>.<job>.<namespace>.svc.<cluster domain> (docs/programs.md "Stable names", common/stable_names.h).
#pragma once

#include "operator/controller/pod_builder.h"

namespace railyard::op {

// The job's Service <job> (job_service_name), owned by the job (garbage-collected with it): clusterIP None (no
// virtual IP, no proxying: the DNS answers with the pods' own addresses), selector the job's label (every generation's
// pods), publishNotReadyAddresses true (a pod's name resolves as soon as it has an IP, before any readiness: the
// ranks bootstrap before anything could call them ready) and no ports (a headless Service needs none; the endpoints
// controller then lists the pods with their hostnames, which is what the DNS serves).
Json build_job_service(const Json& job);

}  // namespace railyard::op
