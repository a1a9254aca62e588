#include "worker/cmd/train_setup.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "common/torchrun.h"
#include "worker/data/data_loader.h"
#include "worker/interop/llmc_model.h"
#include "worker/train/perf.h"

namespace railyard::worker {

DeviceChoice choose_device(const TrainOptions& o) {
  const std::string& device_spec = o.device;
  // The CUDA libraries are a module loaded only for CUDA runs (worker/device/cuda_module.h): `cuda`, or `auto` with
  // GPU device nodes. Its runtime then gives the GPU count resolve_device sees; CPU runs never load it.
  DeviceChoice d;
#ifdef RAILYARD_HAVE_CUDA
  const bool built_with_cuda = true;
  if (device_spec == "cuda" || ((device_spec == "auto" || device_spec.empty()) && gpu_device_nodes() > 0)) {
    try {
      d.cuda = &CudaModule::load();
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " (--device " + device_spec + ")");
    }
    d.visible_gpus = d.cuda->device_count();
  }
#else
  const bool built_with_cuda = false;
#endif
  try {
    d.kind = resolve_device(device_spec, d.visible_gpus, built_with_cuda);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (--device " + device_spec + ")");
  }
  log::info("worker", "device",
            {{"device", device_name(d.kind)},
             {"requested", device_spec},
             {"visible_gpus", std::to_string(d.visible_gpus)},
             {"built_with_cuda", built_with_cuda ? "true" : "false"},
             {"cuda_module", d.cuda != nullptr ? d.cuda->path() : "not loaded"},
             {"cudart_mapped", library_mapped("libcudart") ? "true" : "false"}});
  return d;
}

GptConfig model_config(const TrainOptions& o) {
  const ConfigOrigins& origins = o.origins;
  std::optional<GptConfig> cfg;
  if (o.model) cfg = parse_model_spec(*o.model);
  if (o.init_from) {
    const std::string& from = *o.init_from;
    GptConfig file_cfg;
    try {
      file_cfg = read_llmc_header(from);
    } catch (const ConfigError& e) {
      if (origins.init_from.empty()) throw;
      throw ConfigError(o.name_of("init-from", origins.init_from) + ": " + e.what());
    }
    if (auto m = cfg ? llmc_shape_mismatch(*cfg, file_cfg) : std::nullopt) {
      const std::string dims = "(" + m->dimension + " " + std::to_string(m->file) + " in the file, " +
                               std::to_string(m->expected) + " in the model)";
      if (origins.init_from.empty()) {
        throw ConfigError("--init-from " + from + " holds " + describe(file_cfg) + " but --model says " +
                          describe(*cfg) + " " + dims + ": drop --model or pick the matching shape");
      }
      throw ConfigError(o.name_of("init-from", origins.init_from) + " '" + from + "' holds " + describe(file_cfg) +
                        ", but spec.model." + (m->dimension == "vocab (padded)" ? std::string("vocab") : m->dimension) +
                        " is " + std::to_string(m->expected) + " where the file has " + std::to_string(m->file) +
                        (m->dimension == "vocab (padded)" ? " (padded vocabulary)" : "") +
                        ": give spec.model the file's shape (preset custom, layers " +
                        std::to_string(file_cfg.num_layers) + ", hidden " + std::to_string(file_cfg.channels) +
                        ", heads " + std::to_string(file_cfg.num_heads) + ", seqLen " +
                        std::to_string(file_cfg.max_seq_len) + ", vocab " + std::to_string(file_cfg.vocab_size) +
                        ") or start from a file of the model's shape");
    }
    cfg = file_cfg;
  }
  if (!cfg) cfg = model_preset("tiny");
  if (o.moe_experts || o.moe_tuning_given) {
    if (!o.moe_experts) throw ConfigError("--moe-top-k/--moe-capacity-factor/--moe-aux-coef need --moe-experts");
    cfg->moe = make_moe_config(*o.moe_experts, o.moe_top_k, o.moe_capacity_factor, o.moe_aux_coef);
    // Not done yet with experts (docs/parallel.md "Mixture of experts"): say so instead of running something untested.
    for (const auto& [flag, given] :
         {std::pair{"init-from", o.init_from.has_value()}, {"export", o.export_to.has_value()}}) {
      if (given) {
        throw ConfigError(std::string("--") + flag + " with --moe-experts: llm.c files of MoE models do not exist");
      }
    }
    if (o.cp > 1) {
      throw ConfigError(
          "--moe-experts with --cp: mixture-of-experts layers are not built for context parallelism (routing and "
          "capacity are per micro-batch, which cp splits); drop --cp (--tp/--pp/--sequence-parallel compose)");
    }
  }
  return *cfg;
}

