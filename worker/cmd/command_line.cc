#include "worker/cmd/command_line.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>

#include "common/error.h"
#include "common/pod_env.h"
#include "worker/cmd/config_file.h"
#include "worker/cmd/flags.h"
#include "worker/kernels/cpu/thread_pool.h"

namespace railyard::worker {

namespace {

// The value parsers: each names the flag in its error.
long long integer(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw ConfigError("--" + flag + " '" + v + "' is not an integer");
  return n;
}

// An int option: a value beyond int's range is refused, not wrapped (--metrics-port 4294976696 is not 9400).
int small_integer(const std::string& flag, const std::string& v) {
  const long long n = integer(flag, v);
  if (n < INT32_MIN || n > INT32_MAX) throw ConfigError("--" + flag + " '" + v + "' is out of range");
  return static_cast<int>(n);
}

double number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') throw ConfigError("--" + flag + " '" + v + "' is not a number");
  return d;
}

// "3,1" -> {3, 1}.
std::vector<int> integer_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    char* stop = nullptr;
    const long v = std::strtol(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || v < INT32_MIN || v > INT32_MAX)
      throw ConfigError("--" + flag + " '" + text + "' is not a comma-separated list of integers (e.g. 3,1)");
    out.push_back(static_cast<int>(v));
    start = end + 1;
  }
  return out;
}

// A switch given alone is "true" (flags.cc); --switch=true|false|1|0 also works.
bool switch_value(const std::string& flag, const std::string& v) {
  if (v != "true" && v != "false" && v != "1" && v != "0")
    throw ConfigError("--" + flag + "=" + v + ": give it without a value, or true/false");
  return v == "true" || v == "1";
}

cpu::GemmThreading gemm_split_value(const std::string& flag, const std::string& v) {
  if (v == "pool") return cpu::GemmThreading::kPool;
  if (v == "openblas") return cpu::GemmThreading::kOpenBlas;
  throw ConfigError("--" + flag + " must be pool or openblas");
}

using O = TrainOptions;
using Setter = std::function<void(O& o, const std::string& flag, const std::string& v)>;

Setter text(std::string O::*field) {
  return [field](O& o, const std::string&, const std::string& v) { o.*field = v; };
}
Setter optional_text(std::optional<std::string> O::*field) {
  return [field](O& o, const std::string&, const std::string& v) { o.*field = v; };
}
Setter whole(int O::*field) {
  return [field](O& o, const std::string& f, const std::string& v) { o.*field = small_integer(f, v); };
}
Setter decimal(double O::*field) {
  return [field](O& o, const std::string& f, const std::string& v) { o.*field = number(f, v); };
}

