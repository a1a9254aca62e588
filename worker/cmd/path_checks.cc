#include "worker/cmd/path_checks.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/path_roots.h"
#include "common/pod_env.h"
#include "worker/data/data_loader.h"

namespace railyard::worker {

void enforce_path_roots(const TrainOptions& o) {
  const ConfigOrigins& origins = o.origins;
  const std::string& data_root = o.data_root;
  const std::string& data_root_name = o.data_root_name;
  const std::string& ckpt_root = o.ckpt_root;
  const std::string& ckpt_root_name = o.ckpt_root_name;
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> checks;  // what, path, root, root name
  // Data sources are globs: the pattern itself (lexically and through its existing directories), and every file it
  // matches (a symlinked shard, or a directory a wildcard crosses, that leads out of the root); the validation shards
  // also when they are the default beside the training shards.
  if (o.data) {
    const struct {
      std::string what, pattern;
      bool given;
    } sources[] = {
        {!origins.data.empty() ? "--data (" + origins.data + " of --config)" : "--data", *o.data, true},
        {o.val_data && !origins.val_data.empty() ? "--val-data (" + origins.val_data + " of --config)"
         : o.val_data                            ? "--val-data"
                                                 : "--val-data (the default, beside --data)",
         o.val_data ? shard_glob(*o.val_data, "val_*.bin") : default_val_glob(*o.data), o.val_data.has_value()}};
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
  if (o.has("ckpt-dir") || o.configured.count("ckpt-dir"))
    checks.emplace_back(!origins.ckpt_dir.empty() ? "--ckpt-dir (checkpoint.path of --config)" : "--ckpt-dir",
                        o.ckpt_dir, ckpt_root, ckpt_root_name);
  if ((o.has("resume") || o.configured.count("resume")) && o.resume != "auto" && o.resume != "never")
    checks.emplace_back("--resume", o.resume, ckpt_root, ckpt_root_name);
  // --export writes weights: an output like checkpoints.
  if (o.export_to) checks.emplace_back("--export", *o.export_to, ckpt_root, ckpt_root_name);
  for (const auto& [what, path, root, root_name] : checks) {
    if (auto msg = paths::check_within(what, path, root, root_name, true)) throw ConfigError(*msg);
  }
  // --init-from reads weights: the model a job starts from is either input data or the export/checkpoint of an
  // earlier job, so either root may hold it; with roots set it must be under one of them.
  if (o.init_from && (!data_root.empty() || !ckpt_root.empty())) {
    const std::string& from = *o.init_from;
    auto in_data = paths::check_within("--init-from", from, data_root, data_root_name, true);
    auto in_ckpt = paths::check_within("--init-from", from, ckpt_root, ckpt_root_name, true);
    if ((data_root.empty() || in_data) && (ckpt_root.empty() || in_ckpt)) {
      const bool relative = from.empty() || from.front() != '/';
      if (data_root.empty() || ckpt_root.empty() || relative) throw ConfigError(in_data ? *in_data : *in_ckpt);
      const std::string resolved = paths::resolve(from);
      throw ConfigError("--init-from '" + from + "'" +
                        (resolved != from ? " (resolves to " + resolved + ")" : std::string()) + " is outside both " +
                        data_root_name + " " + data_root + " and " + ckpt_root_name + " " + ckpt_root +
                        ": use a model file under one of them or ask the platform team to widen a root");
    }
  }
}

}  // namespace railyard::worker