TrainConfig train_config(const TrainOptions& o, const GptConfig& cfg) {
  TrainConfig tc;
  tc.steps = o.steps;
  tc.batch = o.batch;
  tc.seq_len = o.seq;
  tc.global_batch_tokens = o.global_batch_tokens;
  tc.lr = o.lr;
  tc.warmup_steps = o.warmup;
  tc.min_lr_frac = o.min_lr_frac;
  tc.weight_decay = o.weight_decay;
  tc.grad_clip = o.grad_clip;
  tc.seed = o.seed;
  tc.val_every = o.val_every;
  tc.val_steps = o.val_steps;
  tc.sample_every = o.sample_every;
  tc.sample_tokens = o.sample_tokens;
  tc.peak_flops = o.peak_flops;
  tc.max_bad_steps = o.max_bad_steps;
  tc.log_json = o.log_json;
  if (o.recompute || o.recompute_layers)
    tc.recompute = parse_recompute(o.recompute.value_or("none"), o.recompute_layers.value_or(-1), cfg);
  tc.sequence_parallel = o.sequence_parallel;
  tc.cp = o.cp;
  tc.offload = o.offload;
  tc.offload_threads = o.offload_threads;
  tc.progress_file = o.env.progress_file;
  tc.validate(cfg);
  tc.dp_split = o.dp_split;
  // --slow-ranks: this rank's own factor.
  for (int r : o.slow_ranks)
    if (r == o.env.rank_number()) tc.slow_factor = o.slow_factor;
  return tc;
}

ShardGlobs shard_globs(const TrainOptions& o, const TrainConfig& tc) {
  const ConfigOrigins& origins = o.origins;
  const std::string data = o.data.value_or("");
  const std::string val_data = o.val_data ? shard_glob(*o.val_data, "val_*.bin") : default_val_glob(data);
  auto expand = [&](const std::string& pattern, const std::string& name) {
    try {
      return expand_shard_pattern(pattern);
    } catch (const ConfigError& e) {
      throw ConfigError(name + ": " + e.what());
    }
  };
  const size_t train_shards = expand(data, o.name_of("data", origins.data)).size();
  log::info("worker", "data",
            {{"train", shard_glob(data)},
             {"train_shards", std::to_string(train_shards)},
             {"val", val_data},
             {"val_shards",
              tc.val_every > 0
                  ? std::to_string(expand(val_data, o.val_data ? o.name_of("val-data", origins.val_data)
                                                    : origins.data.empty()
                                                        ? "--val-every with the default --val-data (val_*.bin beside "
                                                          "the --data shards)"
                                                        : "spec.training.valEvery without spec.data.val (default: "
                                                          "val_*.bin beside the spec.data.train shards)")
                                       .size())
                  : "unused (no validation)"}});
  return {data, val_data};
}

MemoryRoom memory_room(const std::string& cgroup_max, double phys, int local_ranks) {
  local_ranks = std::max(1, local_ranks);
  char buf[160];
  std::string text = cgroup_max;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  double limit = 0;
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos && text.size() < 20)
    limit = std::stod(text);
  // cgroup v1 writes "no limit" as a huge page-rounded number; anything at or above the machine is no limit here.
  if (limit > 0 && (phys <= 0 || limit < phys)) {
    std::snprintf(buf, sizeof(buf), "the container's memory limit of %.2f GiB", limit / 1073741824.0);
    MemoryRoom r{limit / local_ranks, buf, true};
    if (local_ranks > 1) r.what += " shared by " + std::to_string(local_ranks) + " local ranks";
    return r;
  }
  std::snprintf(buf, sizeof(buf), "the machine's %.2f GiB", phys / 1073741824.0);
  MemoryRoom r{phys / local_ranks, buf, false};
  if (local_ranks > 1) r.what += " shared by " + std::to_string(local_ranks) + " local ranks";
  return r;
}

namespace {
std::string read_small(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return "";
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  return std::string(buf, n);
}
}  // namespace

void check_memory_budget(const GptConfig& cfg, const TrainConfig& tc, const TrainOptions& o) {
  const MemoryBudget need = memory_budget(cfg, tc.batch, tc.seq_len, o.threads, tc.recompute);
  const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  std::string cg = read_small("/sys/fs/cgroup/memory.max");                        // cgroup v2
  if (cg.empty()) cg = read_small("/sys/fs/cgroup/memory/memory.limit_in_bytes");  // cgroup v1
  const MemoryRoom room = memory_room(cg, phys, o.env.local_world_number());       // shared by the pod's ranks
  if (room.bytes > 0 && static_cast<double>(need.total()) > room.bytes) {
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "needs %.2f GiB per rank (params + grads + AdamW m, v + activations) but has %.2f GiB",
                  need.total() / 1073741824.0, room.bytes / 1073741824.0);
    throw ConfigError(std::string("spec.model/spec.training (--model/--batch/--seq): training ") + buf + ", " +
                      room.what +
                      ": use a smaller model, microBatch (--batch) or seqLen (--seq), recomputation, "
                      "ZeRO or offload" +
                      (room.limit ? ", or raise spec.resources.limits.memory" : ""));
  }
}

}  // namespace railyard::worker
