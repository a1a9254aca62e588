#include "operator/controller/gang_order.h"

#include <optional>
#include <tuple>

namespace railyard::op {

namespace {

const Json& at(const Json& j, const char* key) {
  static const Json null;
  if (!j.is_object()) return null;
  auto it = j.find(key);
  return it == j.end() ? null : *it;
}

std::string text(const Json& j) { return j.is_string() ? j.get<std::string>() : std::string(); }

// PriorityClass.value is an int32; anything else (a hostile or broken object) counts as 0.
int64_t class_value(const Json& pc) {
  const Json& v = at(pc, "value");
  if (!v.is_number_integer()) return 0;
  const int64_t x = v.get<int64_t>();
  return x < INT32_MIN || x > INT32_MAX ? 0 : x;
}

}  // namespace

bool goes_before(const GangOrder& a, const GangOrder& b) {
  return std::forward_as_tuple(-a.priority, a.created, a.key) < std::forward_as_tuple(-b.priority, b.created, b.key);
}

int64_t job_priority(const Json& job, const std::vector<const Json*>& classes) {
  const std::string name = text(at(at(at(at(job, "spec"), "template"), "spec"), "priorityClassName"));
  std::optional<int64_t> fallback;
  for (const Json* pc : classes) {
    if (!pc) continue;
    if (!name.empty()) {
      if (text(at(at(*pc, "metadata"), "name")) == name) return class_value(*pc);
    } else if (at(*pc, "globalDefault") == true) {
      const int64_t v = class_value(*pc);
      if (!fallback || v < *fallback) fallback = v;
    }
  }
  return name.empty() && fallback ? *fallback : 0;
}

GangOrder gang_order(const Json& job, const std::vector<const Json*>& classes) {
  const Json& meta = at(job, "metadata");
  return {job_priority(job, classes), text(at(meta, "creationTimestamp")),
          text(at(meta, "namespace")) + "/" + text(at(meta, "name"))};
}

bool waiting_gang(const Json& job) {
  if (at(at(job, "metadata"), "deletionTimestamp").is_string()) return false;
  if (at(at(at(job, "spec"), "runPolicy"), "suspend") == true) return false;
  const Json& status = at(job, "status");
  const std::string phase = text(at(status, "phase"));
  if (phase == "Succeeded" || phase == "Failed" || phase == "Suspended" || phase == "Invalid") return false;
  const Json& conditions = at(status, "conditions");
  if (conditions.is_array())
    for (const Json& c : conditions)
      if (text(at(c, "type")) == "Invalid" && text(at(c, "status")) == "True") return false;
  return true;
}

}  // namespace railyard::op
