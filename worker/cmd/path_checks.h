// The platform's roots for the worker's paths (the operator's --data-root / --checkpoint-root, as flags or the
// variables it sets).
#pragma once

#include "worker/cmd/train_options.h"

namespace railyard::worker {

// The operator refuses specs that leave the roots lexically; here the paths are resolved on this pod's filesystem,
// so a symlink out of a root is caught too: --data/--val-data and every shard they match, --ckpt-dir, --resume PATH,
// --export under their root, --init-from under either. ConfigError (exit 2) naming the flag, the config field and the
// root.
void enforce_path_roots(const TrainOptions& o);

}  // namespace railyard::worker
