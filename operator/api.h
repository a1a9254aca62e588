// The operator reads and writes TrainingJobs in the API's own terms: the spec types and their parser live in
// common/job_spec.h (shared with railyard-monitor and the CLI) and are used unqualified inside railyard::op.
#pragma once

#include "common/job_spec.h"

namespace railyard::op {
using namespace railyard::api;  // NOLINT(google-build-using-namespace): the API's types are the operator's vocabulary
}  // namespace railyard::op
