#include "common/job_spec.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <regex>
#include <set>

#include "common/checked_math.h"
#include "common/model_presets.h"
#include "common/path_roots.h"
#include "common/stable_names.h"
#include "common/torchrun.h"

namespace railyard::api {
namespace {

// "spec.parallelism.tensor" -> "InvalidParallelismTensor" (the spec. prefix adds nothing to a reason).
std::string reason_for(const std::string& field) {
  std::string out = "Invalid";
  bool upper = true;
  std::string_view f = field;
  if (f.rfind("spec.", 0) == 0) f.remove_prefix(5);
  for (char c : f) {
    if (c == '.' || c == '[' || c == ']' || c == '-' || c == '_') {
      upper = true;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c))) continue;
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return out;
}

// Collects the first violation; later checks become no-ops so messages stay about the root cause.
class Checker {
 public:
  bool ok() const { return !violation_; }
  void fail(const std::string& field, const std::string& what, const std::string& fix) {
    if (violation_) return;
    violation_ = Violation{field, reason_for(field), field + ": " + what + ": " + fix};
  }
  std::optional<Violation> take() { return std::move(violation_); }

  // Reads an optional integer field of `obj`; type or range errors become violations.
  std::optional<int64_t> integer(const Json& obj, const char* key, const std::string& field, int64_t min, int64_t max) {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return std::nullopt;
    const Json& v = obj[key];
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == std::trunc(v.get<double>()))) {
      fail(field, "must be an integer, got " + v.dump(), "write a whole number");
      return std::nullopt;
    }
    // Beyond int64 (2e116, 18446744073709551615) converting would be undefined or wrap: out of range as written.
    const bool too_big = v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                         : v.is_number_float()  ? !(std::fabs(v.get<double>()) < 9.2e18)
                                                : false;
    if (too_big) {
      fail(field, v.dump() + " is out of range",
           "use a value from " + std::to_string(min) + " to " + std::to_string(max));
      return std::nullopt;
    }
    int64_t x = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
    if (x < min || x > max) {
      fail(field, std::to_string(x) + " is out of range",
           "use a value from " + std::to_string(min) + " to " + std::to_string(max));
      return std::nullopt;
    }
    return x;
  }
  std::optional<double> number(const Json& obj, const char* key, const std::string& field, double min, double max) {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return std::nullopt;
    const Json& v = obj[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      fail(field, "must be a number, got " + v.dump(), "write a decimal number, e.g. 1.25");
      return std::nullopt;
    }
    const double x = v.get<double>();
    if (x < min || x > max) {
      fail(field, v.dump() + " is out of range", "use a value from " + Json(min).dump() + " to " + Json(max).dump());
      return std::nullopt;
    }
    return x;
  }
  // An optional string that must be one of `allowed`.
  std::optional<std::string> one_of(const Json& obj, const char* key, const std::string& field,
                                    std::initializer_list<const char*> allowed) {
    auto v = string(obj, key, field);
    if (!v) return v;
    std::string list;
    for (const char* a : allowed) {
      if (*v == a) return v;
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    fail(field, "'" + *v + "' is not one of " + list, "use one of " + list);
    return std::nullopt;
  }
  // An optional string of at most `max_length` bytes (the CRD's maxLength, for objects that skipped the schema).
  std::optional<std::string> string(const Json& obj, const char* key, const std::string& field,
                                    size_t max_length = kMaxStringLength) {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return std::nullopt;
    if (!obj[key].is_string()) {
      fail(field, "must be a string, got " + obj[key].dump(), "quote the value");
      return std::nullopt;
    }
    const std::string& v = obj[key].get_ref<const std::string&>();
    if (v.size() > max_length) {
      fail(field, "is " + std::to_string(v.size()) + " characters long", "use at most " + std::to_string(max_length));
      return std::nullopt;
    }
    return v;
  }
  // The product of spec values (`names`, e.g. "microBatch*data") in 64 bits: an overflow is a violation on `field`,
  // never a wrapped value (a product that wrapped to 0 once divided the operator by zero: issue #40).
  std::optional<int64_t> product(const std::string& field, const std::string& names,
                                 std::initializer_list<int64_t> factors, const std::string& fix) {
    if (auto p = checked_product(factors)) return p;
    std::string values;
    for (int64_t f : factors) {
      if (!values.empty()) values += '*';
      values += std::to_string(f);
    }
    fail(field, names + " = " + values + " overflows a 64-bit integer", fix);
    return std::nullopt;
  }
  std::optional<bool> boolean(const Json& obj, const char* key, const std::string& field) {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return std::nullopt;
    if (!obj[key].is_boolean()) {
      fail(field, "must be true or false, got " + obj[key].dump(), "write true or false");
      return std::nullopt;
    }
    return obj[key].get<bool>();
  }
  // An optional nested object; a present non-object is a violation. Returns null Json when absent.
  Json object(const Json& obj, const char* key, const std::string& field) {
    if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return Json::object();
    if (!obj[key].is_object()) {
      fail(field, "must be an object, got " + obj[key].dump(), "give a mapping of fields");
      return Json::object();
    }
    return obj[key];
  }

 private:
  std::optional<Violation> violation_;
};

