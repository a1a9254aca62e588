// Prometheus instant-query responses (monitor/samples.h: parse_query_response): the JSON the monitor reads back
// from Prometheus. Malformed answers are a railyard::Error naming the JSON path.
#include <cstdint>

#include "common/error.h"
#include "monitor/samples.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)railyard::monitor::parse_query_response(railyard::fuzz::as_string(data, size), "fuzz");
  } catch (const railyard::Error&) {
  }
  return 0;
}
