#include "common/worker_config.h"

#include <limits>

namespace railyard {
namespace {

using Json = nlohmann::json;

// Writing: an unset field is left out.
template <class T>
void put(Json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

// Reading: `path` is the section ("training"), for messages.
class Reader {
 public:
  Reader(const Json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) throw WorkerConfigError(where() + " must be an object");
  }
  const Json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  template <class Int>
  void integer(const char* key, std::optional<Int>& out, int64_t min = 0) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_number_integer() || v->get<int64_t>() < min ||
        v->get<int64_t>() > static_cast<int64_t>(std::numeric_limits<Int>::max()))
      throw WorkerConfigError(name(key) + " must be an integer >= " + std::to_string(min) + ", got " + v->dump());
    out = static_cast<Int>(v->get<int64_t>());
  }
  void number(const char* key, std::optional<double>& out) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_number()) throw WorkerConfigError(name(key) + " must be a number, got " + v->dump());
    out = v->get<double>();
  }
  void boolean(const char* key, std::optional<bool>& out) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) throw WorkerConfigError(name(key) + " must be true or false, got " + v->dump());
    out = v->get<bool>();
  }
  void string(const char* key, std::optional<std::string>& out) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    if (!v->is_string()) throw WorkerConfigError(name(key) + " must be a string, got " + v->dump());
    out = v->get<std::string>();
  }
  // A section: parsed by `read` when present.
  template <class T, class F>
  void section(const char* key, std::optional<T>& out, F read) const {
    const Json* v = find(key);
    if (v == nullptr) return;
    T t;
    read(Reader(*v, name(key)), t);
    out = std::move(t);
  }

 private:
  std::string where() const { return path_.empty() ? "the worker config" : path_; }
  const Json& j_;
  std::string path_;
};

Json write_model(const WorkerConfig::Model& m) {
  Json j = Json::object();
  put(j, "preset", m.preset);
  put(j, "layers", m.layers);
  put(j, "hidden", m.hidden);
  put(j, "heads", m.heads);
  put(j, "seqLen", m.seq_len);
  put(j, "vocab", m.vocab);
  put(j, "initFrom", m.init_from);
  if (m.moe) {
    Json& e = j["moe"] = Json::object();
    put(e, "experts", m.moe->experts);
    put(e, "topK", m.moe->top_k);
    put(e, "capacityFactor", m.moe->capacity_factor);
    put(e, "auxLossCoef", m.moe->aux_loss_coef);
  }
  return j;
}
void read_model(const Reader& r, WorkerConfig::Model& m) {
  r.string("preset", m.preset);
  r.integer("layers", m.layers, 1);
  r.integer("hidden", m.hidden, 1);
  r.integer("heads", m.heads, 1);
  r.integer("seqLen", m.seq_len, 1);
  r.integer("vocab", m.vocab, 1);
  r.string("initFrom", m.init_from);
  r.section("moe", m.moe, [](const Reader& e, WorkerConfig::Moe& x) {
    e.integer("experts", x.experts);
    e.integer("topK", x.top_k, 1);
    e.number("capacityFactor", x.capacity_factor);
    e.number("auxLossCoef", x.aux_loss_coef);
  });
}

Json write_training(const WorkerConfig::Training& t) {
  Json j = Json::object();
  put(j, "steps", t.steps);
  put(j, "globalBatch", t.global_batch);
  put(j, "microBatch", t.micro_batch);
  put(j, "seqLen", t.seq_len);
  put(j, "gradAccumulation", t.grad_accumulation);
  put(j, "learningRate", t.learning_rate);
  put(j, "minLrFraction", t.min_lr_fraction);
  put(j, "weightDecay", t.weight_decay);
  put(j, "gradClip", t.grad_clip);
  put(j, "warmupSteps", t.warmup_steps);
  put(j, "seed", t.seed);
  put(j, "valEvery", t.val_every);
  put(j, "valSteps", t.val_steps);
  put(j, "sampleEvery", t.sample_every);
  put(j, "sampleTokens", t.sample_tokens);
  return j;
}
void read_training(const Reader& r, WorkerConfig::Training& t) {
  r.integer("steps", t.steps, 1);
  r.integer("globalBatch", t.global_batch, 1);
  r.integer("microBatch", t.micro_batch, 1);
  r.integer("seqLen", t.seq_len, 1);
  r.integer("gradAccumulation", t.grad_accumulation, 1);
  r.number("learningRate", t.learning_rate);
  r.number("minLrFraction", t.min_lr_fraction);
  r.number("weightDecay", t.weight_decay);
  r.number("gradClip", t.grad_clip);
  r.integer("warmupSteps", t.warmup_steps);
  r.integer("seed", t.seed);
  r.integer("valEvery", t.val_every);
  r.integer("valSteps", t.val_steps, 1);
  r.integer("sampleEvery", t.sample_every);
  r.integer("sampleTokens", t.sample_tokens, 1);
}