std::string divisors_of(int n) {
  std::string out;
  for (int d = 1; d <= n && out.size() < 40; ++d)
    if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

void read_exit_codes(Checker& c, const Json& fp, const char* key, const std::string& field, std::vector<int>& out) {
  if (!fp.contains(key) || fp[key].is_null()) return;
  if (!fp[key].is_array()) {
    c.fail(field, "must be a list of exit codes, got " + fp[key].dump(), "write e.g. [1, 2]");
    return;
  }
  for (size_t i = 0; i < fp[key].size(); ++i) {
    Json holder = {{"v", fp[key][i]}};
    auto v = c.integer(holder, "v", field + "[" + std::to_string(i) + "]", 1, 255);
    if (v) out.push_back(static_cast<int>(*v));
  }
}

// Deterministic mode folds each rank's micro-batches as the leaves of one fixed binary tree, which only matches the
// tree of another data-parallel degree when every rank holds a whole power-of-two subtree (docs/parallel.md).
bool deterministic_accumulation_ok(const JobSpec& s, int dp) {
  const auto per_step = checked_product({s.micro_batch, dp});
  if (!per_step || *per_step < 1) return false;
  const int64_t per_rank = s.global_batch / *per_step;
  return per_rank > 0 && (per_rank & (per_rank - 1)) == 0;
}

std::vector<std::string> string_list(Checker& c, const Json& obj, const char* key, const std::string& field) {
  std::vector<std::string> out;
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return out;
  if (!obj[key].is_array()) {
    c.fail(field, "must be a list of strings, got " + obj[key].dump(), "write e.g. [python3, train.py]");
    return out;
  }
  // The CRD's bounds (maxItems, items' maxLength), held here too for an operator that reads a job the schema did not
  // check (an older CRD): a program's argv goes into every pod.
  if (obj[key].size() > kMaxProgramArgs) {
    c.fail(field, "has " + std::to_string(obj[key].size()) + " items",
           "use at most " + std::to_string(kMaxProgramArgs) + " (put long argument lists in a file)");
    return out;
  }
  for (size_t i = 0; i < obj[key].size(); ++i) {
    if (!obj[key][i].is_string()) {
      c.fail(field + "[" + std::to_string(i) + "]", "must be a string, got " + obj[key][i].dump(), "quote it");
      return out;
    }
    if (obj[key][i].get_ref<const std::string&>().size() > kMaxProgramArgLength) {
      c.fail(field + "[" + std::to_string(i) + "]",
             "is " + std::to_string(obj[key][i].get_ref<const std::string&>().size()) + " characters long",
             "use at most " + std::to_string(kMaxProgramArgLength));
      return out;
    }
    out.push_back(obj[key][i].get<std::string>());
  }
  return out;
}

// spec.program.launcher: auto (the default) runs torchrun mode when the command is torchrun or `python -m
// torch.distributed.run`, perRank otherwise. In torchrun mode the agent hands torchrun the world through PET_*, which
// a flag on the command line would override: such flags are refused here, naming the element (common/torchrun.h).
void parse_launcher(Checker& c, JobSpec& s, const Json& program) {
  std::string launcher = torchrun::kLauncherAuto;
  if (auto v = c.string(program, "launcher", "spec.program.launcher")) launcher = *v;
  if (!c.ok()) return;
  std::vector<std::string> argv = s.program_command;
  argv.insert(argv.end(), s.program_args.begin(), s.program_args.end());
  if (launcher == torchrun::kLauncherAuto) {
    s.program_torchrun = torchrun::is_torchrun(argv);
  } else if (launcher == torchrun::kLauncherTorchrun) {
    s.program_torchrun = true;
  } else if (launcher == torchrun::kLauncherPerRank) {
    s.program_torchrun = false;
  } else {
    c.fail("spec.program.launcher", "'" + launcher + "' is not a launcher",
           "use auto (torchrun when the command is torchrun), torchrun (one process per pod that starts the local "
           "ranks itself) or perRank (the command once per local rank)");
    return;
  }
  if (!s.program_torchrun) return;
  // A command that is not recognisable torchrun (a shell script that starts it) has no flags to check.
  const auto command = torchrun::parse_command(argv);
  if (!command) return;
  if (auto conflict = torchrun::check_options(*command, s.procs_per_replica)) {
    const size_t i = conflict->index;
    const std::string field = i < s.program_command.size()
                                  ? "spec.program.command[" + std::to_string(i) + "]"
                                  : "spec.program.args[" + std::to_string(i - s.program_command.size()) + "]";
    c.fail(field, conflict->problem, conflict->fix);
  }
}

// spec.program: a job that brings its own program. The built-in trainer's sections do not apply to it, and a
// manifest that sets both is refused naming the section (rather than one of them being silently ignored).
void parse_program(Checker& c, JobSpec& s, const Json& spec) {
  if (!spec.contains("program")) return;
  Json program = c.object(spec, "program", "spec.program");
  if (!c.ok()) return;
  s.program = true;
  s.program_command = string_list(c, program, "command", "spec.program.command");
  if (c.ok() && s.program_command.empty())
    c.fail("spec.program.command", "is missing or empty", "give the program to run, e.g. [python3, /app/train.py]");
  s.program_args = string_list(c, program, "args", "spec.program.args");
  if (auto v = c.integer(program, "totalSteps", "spec.program.totalSteps", 1, kMaxSteps))
    s.steps = static_cast<int>(*v);
  if (auto v = c.one_of(program, "addresses", "spec.program.addresses", {"DNS", "IP"})) s.dns_addresses = *v == "DNS";
  parse_launcher(c, s, program);
  for (const char* section : {"model", "data", "training", "parallelism", "memory"}) {
    if (c.ok() && spec.contains(section))
      c.fail(std::string("spec.") + section, "is for the built-in GPT trainer, but spec.program runs your own program",
             std::string("remove spec.") + section + ", or spec.program to use the built-in trainer");
  }
  if (!c.ok() || !spec.contains("template") || !spec["template"].is_object()) return;
  const Json& t = spec["template"];
  if (t.contains("spec") && t["spec"].is_object() && t["spec"].contains("containers") &&
      t["spec"]["containers"].is_array() && !t["spec"]["containers"].empty() &&
      t["spec"]["containers"][0].is_object()) {
    const Json& c0 = t["spec"]["containers"][0];
    for (const char* key : {"command", "args", "image"})
      if (c.ok() && c0.contains(key))
        c.fail(std::string("spec.template.spec.containers[0].") + key,
               "is set by Railyard for a program job (the launcher runs spec.program in spec.image)",
               std::string("move it to spec.program") + (std::string(key) == "image" ? " (spec.image)" : ""));
  }
}

// The sections of parse_job, in the order of the CRD.
void parse_model(Checker& c, JobSpec& s, const Json& spec) {
  // Model.
  Json model = c.object(spec, "model", "spec.model");
  if (c.ok() && !spec.contains("model"))
    c.fail("spec.model", "is missing",
           "set spec.model.preset (e.g. tiny) or a custom shape, or spec.program to run your own program");
  auto preset = c.string(model, "preset", "spec.model.preset");
  if (c.ok() && !preset)
    c.fail("spec.model.preset", "is missing", "set it to one of " + model_preset_names() + ", custom");
  if (preset) {
    s.preset = *preset;
    if (*preset == "custom") {
      const char* keys[] = {"layers", "hidden", "heads", "seqLen", "vocab"};
      int* dst[] = {&s.model.layers, &s.model.hidden, &s.model.heads, &s.model.seq_len, &s.model.vocab};
      const int64_t maxes[] = {1024, 65536, 1024, 1048576, 1048576};
      for (int i = 0; i < 5; ++i) {
        std::string field = std::string("spec.model.") + keys[i];
        auto v = c.integer(model, keys[i], field, i == 4 ? 2 : 1, maxes[i]);
        if (!v && c.ok())
          c.fail(field, "is required for preset custom", "set every size: layers, hidden, heads, seqLen, vocab");
        if (v) *dst[i] = static_cast<int>(*v);
      }
      if (c.ok() && s.model.hidden % s.model.heads != 0)
        c.fail("spec.model.hidden",
               std::to_string(s.model.hidden) + " is not divisible by heads " + std::to_string(s.model.heads),
               "use a multiple of " + std::to_string(s.model.heads));
    } else if (auto p = find_model_preset(*preset)) {
      s.model = {p->layers, p->hidden, p->heads, p->seq_len, p->vocab};
    } else {
      c.fail("spec.model.preset", "unknown preset '" + *preset + "'",
             "use one of " + model_preset_names() + ", custom");
    }
  }

  // The llm.c model to start from (the worker's --init-from); its shape is the worker's check (the file is on the
  // pods' filesystem).
  if (auto v = c.string(model, "initFrom", "spec.model.initFrom")) {
    if (v->empty())
      c.fail("spec.model.initFrom", "is empty", "give the path of an llm.c GPT-2 model file, or leave it out");
    s.init_from = *v;
  }

  // Mixture of experts (the worker's --moe-*; ranges as worker/model/gpt_config.cc make_moe_config checks them).
  Json moe = c.object(model, "moe", "spec.model.moe");
  if (auto v = c.integer(moe, "experts", "spec.model.moe.experts", 2, 1024))
    s.moe.experts = static_cast<int>(*v);
  else if (c.ok() && !moe.empty())
    c.fail("spec.model.moe.experts", "is missing", "set the experts per layer (2..1024), or drop spec.model.moe");
  if (auto v = c.integer(moe, "topK", "spec.model.moe.topK", 1, 1024)) s.moe.top_k = static_cast<int>(*v);
  if (auto v = c.number(moe, "capacityFactor", "spec.model.moe.capacityFactor", -1e6, 1e6)) s.moe.capacity_factor = *v;
  if (auto v = c.number(moe, "auxLossCoef", "spec.model.moe.auxLossCoef", 0, 1e6)) s.moe.aux_loss_coef = *v;
  if (c.ok() && s.moe.experts > 0 && s.moe.top_k > s.moe.experts)
    c.fail("spec.model.moe.topK",
           std::to_string(s.moe.top_k) + " exceeds the " + std::to_string(s.moe.experts) + " experts",
           "use 1.." + std::to_string(s.moe.experts));
  if (c.ok() && s.moe.experts > 0 && !s.init_from.empty())
    c.fail("spec.model.initFrom", "with spec.model.moe: llm.c GPT-2 files hold dense models only",
           "drop initFrom (random init) or drop spec.model.moe");
}

void parse_data_training(Checker& c, JobSpec& s, const Json& spec) {
  // Data.
  Json data = c.object(spec, "data", "spec.data");
  auto train = c.string(data, "train", "spec.data.train");
  if (c.ok() && (!train || train->empty()))
    c.fail("spec.data.train", "is missing", "set a glob of training shards, e.g. /data/train_*.bin");
  if (train) s.data_train = *train;
  // "" is the same as absent: val_*.bin beside the training shards (the worker's default).
  if (auto val = c.string(data, "val", "spec.data.val")) s.data_val = *val;

  // Training.
  Json training = c.object(spec, "training", "spec.training");
  if (auto v = c.integer(training, "steps", "spec.training.steps", 1, kMaxSteps))
    s.steps = static_cast<int>(*v);
  else if (c.ok())
    c.fail("spec.training.steps", "is missing", "set the number of optimizer steps");
  if (auto v = c.integer(training, "globalBatch", "spec.training.globalBatch", 1, 1 << 30))
    s.global_batch = static_cast<int>(*v);
  if (auto v = c.integer(training, "microBatch", "spec.training.microBatch", 1, 1 << 30))
    s.micro_batch = static_cast<int>(*v);
  s.seq_len = s.model.seq_len;
  if (auto v = c.integer(training, "seqLen", "spec.training.seqLen", 1, 1048576)) {
    s.seq_len = static_cast<int>(*v);
    if (c.ok() && s.model.seq_len > 0 && s.seq_len > s.model.seq_len)
      c.fail("spec.training.seqLen",
             std::to_string(s.seq_len) + " exceeds the model's seqLen " + std::to_string(s.model.seq_len),
             "use at most " + std::to_string(s.model.seq_len) + " or a model with a longer context");
  }
  // The recipe (the worker's --lr, --warmup, ...): types and the schema's bounds, for objects that skipped it.
  Recipe& r = s.recipe;
  r.learning_rate = c.number(training, "learningRate", "spec.training.learningRate", 0, 1e6);
  if (r.learning_rate && *r.learning_rate <= 0)
    c.fail("spec.training.learningRate", "must be greater than 0", "use a positive peak learning rate, e.g. 0.0006");
  r.min_lr_fraction = c.number(training, "minLrFraction", "spec.training.minLrFraction", 0, 1);
  r.weight_decay = c.number(training, "weightDecay", "spec.training.weightDecay", 0, 1e6);
  r.grad_clip = c.number(training, "gradClip", "spec.training.gradClip", 0, 1e12);
  r.warmup_steps = c.integer(training, "warmupSteps", "spec.training.warmupSteps", 0, int64_t{1} << 40);
  r.seed = c.integer(training, "seed", "spec.training.seed", 0, kMaxSeed);
  r.val_every = c.integer(training, "valEvery", "spec.training.valEvery", 0, int64_t{1} << 40);
  r.sample_every = c.integer(training, "sampleEvery", "spec.training.sampleEvery", 0, int64_t{1} << 40);
  r.sample_tokens = c.integer(training, "sampleTokens", "spec.training.sampleTokens", 1, 1048576);
}

void parse_parallelism_memory(Checker& c, JobSpec& s, const Json& spec) {
  // Parallelism.
  Json par = c.object(spec, "parallelism", "spec.parallelism");
  if (auto v = c.boolean(par, "auto", "spec.parallelism.auto")) s.auto_parallel = *v;
  if (auto v = c.integer(par, "tensor", "spec.parallelism.tensor", 1, 1024)) s.tensor = static_cast<int>(*v);
  if (auto v = c.integer(par, "pipeline", "spec.parallelism.pipeline", 1, 1024)) s.pipeline = static_cast<int>(*v);
  if (auto v = c.integer(par, "data", "spec.parallelism.data", 1, 1 << 24)) s.data = static_cast<int>(*v);
  if (auto v = c.integer(par, "zero", "spec.parallelism.zero", 0, 2)) s.zero = static_cast<int>(*v);
  if (auto v = c.integer(par, "expert", "spec.parallelism.expert", 1, 1024)) {
    s.expert = static_cast<int>(*v);
    s.expert_given = true;
  }
  if (auto v = c.one_of(par, "expertAllToAll", "spec.parallelism.expertAllToAll", {"flat", "hierarchical"}))
    s.expert_all_to_all = *v;
  if (auto v = c.boolean(par, "sequenceParallel", "spec.parallelism.sequenceParallel")) s.sequence_parallel = *v;
  if (auto v = c.integer(par, "context", "spec.parallelism.context", 1, 1048576)) s.context = static_cast<int>(*v);
  if (auto v = c.boolean(par, "deterministic", "spec.parallelism.deterministic")) s.deterministic = *v;

  // Memory: recomputation and offload (the worker's --recompute, --recompute-layers, --offload).
  Json mem = c.object(spec, "memory", "spec.memory");
  if (auto v = c.one_of(mem, "recompute", "spec.memory.recompute", {"none", "selective", "full"})) s.recompute = *v;
  if (auto v = c.integer(mem, "recomputeLayers", "spec.memory.recomputeLayers", 0, 1024)) {
    s.recompute_layers = static_cast<int>(*v);
    if (c.ok() && s.model.layers > 0 && s.recompute_layers > s.model.layers)
      c.fail("spec.memory.recomputeLayers",
             std::to_string(s.recompute_layers) + " exceeds the model's " + std::to_string(s.model.layers) + " layers",
             "use 0.." + std::to_string(s.model.layers) + ", or leave it out for every layer");
  }
  if (auto v = c.string(mem, "offload", "spec.memory.offload")) {
    if (*v == "params" || *v == "optimizer,params")
      c.fail("spec.memory.offload", "parameter offload is not implemented",
             "use optimizer (AdamW state in host memory) or none");
    else if (*v != "none" && *v != "optimizer")
      c.fail("spec.memory.offload", "'" + *v + "' is not one of none, optimizer", "use none or optimizer");
    s.offload = *v;
  }
}

// spec.placement.scheduler: a scheduler name as a Pod's schedulerName takes it (a DNS-1123 subdomain). With another
// scheduler than Railyard's, the fields only Railyard's placement reads would silently do nothing: hard mode and
// topology keys are refused (railAware is documented as ignored: its default is true).
void parse_scheduler(Checker& c, JobSpec& s, const Json& placement) {
  auto v = c.string(placement, "scheduler", "spec.placement.scheduler");
  if (!v) return;
  const bool dns_subdomain = !v->empty() && v->size() <= 253 && std::isalnum(static_cast<unsigned char>(v->front())) &&
                             std::isalnum(static_cast<unsigned char>(v->back())) &&
                             std::all_of(v->begin(), v->end(), [](char ch) {
                               return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.';
                             });
  if (!dns_subdomain) {
    c.fail("spec.placement.scheduler", "'" + *v + "' is not a scheduler name (lower-case letters, digits, '-', '.')",
           "use railyard, default-scheduler or the schedulerName your cluster's scheduler serves");
    return;
  }
  s.scheduler = *v;
  if (s.scheduler == kRailyardScheduler) return;
  if (placement.contains("mode") && placement["mode"].is_string() && placement["mode"] == "hard")
    c.fail("spec.placement.mode", "hard is Railyard's own placement, but spec.placement.scheduler is " + s.scheduler,
           "remove mode (or use spec.placement.scheduler railyard)");
  else if (placement.contains("topologyKeys") && placement["topologyKeys"].is_array() &&
           !placement["topologyKeys"].empty())
    c.fail("spec.placement.topologyKeys",
           "only Railyard's placement reads them, but spec.placement.scheduler is " + s.scheduler,
           "remove them (the pod template's affinity reaches " + s.scheduler + "), or use scheduler railyard");
}

// spec.storage: what the claim is made of, and a mount the pod template does not already have.
void parse_storage(Checker& c, JobSpec& s, const Json& spec) {
  if (!spec.is_object() || !spec.contains("storage") || spec["storage"].is_null()) return;
  Json st = c.object(spec, "storage", "spec.storage");
  if (!c.ok()) return;
  StorageSpec out;
  auto size = c.string(st, "size", "spec.storage.size", 64);
  if (!c.ok()) return;
  if (!size) {
    c.fail("spec.storage.size", "is missing", "give the volume's size as a quantity, e.g. 10Gi");
    return;
  }
  if (!is_storage_quantity(*size))
    c.fail("spec.storage.size", "'" + *size + "' is not a size", "write a quantity greater than 0, e.g. 10Gi or 500M");
  out.size = *size;
  out.storage_class = c.string(st, "storageClassName", "spec.storage.storageClassName", 253);
  if (auto v = c.string(st, "accessMode", "spec.storage.accessMode")) {
    if (*v != "ReadWriteMany" && *v != "ReadWriteOnce")
      c.fail("spec.storage.accessMode", "'" + *v + "' is not offered",
             "use ReadWriteMany (pods on several nodes) or ReadWriteOnce (every pod on one node)");
    out.access_mode = *v;
  }
  if (auto v = c.string(st, "mountPath", "spec.storage.mountPath", 1024)) {
    std::string p = *v;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    if (p.empty() || p[0] != '/' || p == "/" || ("/" + p + "/").find("/../") != std::string::npos)
      c.fail("spec.storage.mountPath", "'" + *v + "' is not an absolute directory below /",
             "write an absolute path without '..', e.g. /shared");
    out.mount_path = p;
  }
  if (auto v = c.string(st, "whenDeleted", "spec.storage.whenDeleted")) {
    if (*v != "Delete" && *v != "Retain")
      c.fail("spec.storage.whenDeleted", "'" + *v + "' is not a policy",
             "use Delete (the claim goes with the job) or Retain (it stays, for a later job of this name)");
    out.retain = *v == "Retain";
  }
  if (!c.ok()) return;
  // The template's own volume of that name or mount at that path would make two of each in the pod.
  const Json tspec = spec.contains("template") && spec["template"].is_object() && spec["template"].contains("spec") &&
                             spec["template"]["spec"].is_object()
                         ? spec["template"]["spec"]
                         : Json::object();
  if (tspec.contains("volumes") && tspec["volumes"].is_array())
    for (const Json& v : tspec["volumes"])
      if (v.is_object() && v.value("name", Json()) == kStorageVolumeName)
        c.fail("spec.template.spec.volumes",
               std::string("a volume is named ") + kStorageVolumeName + ", the name of spec.storage's volume",
               "rename the template's volume");
  if (tspec.contains("containers") && tspec["containers"].is_array() && !tspec["containers"].empty() &&
      tspec["containers"][0].is_object() && tspec["containers"][0].contains("volumeMounts") &&
      tspec["containers"][0]["volumeMounts"].is_array())
    for (const Json& m : tspec["containers"][0]["volumeMounts"]) {
      if (!m.is_object() || !m.contains("mountPath") || !m["mountPath"].is_string()) continue;
      std::string p = m["mountPath"].get<std::string>();
      while (p.size() > 1 && p.back() == '/') p.pop_back();
      if (p == out.mount_path)
        c.fail("spec.storage.mountPath",
               "the template's worker container already mounts " + p +
                   (m.contains("name") ? " (" + m["name"].dump() + ")" : ""),
               "choose another spec.storage.mountPath, or remove that mount from the template");
    }
  if (c.ok()) s.storage = out;
}

// spec.initializer.data: sources that can be fetched or read, and a directory to prepare them into.
void parse_initializer(Checker& c, JobSpec& s, const Json& spec) {
  if (!spec.is_object() || !spec.contains("initializer") || spec["initializer"].is_null()) return;
  Json init = c.object(spec, "initializer", "spec.initializer");
  Json data = c.object(init, "data", "spec.initializer.data");
  Json model = c.object(init, "model", "spec.initializer.model");
  if (!c.ok()) return;
  const auto source_ok = [](const std::string& src) {
    return (src.rfind("http://", 0) == 0 && src.size() > 7) || (src.rfind("https://", 0) == 0 && src.size() > 8) ||
           (!src.empty() && src[0] == '/');
  };
  InitializerSpec out;
  if (init.contains("model")) {
    auto src = c.string(model, "source", "spec.initializer.model.source", 4096);
    if (!c.ok()) return;
    if (!src || !source_ok(*src))
      c.fail("spec.initializer.model.source",
             src ? "'" + *src + "' is neither a URL nor an absolute path" : "is missing",
             "write the http(s) URL of an llm.c GPT-2 model file, or its absolute path in the pod");
    else if (s.program)
      c.fail("spec.initializer.model", "a program loads its own model", "fetch it in your program, or drop it");
    else if (s.init_from.empty())
      c.fail("spec.initializer.model", "has nowhere to go: spec.model.initFrom is not given",
             "set spec.model.initFrom to the file the trainer starts from (on a volume the pods mount, e.g. "
             "/shared/model/initial.bin): the initializer fetches the model there");
    else
      out.model_source = *src;
    if (!c.ok()) return;
  }
  if (!init.contains("data")) {
    if (out.model_source.empty())
      c.fail("spec.initializer", "gives neither data nor model", "give data.sources (and/or model.source)");
    else
      s.initializer = out;
    return;
  }
  out.sources = string_list(c, data, "sources", "spec.initializer.data.sources");
  if (!c.ok()) return;
  if (data.contains("image")) {
    Json image = c.object(data, "image", "spec.initializer.data.image");
    if (!c.ok()) return;
    auto ref = c.string(image, "reference", "spec.initializer.data.image.reference", 1024);
    auto path = c.string(image, "path", "spec.initializer.data.image.path", 1024);
    auto policy = c.string(image, "pullPolicy", "spec.initializer.data.image.pullPolicy");
    if (!c.ok()) return;
    const auto printable = [](const std::string& v) {
      return std::all_of(v.begin(), v.end(), [](char ch) { return ch > ' ' && ch < 0x7f; });
    };
    if (!ref || ref->empty())
      c.fail("spec.initializer.data.image.reference", "is missing", "name the image that holds the data");
    else if (!printable(*ref))
      c.fail("spec.initializer.data.image.reference", "holds a space or a character that is not printable ASCII",
             "write the image reference as a container's image field takes it (registry/corpus:v1)");
    else if (!path || path->empty() || (*path)[0] != '/' || ("/" + *path + "/").find("/../") != std::string::npos)
      c.fail("spec.initializer.data.image.path", path ? "'" + *path + "' is not an absolute path" : "is missing",
             "write the absolute path in the image of the file or directory to prepare, e.g. /corpus");
    else if (policy && *policy != "Always" && *policy != "IfNotPresent" && *policy != "Never")
      c.fail("spec.initializer.data.image.pullPolicy", "'" + *policy + "' is not a pull policy",
             "use Always, IfNotPresent or Never (or leave it out: the cluster's default)");
    if (!c.ok()) return;
    out.image = *ref;
    out.image_path = *path;
    out.image_pull_policy = policy.value_or("");
    const Json* tvols = nullptr;
    if (spec.contains("template") && spec["template"].is_object() && spec["template"].contains("spec") &&
        spec["template"]["spec"].is_object() && spec["template"]["spec"].contains("volumes"))
      tvols = &spec["template"]["spec"]["volumes"];
    if (tvols != nullptr && tvols->is_array())
      for (const Json& v : *tvols)
        if (v.is_object() && v.value("name", Json()) == kImageDataVolumeName)
          c.fail("spec.template.spec.volumes",
                 std::string("a volume is named ") + kImageDataVolumeName +
                     ", the name of the initializer's volume for spec.initializer.data.image",
                 "rename the template's volume");
    if (!c.ok()) return;
  }
  if ((out.sources.empty() && out.image.empty()) || out.sources.size() > kMaxInitializerSources) {
    c.fail("spec.initializer.data.sources",
           out.sources.empty() ? std::string("is missing or empty, and there is no data.image")
                               : "has " + std::to_string(out.sources.size()) + " items",
           "give 1 to " + std::to_string(kMaxInitializerSources) +
               " http(s) URLs or absolute file paths (concatenate many small files into one), or data.image");
    return;
  }
  for (size_t i = 0; i < out.sources.size(); ++i) {
    const std::string& src = out.sources[i];
    if (!source_ok(src))
      c.fail("spec.initializer.data.sources[" + std::to_string(i) + "]",
             "'" + src + "' is neither a URL nor an absolute path",
             "write an http:// or https:// URL, or the absolute path of a file in the pod (a volume of spec.template)");
  }
  if (auto v = c.string(data, "tokenizer", "spec.initializer.data.tokenizer")) {
    if (*v != "bytes" && *v != "gpt2")
      c.fail("spec.initializer.data.tokenizer", "'" + *v + "' is not known", "use bytes or gpt2");
    out.tokenizer = *v;
  }
  if (auto v = c.number(data, "valFraction", "spec.initializer.data.valFraction", 0, 0.999999)) out.val_fraction = *v;
  if (auto v = c.string(data, "output", "spec.initializer.data.output", 1024)) {
    if (v->empty() || (*v)[0] != '/' || ("/" + *v + "/").find("/../") != std::string::npos)
      c.fail("spec.initializer.data.output", "'" + *v + "' is not an absolute path",
             "write the directory the shards go to, e.g. /shared/data");
    out.output = *v;
  } else if (s.storage) {
    out.output = s.storage->mount_path + "/data";
  } else {
    c.fail("spec.initializer.data.output", "is missing and the job has no spec.storage",
           "give the directory (on a volume every pod mounts) the shards go to, or add spec.storage (then it is "
           "<mountPath>/data)");
  }
  if (c.ok()) s.initializer = out;
}

void parse_checkpoint_policies(Checker& c, JobSpec& s, const Json& spec) {
  // Checkpoint and placement: types only (their semantics belong to the worker and the scheduler).
  Json ckpt = c.object(spec, "checkpoint", "spec.checkpoint");
  s.checkpoint = spec.is_object() && spec.contains("checkpoint") && spec["checkpoint"].is_object();
  if (auto path = c.string(ckpt, "path", "spec.checkpoint.path")) s.checkpoint_path = *path;
  if (auto v = c.integer(ckpt, "intervalSteps", "spec.checkpoint.intervalSteps", 1, int64_t{1} << 40))
    s.checkpoint_interval_steps = *v;
  s.checkpoint_keep = c.integer(ckpt, "keep", "spec.checkpoint.keep", 1, 1000000);
  s.checkpoint_async = c.boolean(ckpt, "async", "spec.checkpoint.async");
  if (auto v = c.integer(ckpt, "memoryIntervalSteps", "spec.checkpoint.memoryIntervalSteps", 0, int64_t{1} << 40))
    s.memory_interval_steps = *v;
  Json placement = c.object(spec, "placement", "spec.placement");
  Json selector = c.object(placement, "nodeSelector", "spec.placement.nodeSelector");
  for (auto it = selector.begin(); it != selector.end(); ++it) {
    if (!it.value().is_string())
      c.fail("spec.placement.nodeSelector." + it.key(), "must be a string", "quote the label value");
    else
      s.node_selector[it.key()] = it.value().get<std::string>();
  }
  parse_scheduler(c, s, placement);

  // Failure and run policy.
  Json fp = c.object(spec, "failurePolicy", "spec.failurePolicy");
  if (auto v = c.integer(fp, "maxRestarts", "spec.failurePolicy.maxRestarts", 0, 1000000))
    s.max_restarts = static_cast<int>(*v);
  if (auto v = c.integer(fp, "hangTimeoutSeconds", "spec.failurePolicy.hangTimeoutSeconds", 1, kMaxSeconds))
    s.hang_timeout_seconds = *v;
  if (auto v =
          c.number(fp, "stragglerFactor", "spec.failurePolicy.stragglerFactor", 1, std::numeric_limits<double>::max()))
    s.straggler_factor = *v;
  if (auto v = c.boolean(fp, "excludeFailedNodes", "spec.failurePolicy.excludeFailedNodes"))
    s.exclude_failed_nodes = *v;
  read_exit_codes(c, fp, "permanentExitCodes", "spec.failurePolicy.permanentExitCodes", s.permanent_exit_codes);
  read_exit_codes(c, fp, "retryableExitCodes", "spec.failurePolicy.retryableExitCodes", s.retryable_exit_codes);
  for (int code : s.permanent_exit_codes)
    if (std::find(s.retryable_exit_codes.begin(), s.retryable_exit_codes.end(), code) != s.retryable_exit_codes.end())
      c.fail("spec.failurePolicy.retryableExitCodes",
             "exit code " + std::to_string(code) + " is also in permanentExitCodes", "list each code in one list only");
  Json rp = c.object(spec, "runPolicy", "spec.runPolicy");
  s.active_deadline_seconds =
      c.integer(rp, "activeDeadlineSeconds", "spec.runPolicy.activeDeadlineSeconds", 1, kMaxSeconds);
  s.ttl_seconds_after_finished =
      c.integer(rp, "ttlSecondsAfterFinished", "spec.runPolicy.ttlSecondsAfterFinished", 0, kMaxSeconds);
  if (auto v = c.boolean(rp, "suspend", "spec.runPolicy.suspend")) s.suspend = *v;
  if (auto v = c.string(rp, "cleanPodPolicy", "spec.runPolicy.cleanPodPolicy")) {
    if (*v != "All" && *v != "Running" && *v != "None")
      c.fail("spec.runPolicy.cleanPodPolicy", "'" + *v + "' is not a policy", "use All, Running or None");
    s.clean_pod_policy = *v;
  }
  if (spec.contains("template") && !spec["template"].is_null()) {
    const Json& t = spec["template"];
    if (!t.is_object()) {
      c.fail("spec.template", "must be an object, got " + t.dump(), "give a pod template (metadata, spec)");
    } else {
      Json tspec = c.object(t, "spec", "spec.template.spec");
      c.object(t, "metadata", "spec.template.metadata");
      if (tspec.contains("containers")) {
        const Json& cs = tspec["containers"];
        if (!cs.is_array())
          c.fail("spec.template.spec.containers", "must be a list", "give a list of containers");
        else
          for (size_t i = 0; i < cs.size(); ++i) {
            std::string f = "spec.template.spec.containers[" + std::to_string(i) + "]";
            if (!cs[i].is_object()) {
              c.fail(f, "must be an object", "give name, command, args, env");
              continue;
            }
            for (const char* k : {"command", "args"}) {
              if (!cs[i].contains(k)) continue;
              bool good = cs[i][k].is_array() &&
                          std::all_of(cs[i][k].begin(), cs[i][k].end(), [](const Json& x) { return x.is_string(); });
              if (!good) c.fail(f + "." + k, "must be a list of strings", "write e.g. [\"sh\", \"-c\", \"...\"]");
            }
          }
      }
    }
  }
}

void check_cross_fields(Checker& c, JobSpec& s) {
  // Cross-field checks.
  if (c.ok() && s.min_replicas && s.max_replicas && *s.min_replicas > *s.max_replicas)
    c.fail("spec.elastic.minReplicas",
           std::to_string(*s.min_replicas) + " is greater than maxReplicas " + std::to_string(*s.max_replicas),
           "make minReplicas <= maxReplicas");
  if (c.ok() && s.min_replicas && s.replicas < *s.min_replicas)
    c.fail("spec.replicas",
           std::to_string(s.replicas) + " is below elastic.minReplicas " + std::to_string(*s.min_replicas),
           "scale to at least " + std::to_string(*s.min_replicas));
  if (c.ok() && s.max_replicas && s.replicas > *s.max_replicas)
    c.fail("spec.replicas",
           std::to_string(s.replicas) + " is above elastic.maxReplicas " + std::to_string(*s.max_replicas),
           "scale to at most " + std::to_string(*s.max_replicas));
  if (c.ok() && s.auto_parallel && s.context > 1)
    c.fail("spec.parallelism.context",
           std::to_string(s.context) + " with auto: the planner chooses context parallelism itself",
           "drop context (auto uses it when no layout fits without), or give the degrees yourself (auto false)");
  if (c.ok() && !s.auto_parallel) {
    // Products in 64 bits, checked: context alone reaches 2^20 and data 2^24, so tensor*pipeline*context and
    // data*(...) overflow an int (a wrapped 0 was a divisor below: issue #40).
    const std::string tpc_field = s.context > 1 ? "spec.parallelism.context" : "spec.parallelism.pipeline";
    const std::string tpc_names = s.context > 1 ? "context*tensor*pipeline" : "tensor*pipeline";
    const std::string degrees = s.context > 1 ? "data*context*tensor*pipeline" : "data*tensor*pipeline";
    const auto world =
        c.product("spec.replicas", "replicas*procsPerReplica", {s.replicas, s.procs_per_replica}, "use fewer replicas");
    const auto tpc = c.product(tpc_field, tpc_names, {s.tensor, s.pipeline, s.context},
                               "choose degrees whose product divides replicas*procsPerReplica");
    const auto all_degrees =
        s.data && tpc ? c.product("spec.parallelism.data", degrees, {*s.data, *tpc}, "leave data out") : tpc;
    if (!c.ok()) return;
    if (s.model.heads % s.tensor != 0)
      c.fail("spec.parallelism.tensor",
             std::to_string(s.tensor) + " does not divide the model's " + std::to_string(s.model.heads) + " heads",
             "use one of " + divisors_of(s.model.heads));
    else if (s.tensor > s.procs_per_replica)
      c.fail("spec.parallelism.tensor",
             std::to_string(s.tensor) + " exceeds procsPerReplica " + std::to_string(s.procs_per_replica),
             "keep tensor groups inside one pod: tensor <= procsPerReplica");
    else if (s.procs_per_replica % s.tensor != 0)
      c.fail("spec.parallelism.tensor",
             std::to_string(s.tensor) + " does not divide procsPerReplica " + std::to_string(s.procs_per_replica),
             "use one of " + divisors_of(s.procs_per_replica));
    else if (s.model.layers % s.pipeline != 0)
      c.fail("spec.parallelism.pipeline",
             std::to_string(s.pipeline) + " does not divide the model's " + std::to_string(s.model.layers) + " layers",
             "use one of " + divisors_of(s.model.layers));
    else if (s.data && *all_degrees != *world)
      c.fail("spec.parallelism.data",
             degrees + " = " + std::to_string(*all_degrees) +
                 " differs from the world size replicas*procsPerReplica = " + std::to_string(*world),
             "set data to " +
                 (*world % *tpc == 0
                      ? std::to_string(*world / *tpc)
                      : std::string(s.context > 1 ? "world/(context*tensor*pipeline)" : "world/(tensor*pipeline)")) +
                 " or leave it out");
    else if (*world % *tpc != 0)
      c.fail(tpc_field,
             tpc_names + " = " + std::to_string(*tpc) + " does not divide the world size " + std::to_string(*world),
             "choose degrees whose product divides replicas*procsPerReplica");
  }
  // With auto the planner picks degrees and micro-batch that divide the batch (or says why none does).
  if (c.ok() && !s.auto_parallel) {
    const int dp = world_layout(s, s.replicas).data;
    const auto per_step =
        c.product("spec.training.microBatch", "microBatch*data", {s.micro_batch, dp}, "use a smaller microBatch");
    if (!per_step) return;
    if (s.micro_batch > s.global_batch)
      // A step's batch is split into micro-batches: one larger than the whole batch is the field to fix (and the
      // modulo below would suggest a "multiple" beyond globalBatch's own maximum).
      c.fail("spec.training.microBatch",
             std::to_string(s.micro_batch) + " exceeds globalBatch " + std::to_string(s.global_batch) +
                 " (microBatch*data = " + std::to_string(s.micro_batch) + "*" + std::to_string(dp) + " = " +
                 std::to_string(*per_step) + ")",
             s.global_batch >= dp
                 ? "use a microBatch that divides globalBatch/data = " + std::to_string(s.global_batch / dp)
                 : "use microBatch 1 and raise globalBatch to a multiple of data " + std::to_string(dp) +
                       ", or use fewer replicas");
    else if (s.global_batch % *per_step != 0)
      c.fail("spec.training.globalBatch",
             std::to_string(s.global_batch) +
                 " is not divisible by microBatch*data = " + std::to_string(s.micro_batch) + "*" + std::to_string(dp),
             "use a multiple of " + std::to_string(*per_step));
    else if (s.deterministic && dp > 1 && !deterministic_accumulation_ok(s, dp))
      c.fail("spec.parallelism.deterministic",
             "needs a power-of-two gradient accumulation per rank, but globalBatch/(microBatch*data) = " +
                 std::to_string(s.global_batch) + "/(" + std::to_string(s.micro_batch) + "*" + std::to_string(dp) +
                 ") = " + std::to_string(s.global_batch / *per_step),
             "choose globalBatch, microBatch and replicas so that it is 1, 2, 4, 8, ..., or set deterministic false");
  }
}

}  // namespace

