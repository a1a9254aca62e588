#include "worker/cmd/config_file.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/error.h"
#include "common/worker_config.h"
#include "worker/optim/offload.h"

namespace railyard::worker {

namespace {

// Sets `field` from the configuration's value unless the command line gave `flag` (it wins) or the configuration
// leaves the field unset (the worker's default stays). A number the option cannot hold is refused, not wrapped.
template <typename Field, typename Value>
void set(TrainOptions& o, const std::string& flag, Field& field, const std::optional<Value>& v) {
  if (o.has(flag) || !v) return;
  if constexpr (std::is_integral_v<Field> && std::is_integral_v<Value> && !std::is_same_v<Field, bool>) {
    if (!std::in_range<Field>(*v))
      throw ConfigError("--config " + o.config + ": " + std::to_string(*v) + " is out of range for --" + flag);
  }
  field = static_cast<Field>(*v);
  o.configured.insert(flag);
}

WorkerConfig read_config(const std::string& path) {
  try {
    return parse_worker_config(nlohmann::json::parse(read_file(path, "--config")));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("--config " + path + ": not valid JSON (" + e.what() + ")");
  } catch (const WorkerConfigError& e) {
    throw ConfigError("--config " + path + ": " + e.what() + " (docs/rendezvous.md \"The worker configuration\")");
  }
}

void check_world(const WorkerConfig& c, const TrainOptions& o) {
  const std::string& path = o.config;
  // The world size is at the top (the agent's world_size); a hand-written config may give only layout.world.
  std::optional<int> world = c.world_size;
  if (!world && c.layout) world = c.layout->world;
  if (world && *world > 1) {
    // A world is joined through the launcher's environment (the agent, or --nproc); the config only describes it.
    const std::string& env_world = o.env.world_size;
    if (env_world != std::to_string(*world)) {
      throw ConfigError("--config " + path + ": world size " + std::to_string(*world) + ", but WORLD_SIZE is '" +
                        env_world + "': run it under `railyard-worker agent`, or locally with `railyard-worker train " +
                        "--nproc " + std::to_string(*world) + "`");
    }
  }
}

// layout, parallelism, memory and device.
void apply_layout(const WorkerConfig& c, TrainOptions& o) {
  if (c.layout) {
    set(o, "tp", o.tp, c.layout->tp);
    set(o, "pp", o.pp, c.layout->pp);
  }
  if (const auto& p = c.parallelism) {
    set(o, "zero", o.zero, p->zero);
    // The operator's batch split for mixed GPU types (spec.parallelism.auto): micro-batches per data-parallel rank.
    if (!p->dp_split.empty()) set(o, "dp-split", o.dp_split, std::optional(p->dp_split));
    if (p->deterministic.value_or(false)) set(o, "deterministic", o.deterministic, p->deterministic);
    if (p->expert.value_or(1) > 1) {
      set(o, "ep", o.ep, p->expert);
      set(o, "ep-a2a", o.ep_a2a, p->expert_all_to_all);  // only with --ep > 1: the worker refuses it alone
    }
    if (p->sequence_parallel.value_or(false)) set(o, "sequence-parallel", o.sequence_parallel, p->sequence_parallel);
    if (p->context.value_or(1) > 1) set(o, "cp", o.cp, p->context);
  }
  if (const auto& m = c.memory) {
    set(o, "recompute", o.recompute, m->recompute);
    set(o, "recompute-layers", o.recompute_layers, m->recompute_layers);
    if (m->offload && !o.has("offload")) {
      o.offload = parse_offload(*m->offload);
      o.configured.insert("offload");
    }
  }
  set(o, "device", o.device, c.device);
}

void apply_model(const WorkerConfig& c, TrainOptions& o) {
  const std::string& path = o.config;
  if (const auto& m = c.model) {
    if (m->moe) {
      set(o, "moe-experts", o.moe_experts, m->moe->experts);
      set(o, "moe-top-k", o.moe_top_k, m->moe->top_k);
      set(o, "moe-capacity-factor", o.moe_capacity_factor, m->moe->capacity_factor);
      set(o, "moe-aux-coef", o.moe_aux_coef, m->moe->aux_loss_coef);
      o.moe_tuning_given |= m->moe->top_k || m->moe->capacity_factor || m->moe->aux_loss_coef;
    }
    if (!o.has("model")) {
      if (m->preset && *m->preset != "custom") {
        o.model = *m->preset;
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
        o.model = spec;
      }
      o.configured.insert("model");
    }
  }
}

void apply_training(const WorkerConfig& c, TrainOptions& o) {
  if (const auto& t = c.training) {
    set(o, "steps", o.steps, t->steps);
    set(o, "batch", o.batch, t->micro_batch);
    set(o, "seq", o.seq, t->seq_len);
    if (t->global_batch && t->seq_len)
      set(o, "global-batch", o.global_batch_tokens, std::optional<int64_t>(*t->global_batch * *t->seq_len));
    set(o, "lr", o.lr, t->learning_rate);
    set(o, "warmup", o.warmup, t->warmup_steps);
    set(o, "min-lr-frac", o.min_lr_frac, t->min_lr_fraction);
    set(o, "weight-decay", o.weight_decay, t->weight_decay);
    set(o, "grad-clip", o.grad_clip, t->grad_clip);
    set(o, "seed", o.seed, t->seed);
    set(o, "val-every", o.val_every, t->val_every);
    set(o, "val-steps", o.val_steps, t->val_steps);
    set(o, "sample-every", o.sample_every, t->sample_every);
    set(o, "sample-tokens", o.sample_tokens, t->sample_tokens);
  }
}

// data, checkpoint, restore and the initial model.
void apply_paths(const WorkerConfig& c, TrainOptions& o) {
  // data.train is a glob of training shards (a directory means its train_*.bin) and data.val one of validation
  // shards; the loader expands them (cmd_train checks that they match).
  if (c.data && c.data->train && !o.has("data")) {
    set(o, "data", o.data, c.data->train);
    o.origins.data = "spec.data.train";
  }
  if (c.data && c.data->val && !c.data->val->empty() && !o.has("val-data")) {
    set(o, "val-data", o.val_data, c.data->val);
    o.origins.val_data = "spec.data.val";
  }
  if (const auto& ck = c.checkpoint) {
    if (ck->path && !o.has("ckpt-dir")) o.origins.ckpt_dir = "spec.checkpoint.path";
    set(o, "ckpt-dir", o.ckpt_dir, ck->path);
    set(o, "ckpt-every", o.ckpt_every, ck->interval_steps);
    set(o, "ckpt-keep", o.ckpt_keep, ck->keep);
    set(o, "ckpt-async", o.ckpt_async, ck->async);
    set(o, "ckpt-shm-every", o.ckpt_shm_every, ck->memory_interval_steps);
  }
  // The operator names the checkpoint to restore (restarts) in "restore"; "" or nothing means a fresh start even
  // when the directory holds checkpoints of an earlier job.
  if (!o.has("init-from"))
    set(o, "resume", o.resume, std::optional<std::string>(c.restore && !c.restore->empty() ? *c.restore : "never"));
  // model.initFrom: the llm.c model to start from when nothing is restored (set after "resume" so that a restart's
  // restore still happens, and wins).
  if (c.model && c.model->init_from && !c.model->init_from->empty() && !o.has("init-from")) {
    set(o, "init-from", o.init_from, c.model->init_from);
    o.origins.init_from = "spec.model.initFrom";
  }
}

}  // namespace

void apply_config_file(TrainOptions& o) {
  const WorkerConfig c = read_config(o.config);
  check_world(c, o);
  apply_layout(c, o);
  apply_model(c, o);
  apply_training(c, o);
  apply_paths(c, o);
}

}  // namespace railyard::worker
