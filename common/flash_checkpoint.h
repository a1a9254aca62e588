// Flash checkpoints for programs (docs/programs.md "Flash checkpoints"): the environment through which the operator
// and the agent configure the Python module worker/agent/python/railyard_flash.py, which the agent delivers to every
// program rank. The module names the same variables (ENV_* at its top); unit_rank_env checks that each name here
// appears in the module's text, so the two cannot drift apart.
#pragma once

namespace railyard::flash {

// Set by the operator on program pods (the job's ConfigMap), read by the module.
inline constexpr const char* kCheckpointDirEnv = "RAILYARD_CHECKPOINT_DIR";                     // spec.checkpoint.path
inline constexpr const char* kIntervalEnv = "RAILYARD_CHECKPOINT_INTERVAL_STEPS";               // .intervalSteps
inline constexpr const char* kMemoryIntervalEnv = "RAILYARD_CHECKPOINT_MEMORY_INTERVAL_STEPS";  // .memoryIntervalSteps
inline constexpr const char* kKeepEnv = "RAILYARD_CHECKPOINT_KEEP";                             // .keep

// Set by the agent per rank (worker/agent/rank_env.cc), read by the module: the in-memory tier's segment prefix
// (slots <prefix>-r<rank>-a|b), the steps fetched from a peer, and the generation (1: start fresh).
inline constexpr const char* kShmPrefixEnv = "RAILYARD_SHM_PREFIX";
inline constexpr const char* kPeerStepsEnv = "RAILYARD_SHM_PEER_STEPS";
inline constexpr const char* kGenerationEnv = "RAILYARD_GENERATION";

// The module's file name, in the folder the agent prepends to the ranks' PYTHONPATH.
inline constexpr const char* kModuleFile = "railyard_flash.py";

}  // namespace railyard::flash