ParsedJob parse_job(const Json& job) {
  ParsedJob out;
  JobSpec& s = out.spec;
  Checker c;
  if (!job.is_object()) {
    c.fail("metadata", "the object is not a JSON object", "apply a TrainingJob manifest");
    out.violation = c.take();
    return out;
  }
  // Type-checked reads: Json::value() throws on a non-object metadata or a non-string name, and nothing here throws.
  const Json meta = job.contains("metadata") && job["metadata"].is_object() ? job["metadata"] : Json::object();
  auto meta_string = [&meta](const char* key) {
    return meta.contains(key) && meta[key].is_string() ? meta[key].get<std::string>() : std::string();
  };
  s.name = meta_string("name");
  s.ns = meta_string("namespace");
  if (s.name.size() > kMaxJobNameLength)
    c.fail("metadata.name", "'" + s.name + "' is " + std::to_string(s.name.size()) + " characters long",
           "use at most " + std::to_string(kMaxJobNameLength) + " so pod names and labels fit in 63");
  // The job's headless Service takes its name (a DNS-1035 label) and each pod's hostname is <job>-worker-<index>
  // (a DNS-1123 label): a name the API server accepts for a custom resource (a DNS subdomain: dots, a leading digit)
  // may be neither. Kubeflow's training-operator and JobSet hold their jobs' names to the same rule.
  if (c.ok() && !s.name.empty() && !names::is_dns1035_label(s.name))
    c.fail("metadata.name", "'" + s.name + "' is not a DNS-1035 label",
           "use lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (it names "
           "the job's headless Service and its pods' hostnames)");
  if (!job.contains("spec") || !job["spec"].is_object()) {
    c.fail("spec", "is missing or not an object", "give spec.model, spec.data and spec.training, or spec.program");
    out.violation = c.take();
    return out;
  }
  const Json& spec = job["spec"];

  if (auto v = c.integer(spec, "replicas", "spec.replicas", 1, kMaxReplicas)) s.replicas = static_cast<int>(*v);
  if (auto v = c.integer(spec, "procsPerReplica", "spec.procsPerReplica", 1, 64))
    s.procs_per_replica = static_cast<int>(*v);
  if (auto v = c.string(spec, "device", "spec.device")) {
    if (*v != "auto" && *v != "cpu" && *v != "cuda")
      c.fail("spec.device", "'" + *v + "' is not a device", "use auto, cpu or cuda");
    s.device = *v;
  }
  if (auto v = c.string(spec, "image", "spec.image")) s.image = *v;

  Json elastic = c.object(spec, "elastic", "spec.elastic");
  if (auto v = c.integer(elastic, "minReplicas", "spec.elastic.minReplicas", 1, kMaxReplicas))
    s.min_replicas = static_cast<int>(*v);
  if (auto v = c.integer(elastic, "maxReplicas", "spec.elastic.maxReplicas", 1, kMaxReplicas))
    s.max_replicas = static_cast<int>(*v);

  // Each pod's hostname is <job>-worker-<index>: at most 63 characters for the highest index the job can reach.
  if (c.ok() && !s.name.empty()) {
    const int most = std::max(s.replicas, s.max_replicas.value_or(0));
    const size_t host = worker_hostname_length(s.name.size(), most);
    if (host > names::kMaxLabelLength)
      c.fail("metadata.name",
             "'" + s.name + "' is " + std::to_string(s.name.size()) + " characters long: the hostname of pod " +
                 s.name + "-worker-" + std::to_string(most - 1) + " would be " + std::to_string(host) + " (at most " +
                 std::to_string(names::kMaxLabelLength) + ")",
             "use at most " + std::to_string(s.name.size() - (host - names::kMaxLabelLength)) +
                 " characters for a job of " + std::to_string(most) + " replicas");
  }

  parse_program(c, s, spec);
  if (!s.program) {
    parse_model(c, s, spec);
    parse_data_training(c, s, spec);
    parse_parallelism_memory(c, s, spec);
  }
  parse_checkpoint_policies(c, s, spec);
  parse_storage(c, s, spec);
  parse_initializer(c, s, spec);
  if (!s.program) check_cross_fields(c, s);
  out.violation = c.take();
  // With auto the planner picks the degrees the family checks need; plan_parallelism checks its choice.
  if (!out.violation && !s.auto_parallel && !s.program) out.violation = check_family(s, s.replicas);
  return out;
}