Json write_layout(const WorkerConfig::Layout& l) {
  Json j = Json::object();
  put(j, "world", l.world);
  put(j, "dp", l.dp);
  put(j, "tp", l.tp);
  put(j, "pp", l.pp);
  put(j, "procsPerReplica", l.procs_per_replica);
  put(j, "replicas", l.replicas);
  return j;
}
void read_layout(const Reader& r, WorkerConfig::Layout& l) {
  r.integer("world", l.world, 1);
  r.integer("dp", l.dp, 1);
  r.integer("tp", l.tp, 1);
  r.integer("pp", l.pp, 1);
  r.integer("procsPerReplica", l.procs_per_replica, 1);
  r.integer("replicas", l.replicas, 1);
}

Json write_checkpoint(const WorkerConfig::Checkpoint& c) {
  Json j = Json::object();
  put(j, "path", c.path);
  put(j, "intervalSteps", c.interval_steps);
  put(j, "keep", c.keep);
  put(j, "async", c.async);
  put(j, "memoryIntervalSteps", c.memory_interval_steps);
  return j;
}
void read_checkpoint(const Reader& r, WorkerConfig::Checkpoint& c) {
  r.string("path", c.path);
  r.integer("intervalSteps", c.interval_steps);
  r.integer("keep", c.keep, 1);
  r.boolean("async", c.async);
  r.integer("memoryIntervalSteps", c.memory_interval_steps);
}

Json write_parallelism(const WorkerConfig::Parallelism& p) {
  Json j = Json::object();
  put(j, "zero", p.zero);
  put(j, "deterministic", p.deterministic);
  put(j, "expert", p.expert);
  put(j, "expertAllToAll", p.expert_all_to_all);
  put(j, "sequenceParallel", p.sequence_parallel);
  put(j, "context", p.context);
  if (!p.dp_split.empty()) j["dpSplit"] = p.dp_split;
  return j;
}
void read_parallelism(const Reader& r, WorkerConfig::Parallelism& p) {
  r.integer("zero", p.zero);
  r.boolean("deterministic", p.deterministic);
  r.integer("expert", p.expert, 1);
  r.string("expertAllToAll", p.expert_all_to_all);
  r.boolean("sequenceParallel", p.sequence_parallel);
  r.integer("context", p.context, 1);
  if (const Json* s = r.find("dpSplit")) {
    if (!s->is_array()) throw WorkerConfigError(r.name("dpSplit") + " must be an array of integers >= 1");
    for (const Json& v : *s) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > std::numeric_limits<int>::max())
        throw WorkerConfigError(r.name("dpSplit") + " must be an array of integers >= 1, got " + s->dump());
      p.dp_split.push_back(v.get<int>());
    }
  }
}

}  // namespace

Json to_json(const WorkerConfig& c) {
  Json j = Json::object();
  if (c.model) j["model"] = write_model(*c.model);
  if (c.training) j["training"] = write_training(*c.training);
  if (c.layout) j["layout"] = write_layout(*c.layout);
  if (c.data) {
    Json& d = j["data"] = Json::object();
    put(d, "train", c.data->train);
    put(d, "val", c.data->val);
  }
  if (c.checkpoint) j["checkpoint"] = write_checkpoint(*c.checkpoint);
  if (c.parallelism) j["parallelism"] = write_parallelism(*c.parallelism);
  if (c.memory) {
    Json& m = j["memory"] = Json::object();
    put(m, "recompute", c.memory->recompute);
    put(m, "recomputeLayers", c.memory->recompute_layers);
    put(m, "offload", c.memory->offload);
  }
  put(j, "device", c.device);
  put(j, "generation", c.generation);
  put(j, "world_size", c.world_size);
  put(j, "restore", c.restore);
  return j;
}

WorkerConfig parse_worker_config(const Json& j) {
  WorkerConfig c;
  const Reader r(j, "");
  r.section("model", c.model, read_model);
  r.section("training", c.training, read_training);
  r.section("layout", c.layout, read_layout);
  r.section("data", c.data, [](const Reader& d, WorkerConfig::Data& x) {
    d.string("train", x.train);
    d.string("val", x.val);
  });
  r.section("checkpoint", c.checkpoint, read_checkpoint);
  r.section("parallelism", c.parallelism, read_parallelism);
  r.section("memory", c.memory, [](const Reader& m, WorkerConfig::Memory& x) {
    m.string("recompute", x.recompute);
    m.integer("recomputeLayers", x.recompute_layers);
    m.string("offload", x.offload);
  });
  r.string("device", c.device);
  r.integer("generation", c.generation);
  r.integer("world_size", c.world_size, 1);
  r.string("restore", c.restore);
  return c;
}

}  // namespace railyard
