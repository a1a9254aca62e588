// Status bookkeeping: conditions with stable lastTransitionTime, and deciding whether a write is needed.
#pragma once

#include <optional>
#include <string>

#include "operator/api.h"

namespace railyard::op {

// Sets (or adds) a condition. lastTransitionTime changes only when the status value flips; reason and message are
// updated in place. Returns true when anything changed.
bool set_condition(Json& status, const std::string& type, bool value, const std::string& reason,
                   const std::string& message, const std::string& now);
// Stamps every condition with the status's observedGeneration (the spec generation this status, conditions included,
// was computed from), as metav1.Condition's observedGeneration says; Controller::write_status calls it on every
// write. No-op without status.observedGeneration.
void stamp_conditions(Json& status);
std::optional<Json> find_condition(const Json& status, const std::string& type);
bool condition_true(const Json& status, const std::string& type);

// True when a status write would change anything (semantic equality of the JSON values).
inline bool status_differs(const Json& before, const Json& after) { return before != after; }

}  // namespace railyard::op