bool is_storage_quantity(const std::string& q) {
  // A number, then nothing, a binary suffix (Ki .. Ei), a decimal one (k, M .. E) or an exponent.
  static const std::regex kQuantity(R"(^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|[eE][+]?[0-9]+)?$)");
  std::smatch m;
  if (q.size() > 64 || !std::regex_match(q, m, kQuantity)) return false;
  return std::stod(m[1].str()) > 0;
}

size_t worker_hostname_length(size_t job_name_length, int replicas) {
  return job_name_length + std::string("-worker-").size() + std::to_string(std::max(0, replicas - 1)).size();
}

WorldLayout world_layout(const JobSpec& spec, int replicas) {
  WorldLayout w;
  // A validated spec keeps these products small (kMaxReplicas x 64); checked all the same, so that a spec that was
  // not validated gives a wrong layout rather than undefined behaviour.
  w.size = static_cast<int>(checked_product({replicas, spec.procs_per_replica}, INT_MAX).value_or(INT_MAX));
  // With auto, the controller writes the planned degrees into the spec (apply_plan) before asking for the layout.
  w.tensor = spec.tensor;
  w.pipeline = spec.pipeline;
  w.context = std::max(1, spec.context);
  w.expert = std::max(1, spec.expert);
  const int64_t tpc = checked_product({w.tensor, w.pipeline, w.context}).value_or(INT64_MAX);
  w.data = static_cast<int>(std::max<int64_t>(1, w.size / std::max<int64_t>(1, tpc)));
  return w;
}

