#include "worker/cmd/config_file.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <type_traits>

#include "common/error.h"
#include "common/worker_config.h"

namespace railyard::worker {

std::string flag_name(const std::string& flag, const std::string& origin, const std::map<std::string, std::string>& f) {
  if (origin.empty()) return "--" + flag;
  auto it = f.find("config");
  return origin + (it != f.end() ? " (--config " + it->second + ")" : std::string());
}

ConfigOrigins apply_config_file(const std::string& path, std::map<std::string, std::string>& f) {
  WorkerConfig c;
  try {
    c = parse_worker_config(nlohmann::json::parse(read_file(path, "--config")));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("--config " + path + ": not valid JSON (" + e.what() + ")");
  } catch (const WorkerConfigError& e) {
    throw ConfigError("--config " + path + ": " + e.what() + " (docs/rendezvous.md \"The worker configuration\")");
  }
  // A flag given on the command line wins; an unset field leaves the worker's default.
  auto set = [&](const std::string& flag, const auto& v) {
    if (f.count(flag) || !v) return;
    using T = std::decay_t<decltype(*v)>;
    if constexpr (std::is_same_v<T, std::string>)
      f[flag] = *v;
    else if constexpr (std::is_same_v<T, bool>)
      f[flag] = *v ? "true" : "false";
    else
      f[flag] = nlohmann::json(*v).dump();  // numbers as JSON writes them (shortest round trip)
  };
  // The world size is at the top (the agent's world_size); a hand-written config may give only layout.world.
  std::optional<int> world = c.world_size;
  if (!world && c.layout) world = c.layout->world;
  if (world && *world > 1) {
    // A world is joined through the launcher's environment (the agent, or --nproc); the config only describes it.
    const std::string env_world = env_or("WORLD_SIZE", "");
    if (env_world != std::to_string(*world)) {
      throw ConfigError("--config " + path + ": world size " + std::to_string(*world) + ", but WORLD_SIZE is '" +
                        env_world + "': run it under `railyard-worker agent`, or locally with `railyard-worker train " +
                        "--nproc " + std::to_string(*world) + "`");
    }
  }
  if (c.layout) {
    set("tp", c.layout->tp);
    set("pp", c.layout->pp);
  }
  if (const auto& p = c.parallelism) {
    set("zero", p->zero);
    // The operator's batch split for mixed GPU types (spec.parallelism.auto): micro-batches per data-parallel rank.
    if (!p->dp_split.empty() && !f.count("dp-split")) {
      std::string list;
      for (int v : p->dp_split) list += (list.empty() ? "" : ",") + std::to_string(v);
      f["dp-split"] = list;
    }
    if (p->deterministic.value_or(false)) set("deterministic", p->deterministic);
    if (p->expert.value_or(1) > 1) {
      set("ep", p->expert);
      set("ep-a2a", p->expert_all_to_all);  // only with --ep > 1: the worker refuses it alone
    }
    if (p->sequence_parallel.value_or(false)) set("sequence-parallel", p->sequence_parallel);
    if (p->context.value_or(1) > 1) set("cp", p->context);
  }
  if (const auto& m = c.memory) {
    set("recompute", m->recompute);
    set("recompute-layers", m->recompute_layers);
    set("offload", m->offload);
  }
  set("device", c.device);
  if (const auto& m = c.model) {
    if (m->moe) {
      set("moe-experts", m->moe->experts);
      set("moe-top-k", m->moe->top_k);
      set("moe-capacity-factor", m->moe->capacity_factor);
      set("moe-aux-coef", m->moe->aux_loss_coef);
    }
    if (!f.count("model")) {
      if (m->preset && *m->preset != "custom") {
        f["model"] = *m->preset;
      } else {
        std::string spec;
        for (auto [key, field, v] : {std::tuple{"l", "layers", m->layers},
                                     {"c", "hidden", m->hidden},
                                     {"nh", "heads", m->heads},
                                     {"t", "seqLen", m->seq_len},
                                     {"v", "vocab", m->vocab}}) {
          if (!v) throw ConfigError("--config " + path + ": model." + field + " is missing");
          spec += (spec.empty() ? "" : ",") + std::string(key) + "=" + std::to_string(*v);
        }
        f["model"] = spec;
      }
    }
  }
  if (const auto& t = c.training) {
    set("steps", t->steps);
    set("batch", t->micro_batch);
    set("seq", t->seq_len);
    if (t->global_batch && t->seq_len) set("global-batch", std::optional<int64_t>(*t->global_batch * *t->seq_len));
    set("lr", t->learning_rate);
    set("warmup", t->warmup_steps);
    set("min-lr-frac", t->min_lr_fraction);
    set("weight-decay", t->weight_decay);
    set("grad-clip", t->grad_clip);
    set("seed", t->seed);
    set("val-every", t->val_every);
    set("val-steps", t->val_steps);
    set("sample-every", t->sample_every);
    set("sample-tokens", t->sample_tokens);
  }
  ConfigOrigins origins;
  // data.train is a glob of training shards (a directory means its train_*.bin) and data.val one of validation
  // shards; the loader expands them (cmd_train checks that they match).
  if (c.data && c.data->train && !f.count("data")) {
    f["data"] = *c.data->train;
    origins.data = "spec.data.train";
  }
  if (c.data && c.data->val && !c.data->val->empty() && !f.count("val-data")) {
    f["val-data"] = *c.data->val;
    origins.val_data = "spec.data.val";
  }
  if (const auto& ck = c.checkpoint) {
    set("ckpt-dir", ck->path);
    set("ckpt-every", ck->interval_steps);
    set("ckpt-keep", ck->keep);
    if (ck->async) set("ckpt-async", std::optional<std::string>(*ck->async ? "on" : "off"));
    set("ckpt-shm-every", ck->memory_interval_steps);
  }
  // The operator names the checkpoint to restore (restarts) in "restore"; "" or nothing means a fresh start even
  // when the directory holds checkpoints of an earlier job.
  if (!f.count("init-from"))
    set("resume", std::optional<std::string>(c.restore && !c.restore->empty() ? *c.restore : "never"));
  // model.initFrom: the llm.c model to start from when nothing is restored (set after "resume" so that a restart's
  // restore still happens, and wins).
  if (c.model && c.model->init_from && !c.model->init_from->empty() && !f.count("init-from")) {
    f["init-from"] = *c.model->init_from;
    origins.init_from = "spec.model.initFrom";
  }
  return origins;
}

}  // namespace railyard::worker
