// `railyard-worker train --config FILE`: the operator's resolved training config (docs/rendezvous.md, the agent
// writes it per generation) onto every option the command line did not give.
#pragma once

#include "worker/cmd/train_options.h"

namespace railyard::worker {

// Reads o.config (a JSON worker configuration, common/worker_config.h) and sets every option whose flag is not in
// o.given; records the flags it set in o.configured and, for the paths, the TrainingJob field in o.origins. The
// operator's globalBatch counts sequences; the option counts tokens. Throws ConfigError naming --config and the field.
void apply_config_file(TrainOptions& o);

}  // namespace railyard::worker