int elastic_world_replicas(const JobSpec& spec, int available) {
  if (!spec.min_replicas || spec.data) return 0;
  // A program's world is any size in range: it reads WORLD_SIZE (the built-in trainer's batch rules do not apply).
  if (spec.program) {
    const int k = std::min(available, spec.replicas);
    return k >= *spec.min_replicas && k >= 1 ? k : 0;
  }
  for (int k = std::min(available, spec.replicas); k >= *spec.min_replicas && k >= 1; --k) {
    WorldLayout w = world_layout(spec, k);
    const auto tpc = checked_product({w.tensor, w.pipeline, w.context});
    if (!tpc || *tpc < 1 || w.size % *tpc != 0) continue;
    // Expert-parallel groups are made of data-parallel ranks: a world the degree does not divide makes the worker
    // exit 2.
    if ((w.data * w.context) % w.expert != 0) continue;
    const auto per_step = checked_product({spec.micro_batch, w.data});
    if (!per_step || *per_step < 1 || spec.global_batch % *per_step != 0) continue;
    if (spec.deterministic && w.data > 1 && !deterministic_accumulation_ok(spec, w.data)) continue;
    return k;
  }
  return 0;
}

std::optional<Violation> check_family(const JobSpec& s, int replicas) {
  Checker c;
  const WorldLayout w = world_layout(s, replicas);
  const int dp_ranks = w.data * w.context;  // the worker's data-parallel group (context ranks share a replica)
  // Mixture of experts: the worker runs experts with data, expert, tensor and pipeline parallelism (GptStage), not with
  // context parallelism; and its deterministic mode with expert parallelism needs the data-parallel path (no tp/pp).
  if (s.moe.experts > 0 && w.context > 1)
    c.fail("spec.model.moe",
           "experts with context " + std::to_string(w.context) +
               ": mixture-of-experts layers are not built for context parallelism",
           "set spec.parallelism.context to 1, or drop spec.model.moe");
  if (s.moe.experts > 0 && s.expert > 1 && s.deterministic && (w.tensor > 1 || w.pipeline > 1))
    c.fail("spec.parallelism.deterministic",
           "with expert " + std::to_string(s.expert) + " and tensor " + std::to_string(w.tensor) + ", pipeline " +
               std::to_string(w.pipeline) +
               ": the tensor/pipeline stage does not return expert gradients to their tokens' ranks",
           "set deterministic false, expert 1, or tensor and pipeline 1");
  if (s.expert > 1) {
    if (s.moe.experts == 0)
      c.fail("spec.parallelism.expert", std::to_string(s.expert) + " needs a mixture-of-experts model",
             "set spec.model.moe.experts (a multiple of " + std::to_string(s.expert) + "), or expert 1");
    else if (s.moe.experts % s.expert != 0)
      c.fail("spec.parallelism.expert",
             std::to_string(s.expert) + " does not divide the " + std::to_string(s.moe.experts) + " experts",
             "use one of " + divisors_of(s.moe.experts));
    else if (dp_ranks % s.expert != 0)
      c.fail("spec.parallelism.expert",
             std::to_string(s.expert) + " does not divide the data-parallel degree " + std::to_string(dp_ranks) +
                 " (expert-parallel groups are made of data-parallel ranks)",
             "use one of " + divisors_of(std::gcd(s.moe.experts, dp_ranks)) +
                 ", or replicas*procsPerReplica a multiple of " +
                 std::to_string(checked_product({s.expert, w.tensor, w.pipeline}).value_or(0)));
  }
  // On CUDA the worker runs expert parallelism in the plain data-parallel path with the flat exchange only
  // (docs/gpu.md): the rest is refused here, naming the worker's fixes, rather than by pods that exit 2.
  if (s.device == "cuda" && s.moe.experts > 0 && s.expert > 1) {
    if (w.tensor > 1 || w.pipeline > 1)
      c.fail("spec.parallelism.expert",
             std::to_string(s.expert) + " with device cuda and tensor " + std::to_string(w.tensor) + ", pipeline " +
                 std::to_string(w.pipeline) +
                 ": expert parallelism inside a tensor/pipeline stage runs on the CPU only",
             "set spec.device cpu, tensor and pipeline 1, or expert 1");
    else if (s.expert_all_to_all == "hierarchical")
      c.fail("spec.parallelism.expertAllToAll",
             "hierarchical with device cuda: the hierarchical exchange stages its chunks in host memory",
             "use flat, or spec.device cpu");
  }
  // Hierarchical groups the ranks of one pod (LOCAL_WORLD_SIZE): a pod's ranks must tile the expert group.
  if (s.expert > 1 && s.expert_all_to_all == "hierarchical" && s.procs_per_replica < s.expert &&
      s.expert % s.procs_per_replica != 0)
    c.fail("spec.parallelism.expertAllToAll",
           "hierarchical needs the expert degree " + std::to_string(s.expert) +
               " to be a multiple of procsPerReplica " + std::to_string(s.procs_per_replica) +
               " (the ranks of one pod are exchanged first)",
           "use flat, or an expert degree that is a multiple of procsPerReplica");
  if (s.expert == 1 && s.expert_all_to_all == "hierarchical" && !s.auto_parallel)
    c.fail("spec.parallelism.expertAllToAll", "hierarchical without expert parallelism (expert 1) exchanges nothing",
           "set spec.parallelism.expert > 1, or drop expertAllToAll");
  // Up to 2^30 x 2^20: 64 bits (an int overflowed here).
  const int64_t tokens = checked_product({s.micro_batch, s.seq_len / std::max(1, w.context)}).value_or(0);
  if (s.sequence_parallel) {
    if (w.tensor < 2)
      c.fail("spec.parallelism.sequenceParallel",
             "needs tensor parallelism (it splits the tensor group's layernorm regions along the sequence)",
             "set spec.parallelism.tensor to 2 or more, or drop sequenceParallel");
    else if (w.context > 1)
      c.fail("spec.parallelism.sequenceParallel", "with context " + std::to_string(w.context) + " is not implemented",
             "use one of sequenceParallel and context");
    else if (tokens % w.tensor != 0)
      c.fail("spec.parallelism.sequenceParallel",
             "the micro-batch's microBatch*seqLen = " + std::to_string(tokens) +
                 " tokens are not divisible by tensor " + std::to_string(w.tensor),
             "choose spec.training.microBatch or seqLen so that it is");
  }
  if (w.context > 1) {
    if (s.seq_len % w.context != 0)
      c.fail("spec.parallelism.context",
             std::to_string(w.context) + " does not divide the sequence length " + std::to_string(s.seq_len),
             "use one of " + divisors_of(s.seq_len) + " (each rank holds seqLen/context positions)");
    else if (s.deterministic)
      c.fail("spec.parallelism.context", "with deterministic is not implemented",
             "set deterministic false or context 1");
  }
  if (s.offload == "optimizer") {
    if (s.zero > 0)
      c.fail("spec.memory.offload",
             "optimizer with zero " + std::to_string(s.zero) + ": the sharded ZeRO optimizer is not offloaded",
             "set spec.parallelism.zero 0, or offload none");
    else if (w.tensor > 1 || w.pipeline > 1 || w.context > 1)
      c.fail("spec.memory.offload",
             "optimizer with tensor/pipeline/context parallelism: only the plain and data-parallel model offloads",
             "set tensor, pipeline and context to 1, or offload none");
  }
  return c.take();
}

