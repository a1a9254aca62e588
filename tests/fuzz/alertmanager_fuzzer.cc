// Alertmanager webhook bodies (monitor/alertmanager.h): whatever reaches the monitor's receiver. Bad payloads are a
// railyard::Error (answered 400); anything else is a finding.
#include <cstdint>

#include "common/error.h"
#include "monitor/alertmanager.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto payload = railyard::monitor::parse_alertmanager_payload(railyard::fuzz::as_string(data, size));
    for (const auto& alert : payload.alerts) (void)alert.label("trainingjob");
  } catch (const railyard::Error&) {
  }
  return 0;
}
