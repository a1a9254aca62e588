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

DeviceChoice choose_device(const Flags& f) {
  const std::string device_spec = f.count("device") ? f.at("device") : "auto";
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

GptConfig model_config(const Flags& f, const ConfigOrigins& origins) {
  std::optional<GptConfig> cfg;
  if (f.count("model")) cfg = parse_model_spec(f.at("model"));
  if (f.count("init-from")) {
    const std::string& from = f.at("init-from");
    GptConfig file_cfg;
    try {
      file_cfg = read_llmc_header(from);
    } catch (const ConfigError& e) {
      if (origins.init_from.empty()) throw;
      throw ConfigError(flag_name("init-from", origins.init_from, f) + ": " + e.what());
    }
    if (auto m = cfg ? llmc_shape_mismatch(*cfg, file_cfg) : std::nullopt) {
      const std::string dims = "(" + m->dimension + " " + std::to_string(m->file) + " in the file, " +
                               std::to_string(m->expected) + " in the model)";
      if (origins.init_from.empty()) {
        throw ConfigError("--init-from " + from + " holds " + describe(file_cfg) + " but --model says " +
                          describe(*cfg) + " " + dims + ": drop --model or pick the matching shape");
      }
      throw ConfigError(flag_name("init-from", origins.init_from, f) + " '" + from + "' holds " + describe(file_cfg) +
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
  if (f.count("moe-experts") || f.count("moe-top-k") || f.count("moe-capacity-factor") || f.count("moe-aux-coef")) {
    if (!f.count("moe-experts"))
      throw ConfigError("--moe-top-k/--moe-capacity-factor/--moe-aux-coef need --moe-experts");
    cfg->moe =
        make_moe_config(static_cast<int>(to_int(f, "moe-experts", 0)), static_cast<int>(to_int(f, "moe-top-k", 1)),
                        to_double(f, "moe-capacity-factor", 1.25), to_double(f, "moe-aux-coef", 0.01));
    // Not done yet with experts (docs/parallel.md "Mixture of experts"): say so instead of running something untested.
    for (const char* flag : {"init-from", "export"}) {
      if (f.count(flag)) {
        throw ConfigError(std::string("--") + flag + " with --moe-experts: llm.c files of MoE models do not exist");
      }
    }
    if (to_int(f, "cp", 1) > 1) {
      throw ConfigError(
          "--moe-experts with --cp: mixture-of-experts layers are not built for context parallelism (routing and "
          "capacity are per micro-batch, which cp splits); drop --cp (--tp/--pp/--sequence-parallel compose)");
    }
  }
  return *cfg;
}

TrainConfig train_config(const Flags& f, const GptConfig& cfg) {
  TrainConfig tc;
  tc.steps = static_cast<int>(to_int(f, "steps", 10));
  tc.batch = static_cast<int>(to_int(f, "batch", 4));
  tc.seq_len = static_cast<int>(to_int(f, "seq", 64));
  tc.global_batch_tokens = to_int(f, "global-batch", 0);
  tc.lr = to_double(f, "lr", 6e-4);
  tc.warmup_steps = static_cast<int>(to_int(f, "warmup", 0));
  tc.min_lr_frac = to_double(f, "min-lr-frac", 0.1);
  tc.weight_decay = to_double(f, "weight-decay", 0.1);
  tc.grad_clip = to_double(f, "grad-clip", 1.0);
  tc.seed = static_cast<uint64_t>(to_int(f, "seed", 1337));
  tc.val_every = static_cast<int>(to_int(f, "val-every", 0));
  tc.val_steps = static_cast<int>(to_int(f, "val-steps", 10));
  tc.sample_every = static_cast<int>(to_int(f, "sample-every", 0));
  tc.sample_tokens = static_cast<int>(to_int(f, "sample-tokens", 64));
  tc.peak_flops = to_double(f, "peak-flops", 0);
  tc.max_bad_steps = static_cast<int>(to_int(f, "max-bad-steps", 3));
  if (f.count("log-json")) tc.log_json = f.at("log-json");
  if (f.count("recompute") || f.count("recompute-layers")) {
    tc.recompute = parse_recompute(f.count("recompute") ? f.at("recompute") : "none",
                                   static_cast<int>(to_int(f, "recompute-layers", -1)), cfg);
  }
  if (f.count("sequence-parallel")) {
    const std::string v = f.at("sequence-parallel");
    if (v != "true" && v != "false" && v != "1" && v != "0") {
      throw ConfigError("--sequence-parallel=" + v + ": give it without a value, or true/false");
    }
    tc.sequence_parallel = v == "true" || v == "1";
    if (tc.sequence_parallel && to_int(f, "tp", 1) < 2) {
      throw ConfigError("--sequence-parallel needs tensor parallelism: add --tp 2 (or more) or drop the flag");
    }
  }
  tc.cp = static_cast<int>(to_int(f, "cp", 1));
  if (f.count("offload")) tc.offload = parse_offload(f.at("offload"));
  tc.offload_threads = static_cast<int>(to_int(f, "offload-threads", 1));
  if (const char* p = std::getenv(torchrun::kProgressFileEnv); p != nullptr && *p != '\0') tc.progress_file = p;
  tc.validate(cfg);
  if (f.count("dp-split")) tc.dp_split = int_list(f, "dp-split");
  if (f.count("slow-ranks") != f.count("slow-factor"))
    throw ConfigError("--slow-ranks and --slow-factor go together (e.g. --slow-ranks 1 --slow-factor 2)");
  if (f.count("slow-ranks")) {
    const double factor = to_double(f, "slow-factor", 1);
    if (!(factor >= 1) || !std::isfinite(factor)) throw ConfigError("--slow-factor must be a number >= 1");
    const int me = static_cast<int>(std::atol(env_or("RANK", "0").c_str()));
    for (int r : int_list(f, "slow-ranks")) {
      if (r < 0) throw ConfigError("--slow-ranks: ranks are >= 0");
      if (r == me) tc.slow_factor = factor;
    }
  }
  return tc;
}

ShardGlobs shard_globs(const Flags& f, const ConfigOrigins& origins, const TrainConfig& tc) {
  const std::string data = f.at("data");
  const std::string val_data = f.count("val-data") ? shard_glob(f.at("val-data"), "val_*.bin") : default_val_glob(data);
  auto expand = [&](const std::string& pattern, const std::string& name) {
    try {
      return expand_shard_pattern(pattern);
    } catch (const ConfigError& e) {
      throw ConfigError(name + ": " + e.what());
    }
  };
  const size_t train_shards = expand(data, flag_name("data", origins.data, f)).size();
  log::info("worker", "data",
            {{"train", shard_glob(data)},
             {"train_shards", std::to_string(train_shards)},
             {"val", val_data},
             {"val_shards",
              tc.val_every > 0
                  ? std::to_string(expand(val_data, f.count("val-data") ? flag_name("val-data", origins.val_data, f)
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

void check_memory_budget(const GptConfig& cfg, const TrainConfig& tc, int threads) {
  const MemoryBudget need = memory_budget(cfg, tc.batch, tc.seq_len, threads, tc.recompute);
  const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  std::string cg = read_small("/sys/fs/cgroup/memory.max");                        // cgroup v2
  if (cg.empty()) cg = read_small("/sys/fs/cgroup/memory/memory.limit_in_bytes");  // cgroup v1
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");                               // ranks of this pod
  const int local = lws != nullptr ? std::max(1, std::atoi(lws)) : 1;
  const MemoryRoom room = memory_room(cg, phys, local);
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
