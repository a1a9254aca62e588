// Rendezvous request bodies (common/rendezvous_protocol.h) parsed the way RendezvousService does (JSON, then the
// typed parser), plus the agent's parse of an assignment. Bad input is a ProtocolError (answered 400); any other
// exception would surface as a 500 and is a finding.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/rendezvous_protocol.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

template <typename Parse>
void try_parse(Parse parse, const nlohmann::json& body) {
  try {
    (void)parse(body);
  } catch (const railyard::rdzv::ProtocolError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json body = nlohmann::json::parse(railyard::fuzz::as_string(data, size), nullptr, false);
  if (body.is_discarded()) return 0;
  namespace rdzv = railyard::rdzv;
  try_parse(rdzv::parse_join_request, body);
  try_parse(rdzv::parse_status_request, body);
  try_parse(rdzv::parse_exit_report, body);
  try_parse(rdzv::parse_progress_report, body);
  try_parse(rdzv::parse_assignment, body);
  return 0;
}