// Every flag of `train` (usage.cc and docs/worker.md describe them) and how its value is read.
const std::map<std::string, Setter>& train_flags() {
  using S = const std::string&;
  static const std::map<std::string, Setter> table = {
      {"config", text(&O::config)},
      {"nproc", whole(&O::nproc)},
      {"device", text(&O::device)},
      {"threads", whole(&O::threads)},
      {"gemm-split", [](O& o, S f, S v) { o.gemm_split = gemm_split_value(f, v); }},
      {"model", optional_text(&O::model)},
      {"init-from", optional_text(&O::init_from)},
      {"export", optional_text(&O::export_to)},
      {"moe-experts", [](O& o, S f, S v) { o.moe_experts = small_integer(f, v); }},
      {"moe-top-k", whole(&O::moe_top_k)},
      {"moe-capacity-factor", decimal(&O::moe_capacity_factor)},
      {"moe-aux-coef", decimal(&O::moe_aux_coef)},
      {"data", optional_text(&O::data)},
      {"val-data", optional_text(&O::val_data)},
      {"data-root", text(&O::data_root)},
      {"ckpt-root", text(&O::ckpt_root)},
      {"steps", whole(&O::steps)},
      {"batch", whole(&O::batch)},
      {"seq", whole(&O::seq)},
      {"global-batch", [](O& o, S f, S v) { o.global_batch_tokens = integer(f, v); }},
      {"lr", decimal(&O::lr)},
      {"warmup", whole(&O::warmup)},
      {"min-lr-frac", decimal(&O::min_lr_frac)},
      {"weight-decay", decimal(&O::weight_decay)},
      {"grad-clip", decimal(&O::grad_clip)},
      {"seed", [](O& o, S f, S v) { o.seed = static_cast<uint64_t>(integer(f, v)); }},
      {"val-every", whole(&O::val_every)},
      {"val-steps", whole(&O::val_steps)},
      {"sample-every", whole(&O::sample_every)},
      {"sample-tokens", whole(&O::sample_tokens)},
      {"peak-flops", decimal(&O::peak_flops)},
      {"max-bad-steps", whole(&O::max_bad_steps)},
      {"log-json", text(&O::log_json)},
      {"recompute", optional_text(&O::recompute)},
      {"recompute-layers", [](O& o, S f, S v) { o.recompute_layers = small_integer(f, v); }},
      {"offload", [](O& o, S, S v) { o.offload = parse_offload(v); }},
      {"offload-threads", whole(&O::offload_threads)},
      {"tp", whole(&O::tp)},
      {"pp", whole(&O::pp)},
      {"cp", whole(&O::cp)},
      {"zero", whole(&O::zero)},
      {"deterministic", [](O& o, S f, S v) { o.deterministic = switch_value(f, v); }},
      {"sequence-parallel", [](O& o, S f, S v) { o.sequence_parallel = switch_value(f, v); }},
      {"bucket-mb", decimal(&O::bucket_mb)},
      {"ep", whole(&O::ep)},
      {"ep-a2a", text(&O::ep_a2a)},
      {"ep-node-size", whole(&O::ep_node_size)},
      {"dp-split", [](O& o, S f, S v) { o.dp_split = integer_list(f, v); }},
      {"slow-ranks", [](O& o, S f, S v) { o.slow_ranks = integer_list(f, v); }},
      {"slow-factor", decimal(&O::slow_factor)},
      {"metrics-port", [](O& o, S f, S v) { o.metrics_port = small_integer(f, v); }},
      {"metrics-host", text(&O::metrics_host)},
      {"ckpt-dir", text(&O::ckpt_dir)},
      {"ckpt-every", whole(&O::ckpt_every)},
      {"ckpt-keep", whole(&O::ckpt_keep)},
      {"ckpt-async",
       [](O& o, S, S v) {
         if (v != "on" && v != "off") throw ConfigError("--ckpt-async must be on or off");
         o.ckpt_async = v == "on";
       }},
      {"ckpt-shm-every", whole(&O::ckpt_shm_every)},
      {"ckpt-term-budget", decimal(&O::ckpt_term_budget)},
      {"resume", text(&O::resume)},
  };
  return table;
}

// What the command line, the configuration and the environment leave: the environment's fallbacks, then the checks
// that need every layer (a value may come from any of them).
void complete_from_environment(TrainOptions& o) {
  const LauncherEnv& e = o.env;
  if (!o.data && !e.data_dir.empty()) o.data = e.data_dir;
  // The roots: the flag when it is not empty, else the variable the operator sets.
  auto root = [](std::string& value, std::string& name, const char* flag, const std::string& env_value,
                 const char* env_name) {
    if (!value.empty()) {
      name = std::string("--") + flag;
    } else if (!env_value.empty()) {
      value = env_value;
      name = env_name;
    }
  };
  root(o.data_root, o.data_root_name, "data-root", e.data_root, pod_env::kDataRoot);
  root(o.ckpt_root, o.ckpt_root_name, "ckpt-root", e.checkpoint_root, pod_env::kCheckpointRoot);
  // One --metrics-port for a whole --nproc world: rank r serves on P + LOCAL_RANK (0 stays "any free port").
  if (o.metrics_port) {
    if (*o.metrics_port > 0) *o.metrics_port += e.local_rank_number();
  } else if (!e.metrics_port.empty()) {
    char* end = nullptr;
    const long base = std::strtol(e.metrics_port.c_str(), &end, 10);
    if (*end != '\0' || base < 0 || base > 65535)
      throw ConfigError(std::string(pod_env::kMetricsPort) + " '" + e.metrics_port + "' is not a port");
    o.metrics_port = static_cast<int>(base) + e.local_rank_number();
  }
  if (o.metrics_port && (*o.metrics_port < 0 || *o.metrics_port > 65535))
    throw ConfigError("--metrics-port must be in 0..65535");
  if (o.metrics_host.empty()) o.metrics_host = e.pod_ip.empty() ? "127.0.0.1" : e.pod_ip;
  // --resume, else the configuration's restore, else the agent's RAILYARD_RESTORE, else auto; auto with nothing to
  // restore from is never.
  if (!o.has("resume") && !o.configured.count("resume") && !e.restore.empty()) o.resume = e.restore;
  if (o.resume.empty()) o.resume = "auto";
  if (o.resume == "auto" && o.ckpt_dir.empty() && o.ckpt_shm_every == 0) o.resume = "never";
}

