// `railyard ckpt ...`: list, inspect, verify and reshard checkpoint directories. The railyard binary calls
// cli_main(argc - 1, argv + 1), so argv[0] is "ckpt" and argv[1] the command.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/layout.h"

namespace railyard::ckpt {

// Returns the process exit code: 0 ok, 1 a checkpoint problem (named on stderr), 2 bad usage.
int cli_main(int argc, char** argv);

// Writes a copy of step `step` of src_root into dst_root laid out for `to` (every target rank's shard written,
// replicas deduplicated, then committed like a normal save). Tensors are split by `rules`. Returns the manifest
// of the new checkpoint. Throws railyard::Error.
Manifest reshard_checkpoint(const std::string& src_root, int64_t step, const std::string& dst_root, const Layout& to,
                            const std::vector<SplitRule>& rules = gpt_rules());

}  // namespace railyard::ckpt
