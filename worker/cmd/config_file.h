// `railyard-worker train --config FILE`: the operator's resolved training config (docs/rendezvous.md, the agent
// writes it per generation) mapped onto the train command's flags, for every flag the command line did not give.
#pragma once

#include <map>
#include <string>

namespace railyard::worker {

// Which config field set a flag (messages name the TrainingJob's field, e.g. spec.data.train); "" = the command
// line or the environment.
struct ConfigOrigins {
  std::string data, val_data, init_from;
};

// How a flag is named in messages: "--data", or "spec.data.train (--config FILE)".
std::string flag_name(const std::string& flag, const std::string& origin, const std::map<std::string, std::string>& f);

// Maps a JSON training config (the operator's resolved config, docs/rendezvous.md) onto flags that were not given
// explicitly. The operator's globalBatch counts sequences; --global-batch counts tokens. Throws ConfigError naming
// --config and the field.
ConfigOrigins apply_config_file(const std::string& path, std::map<std::string, std::string>& f);

}  // namespace railyard::worker
