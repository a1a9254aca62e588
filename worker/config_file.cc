#include "worker/config_file.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace railyard::worker {

std::string flag_name(const std::string& flag, const std::string& origin, const std::map<std::string, std::string>& f) {
  if (origin.empty()) return "--" + flag;
  auto it = f.find("config");
  return origin + (it != f.end() ? " (--config " + it->second + ")" : std::string());
}

ConfigOrigins apply_config_file(const std::string& path, std::map<std::string, std::string>& f) {
  ConfigOrigins origins;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path, "--config"));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("--config " + path + ": not valid JSON (" + e.what() + ")");
  }
  auto set = [&](const std::string& flag, const nlohmann::json& v) {
    if (f.count(flag) || v.is_null()) return;
    f[flag] = v.is_string() ? v.get<std::string>() : v.dump();
  };
  const auto get = [](const nlohmann::json& o, const char* k) {
    return o.is_object() && o.contains(k) ? o[k] : nullptr;
  };
  const nlohmann::json layout = get(j, "layout");
  // The agent writes the world size at the top (world_size); the operator's resolved layout has it as layout.world.
  nlohmann::json world = get(j, "world_size");
  if (!world.is_number_integer()) world = get(layout, "world");
  if (world.is_number_integer() && world.get<int>() > 1) {
    // A world is joined through the launcher's environment (the agent, or --nproc); the config only describes it.
    const std::string env_world = env_or("WORLD_SIZE", "");
    if (env_world != world.dump()) {
      throw ConfigError("--config " + path + ": world size " + world.dump() + ", but WORLD_SIZE is '" + env_world +
                        "': run it under `railyard-worker agent`, or locally with `railyard-worker train --nproc " +
                        world.dump() + "`");
    }
  }
  for (const char* k : {"tp", "pp"}) set(k, get(layout, k));
  nlohmann::json par = get(j, "parallelism");
  if (!par.is_object()) par = get(get(j, "spec"), "parallelism");
  set("zero", get(par, "zero"));
  // The operator's batch split for mixed GPU types (spec.parallelism.auto): micro-batches per data-parallel rank.
  if (const auto split = get(par, "dpSplit"); split.is_array() && !split.empty() && !f.count("dp-split")) {
    std::string list;
    for (const auto& v : split) list += (list.empty() ? "" : ",") + v.dump();
    f["dp-split"] = list;
  }
  if (const auto det = get(par, "deterministic"); det.is_boolean() && det.get<bool>()) set("deterministic", "true");
  // The rest of the parallelism family (operator/controller/job_spec.cc resolved_config, docs/crd-reference.md).
  if (const auto ep = get(par, "expert"); ep.is_number_integer() && ep.get<int>() > 1) {
    set("ep", ep);
    set("ep-a2a", get(par, "expertAllToAll"));  // only with --ep > 1: the worker refuses it alone
  }
  if (const auto sp = get(par, "sequenceParallel"); sp.is_boolean() && sp.get<bool>()) set("sequence-parallel", "true");
  if (const auto cp = get(par, "context"); cp.is_number_integer() && cp.get<int>() > 1) set("cp", cp);
  nlohmann::json moe = get(get(j, "model"), "moe");
  if (!moe.is_object()) moe = get(get(get(j, "spec"), "model"), "moe");
  if (moe.is_object()) {
    set("moe-experts", get(moe, "experts"));
    set("moe-top-k", get(moe, "topK"));
    set("moe-capacity-factor", get(moe, "capacityFactor"));
    set("moe-aux-coef", get(moe, "auxLossCoef"));
  }
  nlohmann::json mem = get(j, "memory");
  if (!mem.is_object()) mem = get(get(j, "spec"), "memory");
  set("recompute", get(mem, "recompute"));
  set("recompute-layers", get(mem, "recomputeLayers"));
  set("offload", get(mem, "offload"));
  // spec.device: the resolved config carries it at the top (operator/controller/job_spec.cc), a bare spec under "spec".
  set("device", get(j, "device"));
  set("device", get(get(j, "spec"), "device"));
  const nlohmann::json model = get(j, "model");
  if (model.is_object() && !f.count("model")) {
    const auto preset = get(model, "preset");
    if (preset.is_string() && preset.get<std::string>() != "custom") {
      f["model"] = preset.get<std::string>();
    } else {
      std::string spec;
      for (auto [key, field] :
           {std::pair{"l", "layers"}, {"c", "hidden"}, {"nh", "heads"}, {"t", "seqLen"}, {"v", "vocab"}}) {
        const auto v = get(model, field);
        if (!v.is_number_integer()) throw ConfigError("--config " + path + ": model." + field + " is missing");
        spec += (spec.empty() ? "" : ",") + std::string(key) + "=" + v.dump();
      }
      f["model"] = spec;
    }
  }
  // The operator's resolved config carries the normalised model/training/layout at the top and the job's whole
  // spec under "spec" (docs/rendezvous.md): what the resolved part lacks comes from the spec.
  const nlohmann::json spec = get(j, "spec");
  nlohmann::json tr = get(j, "training");
  if (const auto spec_tr = get(spec, "training"); spec_tr.is_object()) {
    if (!tr.is_object()) tr = nlohmann::json::object();
    for (const auto& [k, v] : spec_tr.items())
      if (!tr.contains(k)) tr[k] = v;
  }
  set("steps", get(tr, "steps"));
  set("batch", get(tr, "microBatch"));
  set("seq", get(tr, "seqLen"));
  if (const auto gb = get(tr, "globalBatch"), sl = get(tr, "seqLen");
      gb.is_number_integer() && sl.is_number_integer()) {
    set("global-batch", gb.get<int64_t>() * sl.get<int64_t>());
  }
  set("lr", get(tr, "learningRate"));  // the TrainingJob's name for it
  for (auto [flag, key] : {std::pair{"lr", "lr"},
                           {"warmup", "warmupSteps"},
                           {"min-lr-frac", "minLrFraction"},
                           {"weight-decay", "weightDecay"},
                           {"grad-clip", "gradClip"},
                           {"seed", "seed"},
                           {"val-every", "valEvery"},
                           {"val-steps", "valSteps"},
                           {"sample-every", "sampleEvery"},
                           {"sample-tokens", "sampleTokens"}}) {
    set(flag, get(tr, key));
  }
  nlohmann::json data = get(j, "data");
  if (data.is_null()) data = get(spec, "data");
  // spec.data.train is a glob of training shards (a directory means its train_*.bin) and spec.data.val one of
  // validation shards; the loader expands them (cmd_train checks that they match).
  if (const auto train = get(data, "train"); train.is_string() && !f.count("data")) {
    f["data"] = train.get<std::string>();
    origins.data = "spec.data.train";
  }
  set("data", data.is_string() ? data : get(data, "path"));
  if (const auto val = get(data, "val"); val.is_string() && !val.get<std::string>().empty() && !f.count("val-data")) {
    f["val-data"] = val.get<std::string>();
    origins.val_data = "spec.data.val";
  }
  // Checkpoints: spec.checkpoint; the operator names the checkpoint to restore (restarts) in "restore", and "" or
  // nothing means a fresh start even when the directory holds checkpoints of an earlier job.
  // The resolved config's checkpoint object wins over spec.checkpoint field by field.
  nlohmann::json ck = get(j, "checkpoint");
  if (const auto spec_ck = get(spec, "checkpoint"); spec_ck.is_object()) {
    if (!ck.is_object()) ck = nlohmann::json::object();
    for (const auto& [k, v] : spec_ck.items())
      if (!ck.contains(k)) ck[k] = v;
  }
  set("ckpt-dir", get(ck, "path"));
  set("ckpt-every", get(ck, "intervalSteps"));
  set("ckpt-keep", get(ck, "keep"));
  if (const auto a = get(ck, "async"); a.is_boolean()) set("ckpt-async", a.get<bool>() ? "on" : "off");
  set("ckpt-shm-every", get(ck, "memoryIntervalSteps"));
  const auto restore = get(j, "restore");
  if (!f.count("init-from")) {
    set("resume", restore.is_string() && !restore.get<std::string>().empty() ? restore : nlohmann::json("never"));
  }
  // spec.model.initFrom (the resolved config's model.initFrom): the llm.c model to start from when nothing is
  // restored (set after "resume" so that a restart's restore still happens, and wins).
  nlohmann::json init = get(model, "initFrom");
  if (!init.is_string()) init = get(get(spec, "model"), "initFrom");
  if (init.is_string() && !init.get<std::string>().empty() && !f.count("init-from")) {
    f["init-from"] = init.get<std::string>();
    origins.init_from = "spec.model.initFrom";
  }
  return origins;
}

}  // namespace railyard::worker
