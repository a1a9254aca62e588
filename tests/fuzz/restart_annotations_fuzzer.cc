// The TrainingJob annotations a person or the monitor writes and the operator reads: railyard.dev/restart-request
// (common/restart_request.h parse_restart_request, hand-written values included) and railyard.dev/exclude-nodes
// (common/restart_request.h parse_node_list). Properties besides "no crash": a parsed request survives
// format -> parse unchanged (the operator writes requests back in that form), and a node list holds no blank or
// comma-bearing name.
#include <cstdint>
#include <string>

#include "common/restart_request.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = railyard::fuzz::as_string(data, size);
  if (auto r = railyard::parse_restart_request(text)) {
    auto again = railyard::parse_restart_request(railyard::format_restart_request(*r));
    if (!again || again->reason != r->reason || again->rule != r->rule || again->node != r->node ||
        again->evidence != r->evidence || again->detector != r->detector || again->source != r->source ||
        again->time != r->time || again->onset != r->onset || again->rank != r->rank ||
        again->generation != r->generation) {
      __builtin_trap();
    }
  }
  for (const auto& node : railyard::parse_node_list(text)) {
    if (node.empty() || node.find(',') != std::string::npos) __builtin_trap();
  }
  return 0;
}
