// Prometheus text exposition (monitor/samples.h: parse_text_format): what the embedded monitor scrapes from
// workers' /metrics. Malformed text is a railyard::Error naming the line.
#include <cstdint>

#include "common/error.h"
#include "monitor/samples.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)railyard::monitor::parse_text_format(railyard::fuzz::as_string(data, size), "fuzz");
  } catch (const railyard::Error&) {
  }
  return 0;
}
