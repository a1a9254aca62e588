#include "operator/controller/gang_order.h"

#include <optional>
#include <tuple>

#include "common/kube/client.h"

namespace railyard::op {

namespace {

std::string text(const Json& j) { return j.is_string() ? j.get<std::string>() : std::string(); }

// PriorityClass.value is an int32; anything else (a hostile or broken object) counts as 0.
int64_t class_value(const Json& pc) {
  const Json& v = kube::field(pc, "value");
  if (!v.is_number_integer()) return 0;
  const int64_t x = v.get<int64_t>();
  return x < INT32_MIN || x > INT32_MAX ? 0 : x;
}

}  // namespace

bool goes_before(const GangOrder& a, const GangOrder& b) {
  return std::forward_as_tuple(-a.priority, a.created, a.key) < std::forward_as_tuple(-b.priority, b.created, b.key);
}

int64_t job_priority(const Json& job, const std::vector<const Json*>& classes) {
  const std::string name =
      text(kube::field(kube::field(kube::field(kube::field(job, "spec"), "template"), "spec"), "priorityClassName"));
  std::optional<int64_t> fallback;
  for (const Json* pc : classes) {
    if (!pc) continue;
    if (!name.empty()) {
      if (text(kube::field(kube::field(*pc, "metadata"), "name")) == name) return class_value(*pc);
    } else if (kube::field(*pc, "globalDefault") == true) {
      const int64_t v = class_value(*pc);
      if (!fallback || v < *fallback) fallback = v;
    }
  }
  return name.empty() && fallback ? *fallback : 0;
}

GangOrder gang_order(const Json& job, const std::vector<const Json*>& classes) {
  const Json& meta = kube::field(job, "metadata");
  return {job_priority(job, classes), text(kube::field(meta, "creationTimestamp")),
          text(kube::field(meta, "namespace")) + "/" + text(kube::field(meta, "name"))};
}

bool waiting_gang(const Json& job) {
  if (kube::field(kube::field(job, "metadata"), "deletionTimestamp").is_string()) return false;
  if (kube::field(kube::field(kube::field(job, "spec"), "runPolicy"), "suspend") == true) return false;
  const Json& status = kube::field(job, "status");
  const std::string phase = text(kube::field(status, "phase"));
  if (phase == "Succeeded" || phase == "Failed" || phase == "Suspended" || phase == "Invalid") return false;
  const Json& conditions = kube::field(status, "conditions");
  if (conditions.is_array())
    for (const Json& c : conditions)
      if (text(kube::field(c, "type")) == "Invalid" && text(kube::field(c, "status")) == "True") return false;
  return true;
}

}  // namespace railyard::op