WorkerConfig resolved_config(const JobSpec& spec, int replicas) {
  const WorldLayout w = world_layout(spec, replicas);
  // Unknown values (0, "": a preset's shape, a program's steps) are left out for the worker's defaults.
  auto opt = [](const std::string& v) { return v.empty() ? std::nullopt : std::optional<std::string>(v); };
  auto pos = [](int64_t v) { return v > 0 ? std::optional<int>(static_cast<int>(v)) : std::nullopt; };
  WorkerConfig c;
  // The grid the rendezvous checks (dp x tp x pp = world): the worker's data-parallel group, whose blocks of cp
  // consecutive ranks share a replica's sequences.
  c.layout = WorkerConfig::Layout{w.size, w.data * w.context, w.tensor, w.pipeline, spec.procs_per_replica, replicas};
  c.device = spec.device;
  WorkerConfig::Checkpoint& ck = c.checkpoint.emplace();
  ck.path = opt(spec.checkpoint_path);
  if (spec.checkpoint_interval_steps > 0) ck.interval_steps = spec.checkpoint_interval_steps;
  ck.keep = spec.checkpoint_keep;
  ck.async = spec.checkpoint_async;
  ck.memory_interval_steps = spec.memory_interval_steps;  // 0 (off) when the spec does not set it
  if (spec.program) return c;  // the user's program: no model, data, training, parallelism or memory sections

  WorkerConfig::Model& model = c.model.emplace();
  model.preset = opt(spec.preset);
  model.layers = pos(spec.model.layers);
  model.hidden = pos(spec.model.hidden);
  model.heads = pos(spec.model.heads);
  model.seq_len = pos(spec.model.seq_len);
  model.vocab = pos(spec.model.vocab);
  model.init_from = opt(spec.init_from);
  if (spec.moe.experts > 0)
    model.moe = WorkerConfig::Moe{spec.moe.experts, spec.moe.top_k, spec.moe.capacity_factor, spec.moe.aux_loss_coef};

  WorkerConfig::Training& t = c.training.emplace();
  if (spec.steps > 0) t.steps = spec.steps;
  t.global_batch = spec.global_batch;  // sequences
  t.micro_batch = spec.micro_batch;
  t.seq_len = pos(spec.seq_len);
  t.grad_accumulation =
      pos(spec.global_batch / std::max<int64_t>(1, checked_product({spec.micro_batch, w.data}).value_or(INT64_MAX)));
  const Recipe& r = spec.recipe;
  t.learning_rate = r.learning_rate;
  t.min_lr_fraction = r.min_lr_fraction;
  t.weight_decay = r.weight_decay;
  t.grad_clip = r.grad_clip;
  t.warmup_steps = r.warmup_steps;
  t.seed = r.seed;
  t.val_every = r.val_every;
  t.sample_every = r.sample_every;
  t.sample_tokens = r.sample_tokens;

  // Globs of shards; val only when given (else the worker's default, val_*.bin beside the training shards).
  c.data = WorkerConfig::Data{opt(spec.data_train), opt(spec.data_val)};

  // Everything resolved: the ZeRO stage (the planned one with auto), the family's degrees.
  WorkerConfig::Parallelism& p = c.parallelism.emplace();
  p.zero = spec.zero;
  p.deterministic = spec.deterministic;
  p.expert = w.expert;
  // Only with expert > 1: the worker refuses --ep-a2a alone.
  if (w.expert > 1) p.expert_all_to_all = spec.expert_all_to_all.empty() ? "flat" : spec.expert_all_to_all;
  p.sequence_parallel = spec.sequence_parallel;
  p.context = w.context;
  WorkerConfig::Memory& m = c.memory.emplace();
  m.recompute = spec.recompute.empty() ? "none" : spec.recompute;
  m.offload = spec.offload.empty() ? "none" : spec.offload;
  if (spec.recompute_layers >= 0) m.recompute_layers = spec.recompute_layers;
  return c;
}

