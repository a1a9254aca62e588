// TrainingJob decoding and validation (common/job_spec.h): any JSON object the API server could hand
// the operator. parse_job promises never to throw; a spec it accepts must be usable by everything downstream.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "operator/api.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using railyard::op::Json;
  Json job = Json::parse(railyard::fuzz::as_string(data, size), nullptr, /*allow_exceptions=*/false);
  if (job.is_discarded()) return 0;
  railyard::op::ParsedJob parsed = railyard::op::parse_job(job);
  if (parsed.violation) {
    // A refusal must say which field and how to fix it.
    if (parsed.violation->field.empty() || parsed.violation->reason.empty() || parsed.violation->message.empty()) {
      __builtin_trap();
    }
    return 0;
  }
  const railyard::op::JobSpec& spec = parsed.spec;
  railyard::op::WorldLayout layout = railyard::op::world_layout(spec, spec.replicas);
  if (layout.size <= 0) __builtin_trap();
  for (int available : {0, 1, spec.replicas - 1, spec.replicas, spec.replicas + 1}) {
    int replicas = railyard::op::elastic_world_replicas(spec, available);
    if (replicas < 0 || replicas > spec.replicas) __builtin_trap();
    if (replicas > 0) (void)railyard::op::world_layout(spec, replicas);
  }
  // The worker configuration survives the wire: what the worker parses is what the operator built.
  const railyard::WorkerConfig config = railyard::op::resolved_config(spec, spec.replicas);
  if (railyard::parse_worker_config(railyard::to_json(config)) != config) __builtin_trap();
  return 0;
}
