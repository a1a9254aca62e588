// The platform's roots for the worker's paths (the operator's --data-root / --checkpoint-root, as env or flags).
#pragma once

#include "worker/cmd/config_file.h"
#include "worker/cmd/flags.h"

namespace railyard::worker {

// The operator refuses specs that leave the roots lexically; here the paths are resolved on this pod's filesystem,
// so a symlink out of a root is caught too: --data/--val-data and every shard they match, --ckpt-dir, --resume PATH,
// --export under their root, --init-from under either. ConfigError (exit 2) naming the flag, the config field and the
// root.
void enforce_path_roots(const Flags& f, const ConfigOrigins& origins);

}  // namespace railyard::worker
