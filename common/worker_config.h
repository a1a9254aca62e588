// The worker configuration: what one generation of a TrainingJob trains and how, resolved by the operator from the
// job's spec and its plan, carried to every pod by the rendezvous service, completed by the agent with the
// generation's place in the world, and read by `railyard-worker train --config` (the file RAILYARD_CONFIG names).
// One typed contract for all of them (like rendezvous_protocol.h): each side builds or reads this struct, never the
// JSON by hand. docs/rendezvous.md "The worker configuration" lists the fields.
//
// Every field is optional (a config written by hand for a local run may give only some; the worker's own defaults
// fill the rest) and left out of the JSON when unset. Names are the TrainingJob's (camelCase); counts of sequences
// where the TrainingJob counts sequences (training.globalBatch).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace railyard {

// A field has the wrong type or range; the message names it ("training.steps must be an integer >= 1").
class WorkerConfigError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

struct WorkerConfig {
  // spec.model: a preset name, or "custom" with the shape; initFrom: an llm.c model file to start from.
  struct Moe {
    std::optional<int> experts, top_k;
    std::optional<double> capacity_factor, aux_loss_coef;
    bool operator==(const Moe&) const = default;
  };
  struct Model {
    std::optional<std::string> preset;
    std::optional<int> layers, hidden, heads, seq_len, vocab;
    std::optional<std::string> init_from;
    std::optional<Moe> moe;
    bool operator==(const Model&) const = default;
  };
  // spec.training: global_batch counts sequences (the worker's --global-batch counts tokens); grad_accumulation is
  // informational (the worker derives it from the batch sizes and the data-parallel degree).
  struct Training {
    std::optional<int64_t> steps, global_batch;
    std::optional<int> micro_batch, seq_len, grad_accumulation;
    std::optional<double> learning_rate, min_lr_fraction, weight_decay, grad_clip;
    std::optional<int64_t> warmup_steps, seed, val_every, val_steps, sample_every, sample_tokens;
    bool operator==(const Training&) const = default;
  };
  // The rank grid the rendezvous hands out: dp x tp x pp = world, where dp counts every rank of the data-parallel
  // group (a replica's cp context ranks are consecutive in it). procs_per_replica and replicas: the pods.
  struct Layout {
    std::optional<int> world, dp, tp, pp, procs_per_replica, replicas;
    bool operator==(const Layout&) const = default;
  };
  struct Data {
    std::optional<std::string> train, val;  // globs of shards (a directory: its train_*.bin / val_*.bin)
    bool operator==(const Data&) const = default;
  };
  // spec.checkpoint: interval_steps 0 = only at the end and on SIGTERM; memory_interval_steps 0 = no in-memory tier.
  struct Checkpoint {
    std::optional<std::string> path;
    std::optional<int64_t> interval_steps, keep, memory_interval_steps;
    std::optional<bool> async;
    bool operator==(const Checkpoint&) const = default;
  };
  // The parallelism family besides the grid: ZeRO, the deterministic reduction, expert/sequence/context
  // parallelism, and the mixed-GPU batch split (micro-batches per data-parallel rank).
  struct Parallelism {
    std::optional<int> zero, expert, context;
    std::optional<bool> deterministic, sequence_parallel;
    std::optional<std::string> expert_all_to_all;  // flat or hierarchical (only with expert > 1)
    std::vector<int> dp_split;                     // empty: the even split
    bool operator==(const Parallelism&) const = default;
  };
  struct Memory {
    std::optional<std::string> recompute, offload;  // none|selective|full, none|optimizer
    std::optional<int> recompute_layers;
    bool operator==(const Memory&) const = default;
  };

  std::optional<Model> model;
  std::optional<Training> training;
  std::optional<Layout> layout;
  std::optional<Data> data;
  std::optional<Checkpoint> checkpoint;
  std::optional<Parallelism> parallelism;
  std::optional<Memory> memory;
  std::optional<std::string> device;  // auto, cpu or cuda
  // The generation: its number, its world size, and the checkpoint it restores ("" = a fresh start; "auto" = the
  // in-memory tier or the newest checkpoint; a path). The operator sets restore, the agent the rest.
  std::optional<int64_t> generation;
  std::optional<int> world_size;
  std::optional<std::string> restore;

  // The in-memory checkpoint tier is on (checkpoint.memoryIntervalSteps > 0): the agents then keep peer copies.
  bool memory_tier_on() const {
    return checkpoint && checkpoint->memory_interval_steps && *checkpoint->memory_interval_steps > 0;
  }
  bool operator==(const WorkerConfig&) const = default;
};

nlohmann::json to_json(const WorkerConfig& c);
// Throws WorkerConfigError naming the field. Keys it does not know are ignored (an older or newer writer).
WorkerConfig parse_worker_config(const nlohmann::json& j);

}  // namespace railyard
