// Kubernetes resource quantities from a TrainingJob or a node (operator/scheduler/placement.h parse_quantity_milli:
// "250m", "1.5", "512Mi", "1e9"): user-controlled text, parsed into thousandths with overflow to guard. Properties
// besides "no crash": a result is never negative for a quantity without a sign, and a plain integer N that fits
// parses to N * 1000.
#include <cstdint>
#include <string>

#include "operator/scheduler/placement.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string q = railyard::fuzz::as_string(data, size);
  const auto v = railyard::op::parse_quantity_milli(q);
  if (v && *v < 0 && q.find('-') == std::string::npos) __builtin_trap();
  if (!q.empty() && q.size() <= 12 && q.find_first_not_of("0123456789") == std::string::npos) {
    const int64_t n = std::stoll(q);
    if (!v || *v != n * 1000) __builtin_trap();
  }
  return 0;
}