std::optional<Violation> check_path_roots(const JobSpec& spec, const PathRoots& roots) {
  const struct {
    const char* field;
    const std::string& path;
    const std::string& root;
    const char* flag;
  } checks[] = {{"spec.data.train", spec.data_train, roots.data, "--data-root"},
                {"spec.data.val", spec.data_val, roots.data, "--data-root"},
                {"spec.checkpoint.path", spec.checkpoint_path, roots.checkpoint, "--checkpoint-root"}};
  for (const auto& c : checks) {
    if (c.path.empty()) continue;
    if (auto msg = paths::check_within(c.field, c.path, c.root, std::string("the operator's ") + c.flag, false))
      return Violation{c.field, "PathOutsideRoot", *msg};
  }
  // spec.model.initFrom is read: under either root (a data set's model or an earlier job's export), as the worker's
  // --init-from.
  if (!spec.init_from.empty() && (!roots.data.empty() || !roots.checkpoint.empty())) {
    const char* field = "spec.model.initFrom";
    auto in_data = paths::check_within(field, spec.init_from, roots.data, "the operator's --data-root", false);
    auto in_ckpt =
        paths::check_within(field, spec.init_from, roots.checkpoint, "the operator's --checkpoint-root", false);
    if ((roots.data.empty() || in_data) && (roots.checkpoint.empty() || in_ckpt)) {
      const bool relative = spec.init_from.front() != '/';
      if (roots.data.empty() || roots.checkpoint.empty() || relative)
        return Violation{field, "PathOutsideRoot", in_data ? *in_data : *in_ckpt};
      return Violation{field, "PathOutsideRoot",
                       std::string(field) + " '" + spec.init_from + "' is outside both the operator's --data-root " +
                           roots.data + " and --checkpoint-root " + roots.checkpoint +
                           ": use a model file under one of them or ask the platform team to widen a root"};
    }
  }
  return std::nullopt;
}

std::string progress_text(int64_t step, int total_steps) {
  return total_steps > 0 ? std::to_string(step) + "/" + std::to_string(total_steps) : std::to_string(step);
}

}  // namespace railyard::api
