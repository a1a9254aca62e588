#include "worker/cmd/path_checks.h"

#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/path_roots.h"
#include "common/pod_env.h"
#include "worker/data/data_loader.h"

namespace railyard::worker {

void enforce_path_roots(const Flags& f, const ConfigOrigins& origins) {
  auto root_of = [&](const char* flag, const char* env) -> std::pair<std::string, std::string> {
    if (auto it = f.find(flag); it != f.end() && !it->second.empty()) return {it->second, std::string("--") + flag};
    if (const char* v = std::getenv(env); v != nullptr && *v != '\0') return {v, env};
    return {"", ""};
  };
  const bool from_config = f.count("config") != 0;
  const auto [data_root, data_root_name] = root_of("data-root", pod_env::kDataRoot);
  const auto [ckpt_root, ckpt_root_name] = root_of("ckpt-root", pod_env::kCheckpointRoot);
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> checks;  // what, path, root, root name
  // Data sources are globs: the pattern itself (lexically and through its existing directories), and every file it
  // matches (a symlinked shard, or a directory a wildcard crosses, that leads out of the root); the validation shards
  // also when they are the default beside the training shards.
  if (auto it = f.find("data"); it != f.end()) {
    const auto val = f.find("val-data");
    const struct {
      std::string what, pattern;
      bool given;
    } sources[] = {
        {from_config && !origins.data.empty() ? "--data (" + origins.data + " of --config)" : "--data", it->second,
         true},
        {val != f.end() && from_config && !origins.val_data.empty()
             ? "--val-data (" + origins.val_data + " of --config)"
         : val != f.end() ? "--val-data"
                          : "--val-data (the default, beside --data)",
         val != f.end() ? shard_glob(val->second, "val_*.bin") : default_val_glob(it->second), val != f.end()}};
    for (const auto& src : sources) {
      if (src.given) checks.emplace_back(src.what, src.pattern, data_root, data_root_name);
      if (data_root.empty()) continue;
      std::vector<std::string> files;
      try {
        files = expand_shard_pattern(src.pattern);
      } catch (const ConfigError&) {
        // nothing matches: cmd_train says so, naming the field
      }
      for (const auto& file : files) checks.emplace_back(src.what + " shard", file, data_root, data_root_name);
    }
  }
  if (auto it = f.find("ckpt-dir"); it != f.end())
    checks.emplace_back(from_config ? "--ckpt-dir (checkpoint.path of --config)" : "--ckpt-dir", it->second, ckpt_root,
                        ckpt_root_name);
  if (auto it = f.find("resume"); it != f.end() && it->second != "auto" && it->second != "never")
    checks.emplace_back("--resume", it->second, ckpt_root, ckpt_root_name);
  // --export writes weights: an output like checkpoints.
  if (auto it = f.find("export"); it != f.end()) checks.emplace_back("--export", it->second, ckpt_root, ckpt_root_name);
  for (const auto& [what, path, root, root_name] : checks) {
    if (auto msg = paths::check_within(what, path, root, root_name, true)) throw ConfigError(*msg);
  }
  // --init-from reads weights: the model a job starts from is either input data or the export/checkpoint of an
  // earlier job, so either root may hold it; with roots set it must be under one of them.
  if (auto it = f.find("init-from"); it != f.end() && (!data_root.empty() || !ckpt_root.empty())) {
    auto in_data = paths::check_within("--init-from", it->second, data_root, data_root_name, true);
    auto in_ckpt = paths::check_within("--init-from", it->second, ckpt_root, ckpt_root_name, true);
    if ((data_root.empty() || in_data) && (ckpt_root.empty() || in_ckpt)) {
      const bool relative = it->second.empty() || it->second.front() != '/';
      if (data_root.empty() || ckpt_root.empty() || relative) throw ConfigError(in_data ? *in_data : *in_ckpt);
      const std::string resolved = paths::resolve(it->second);
      throw ConfigError("--init-from '" + it->second + "'" +
                        (resolved != it->second ? " (resolves to " + resolved + ")" : std::string()) +
                        " is outside both " + data_root_name + " " + data_root + " and " + ckpt_root_name + " " +
                        ckpt_root + ": use a model file under one of them or ask the platform team to widen a root");
    }
  }
}

}  // namespace railyard::worker