void check_ranges(const TrainOptions& o) {
  if (o.threads < 0 || o.threads > 4096) throw ConfigError("--threads must be in 1..4096");
  if (o.zero < 0 || o.zero > 2) throw ConfigError("--zero " + std::to_string(o.zero) + ": must be 0, 1 or 2");
  if (!(o.bucket_mb > 0) || o.bucket_mb > 65536) throw ConfigError("--bucket-mb must be a positive number of MiB");
  if (o.tp < 1 || o.pp < 1) throw ConfigError("--tp and --pp must be >= 1");
  if (o.sequence_parallel && o.tp < 2)
    throw ConfigError("--sequence-parallel needs tensor parallelism: add --tp 2 (or more) or drop the flag");
  if (o.ep_node_size < 0) throw ConfigError("--ep-node-size must be >= 1 (ranks per node)");
  if (o.ep == 1 && (o.has("ep-a2a") || o.has("ep-node-size")))
    throw ConfigError("--ep-a2a/--ep-node-size need --ep N > 1");
  if (o.has("slow-ranks") != o.has("slow-factor"))
    throw ConfigError("--slow-ranks and --slow-factor go together (e.g. --slow-ranks 1 --slow-factor 2)");
  if (!(o.slow_factor >= 1) || !std::isfinite(o.slow_factor)) throw ConfigError("--slow-factor must be a number >= 1");
  for (int r : o.slow_ranks)
    if (r < 0) throw ConfigError("--slow-ranks: ranks are >= 0");
}

}  // namespace

TrainOptions parse_train_options(int argc, char** argv, int first, const LauncherEnv& env) {
  const auto& table = train_flags();
  static const std::vector<std::string> known = train_flag_names();
  TrainOptions o;
  o.env = env;
  for (const auto& [flag, value] : parse_flags(argc, argv, first, known)) {
    table.at(flag)(o, flag, value);
    o.given.insert(flag);
  }
  o.moe_tuning_given = o.has("moe-top-k") || o.has("moe-capacity-factor") || o.has("moe-aux-coef");
  if (o.has("nproc")) {
    // The launcher reads only what it needs; each rank it starts reads the rest (the configuration describes the
    // world the ranks form, not the launcher's).
    if (o.nproc < 1 || o.nproc > 256) throw ConfigError("--nproc must be in 1..256");
    if (o.threads < 0 || o.threads > 4096) throw ConfigError("--threads must be in 1..4096");
    return o;
  }
  if (!o.config.empty()) apply_config_file(o);
  complete_from_environment(o);
  check_ranges(o);
  if (o.threads == 0) o.threads = default_num_threads();
  return o;
}

std::vector<std::string> train_flag_names() {
  std::vector<std::string> out;
  for (const auto& [name, set] : train_flags()) out.push_back(name);
  return out;
}

GemmRateOptions parse_gemm_rate_options(int argc, char** argv, int first) {
  GemmRateOptions o;
  for (const auto& [flag, v] : parse_flags(argc, argv, first, {"model", "batch", "seq", "threads", "split"})) {
    if (flag == "model") o.model = v;
    if (flag == "batch") o.batch = small_integer(flag, v);
    if (flag == "seq") o.seq = small_integer(flag, v);
    if (flag == "threads") o.threads = small_integer(flag, v);
    if (flag == "split") o.split = gemm_split_value(flag, v);
  }
  if (o.threads < 0 || o.threads > 4096) throw ConfigError("--threads must be in 1..4096");
  return o;
}

}  // namespace railyard::worker
