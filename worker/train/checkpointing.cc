#include "worker/train/checkpointing.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>

#include "checkpoint/layout.h"
#include "checkpoint/peer_held.h"
#include "checkpoint/reader.h"
#include "checkpoint/shm_store.h"
#include "checkpoint/writer.h"
#include "common/error.h"
#include "common/log.h"
#include "worker/train/train_metrics.h"

namespace railyard::worker {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int64_t> g_stop_ns{0};  // CLOCK_MONOTONIC of the first signal (steady_clock on Linux)

void on_stop_signal(int) {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  int64_t expected = 0;
  g_stop_ns.compare_exchange_strong(expected, static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec);
  g_stop.store(true);
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string fmt_s(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

// "ROOT/step-00000042" -> 42; nullopt when the name is not a step directory.
std::optional<int64_t> step_of_dir(const std::filesystem::path& p) {
  const std::string n = p.filename().string();
  if (n.rfind("step-", 0) != 0 || n.size() == 5) return std::nullopt;
  for (size_t i = 5; i < n.size(); ++i)
    if (n[i] < '0' || n[i] > '9') return std::nullopt;
  return std::stoll(n.substr(5));
}

// The pieces this rank writes (all of them for the in-memory tier, which keeps what the rank holds).
std::vector<ckpt::TensorShard> tensor_shards(const std::vector<ShardSpec>& shards, bool all = false) {
  std::vector<ckpt::TensorShard> ts;
  ts.reserve(shards.size());
  for (const auto& s : shards)
    if (all || s.write)
      ts.push_back({s.name, ckpt::DType::F32, s.global_shape, s.box, s.data, s.replica_index, s.num_replicas});
  return ts;
}

}  // namespace

struct Checkpointer::Metrics {
  metrics::Registry& reg;
  metrics::Labels labels;
  metrics::Histogram& snapshot;
  metrics::Histogram& stall;
  metrics::Histogram& persist;
  metrics::Gauge& save_bytes;
  metrics::Family<metrics::Counter>& saves;
  metrics::Gauge& restore_seconds;
  metrics::Gauge& restore_bytes;
  metrics::Gauge& restored_step;
  metrics::Gauge& restored_from_memory;
  metrics::Histogram& memory_put;
  // Created at the first commit: a timestamp of 0 would read as an ancient checkpoint to the monitor's age rule.
  metrics::Family<metrics::Gauge>& last_step;
  metrics::Family<metrics::Gauge>& last_ts;

  Metrics(metrics::Registry& r, const metrics::Labels& l)
      : reg(r),
        labels(l),
        snapshot(r.histogram(metrics::names::kCheckpointSnapshotSeconds,
                             "Time to copy the state into the snapshot buffer (overlapped with the next step when "
                             "async).",
                             metrics::exponential_buckets(0.001, 2, 16))
                     .add(l)),
        stall(r.histogram(metrics::names::kCheckpointStallSeconds,
                          "Time a training step waited for a checkpoint snapshot (the training cost of a save).",
                          metrics::exponential_buckets(0.0001, 2, 18))
                  .add(l)),
        persist(r.histogram(metrics::names::kCheckpointPersistSeconds,
                            "Background time to checksum, write, fsync and commit a checkpoint.",
                            metrics::exponential_buckets(0.01, 2, 14))
                    .add(l)),
        save_bytes(
            r.gauge(metrics::names::kCheckpointSaveBytes, "Bytes this rank wrote for its last checkpoint.").add(l)),
        saves(r.counter(metrics::names::kCheckpointSavesTotal, "Checkpoint saves by result (committed or failed).")),
        restore_seconds(
            r.gauge(metrics::names::kCheckpointRestoreSeconds, "Time the restore at start took (0: fresh start).")
                .add(l)),
        restore_bytes(r.gauge(metrics::names::kCheckpointRestoreBytes, "Bytes read by the restore at start.").add(l)),
        restored_step(
            r.gauge(metrics::names::kCheckpointRestoredStep, "Step restored at start (0: fresh start).").add(l)),
        restored_from_memory(r.gauge(metrics::names::kCheckpointRestoredFromMemory,
                                     "1 when the restore at start read the in-memory tier (own memory or a peer copy), "
                                     "0 otherwise.")
                                 .add(l)),
        memory_put(r.histogram(metrics::names::kCheckpointMemorySnapshotSeconds,
                               "Time to copy the state into the in-memory tier (shared memory) after a step; the "
                               "step waits for it.",
                               metrics::exponential_buckets(0.0001, 2, 18))
                       .add(l)),
        last_step(r.gauge(metrics::names::kCheckpointLastStep, "Step of the last complete checkpoint.")),
        last_ts(r.gauge(metrics::names::kCheckpointLastTimestamp, "Unix time the last checkpoint completed.")) {
    for (const char* res : {"committed", "failed"}) {
      metrics::Labels x = l;
      x["result"] = res;
      saves.add(x);
    }
  }
  void result(const char* res) {
    metrics::Labels x = labels;
    x["result"] = res;
    saves.add(x).increment();
  }
};

namespace {
// The llm.c tensors, and with experts the four MLP tensors with an expert dimension after the layer plus the router
// (L, E, C) after lnfb: the Gpt buffer's order (docs/worker.md "Mixture of experts"). Expert parallelism keeps this
// full layout on every rank, so a checkpoint of any --ep loads into any other.
std::vector<ckpt::TensorDef> model_tensor_defs(const GptConfig& m) {
  auto defs = ckpt::gpt_tensor_defs(m.num_layers, m.channels, m.max_seq_len, m.padded_vocab_size, false);
  if (m.moe.experts <= 0) return defs;
  const int64_t E = m.moe.experts;
  for (auto& d : defs) {
    if (d.name == "fcw" || d.name == "fcb" || d.name == "fcprojw" || d.name == "fcprojb") {
      d.shape.insert(d.shape.begin() + 1, E);
    }
  }
  defs.push_back({"routerw", ckpt::DType::F32, {m.num_layers, E, m.channels}});
  return defs;
}
}  // namespace

std::vector<ShardSpec> full_state_shards(const GptConfig& m, const TrainerState& s) {
  const auto defs = model_tensor_defs(m);
  size_t total = 0;
  for (const auto& d : defs) total += static_cast<size_t>(ckpt::Box{ckpt::Shape(d.shape.size(), 0), d.shape}.volume());
  if (total != s.num_params) {
    throw Error("checkpoint: the GPT tensor list has " + std::to_string(total) + " elements but the trainer holds " +
                std::to_string(s.num_params) + " parameters");
  }
  std::vector<ShardSpec> out;
  for (auto [prefix, base] :
       {std::pair<const char*, float*>{"", s.params}, {"adam_m/", s.adam_m}, {"adam_v/", s.adam_v}}) {
    for (const auto& v : ckpt::flat_views(defs, base)) {
      ShardSpec sh;
      sh.name = prefix + v.def.name;
      sh.global_shape = v.def.shape;
      sh.box = ckpt::Box{ckpt::Shape(v.def.shape.size(), 0), v.def.shape};
      sh.data = static_cast<float*>(v.data);
      out.push_back(std::move(sh));
    }
  }
  return out;
}

std::vector<ShardSpec> expert_shard_state_shards(const GptConfig& local, const TrainerState& s, int dp_rank,
                                                 int dp_size, int edp_rank, int edp_size) {
  const GptConfig global = global_config(local);
  const auto defs = model_tensor_defs(global);
  const int64_t el = local_experts(local), first = static_cast<int64_t>(local.moe.expert_shard) * el;
  if (static_cast<size_t>(num_parameters(local)) != s.num_params) {
    throw Error("checkpoint: the expert shard layout has " + std::to_string(num_parameters(local)) +
                " elements but the trainer holds " + std::to_string(s.num_params) + " parameters");
  }
  std::vector<ShardSpec> out;
  for (auto [prefix, base] :
       {std::pair<const char*, float*>{"", s.params}, {"adam_m/", s.adam_m}, {"adam_v/", s.adam_v}}) {
    size_t at = 0;  // offset in the local buffer, which is the defs' order with E/P experts per layer
    for (const auto& d : defs) {
      const bool expert = d.name == "fcw" || d.name == "fcb" || d.name == "fcprojw" || d.name == "fcprojb";
      ShardSpec sh;
      sh.name = prefix + d.name;
      sh.global_shape = d.shape;
      sh.box = ckpt::Box{ckpt::Shape(d.shape.size(), 0), d.shape};
      if (expert) {  // (L, E, ...): dimension 1 is the expert
        sh.box.offset[1] = first;
        sh.box.size[1] = el;
      }
      sh.data = base + at;
      sh.replica_index = expert ? edp_rank : dp_rank;
      sh.num_replicas = expert ? edp_size : dp_size;
      at += static_cast<size_t>(sh.box.volume());
      out.push_back(std::move(sh));
    }
    if (at != s.num_params) throw Error("checkpoint: expert shard boxes do not cover the local buffer");
  }
  return out;
}

std::vector<ShardSpec> zero_state_shards(const GptConfig& m, float* params, float* shard_m, float* shard_v,
                                         const std::vector<OwnedRange>& owned, int dp_rank, int dp_size) {
  const auto defs = model_tensor_defs(m);
  std::vector<ShardSpec> out;
  for (const auto& v : ckpt::flat_views(defs, params)) {
    ShardSpec sh;
    sh.name = v.def.name;
    sh.global_shape = v.def.shape;
    sh.box = ckpt::Box{ckpt::Shape(v.def.shape.size(), 0), v.def.shape};
    sh.data = static_cast<float*>(v.data);
    sh.replica_index = dp_rank;
    sh.num_replicas = dp_size;
    out.push_back(std::move(sh));
  }
  for (auto [prefix, shard] : {std::pair<const char*, float*>{"adam_m/", shard_m}, {"adam_v/", shard_v}}) {
    size_t t0 = 0;  // flat offset of the tensor
    for (const auto& d : defs) {
      const ckpt::Box full{ckpt::Shape(d.shape.size(), 0), d.shape};
      append_owned_moments(out, prefix + d.name, d.shape, full, t0, shard, owned, true);
      t0 += static_cast<size_t>(full.volume());
    }
    if (t0 != static_cast<size_t>(num_parameters(m))) {
      throw Error("checkpoint: the GPT tensor list has " + std::to_string(t0) + " elements but the model " +
                  std::to_string(num_parameters(m)));
    }
  }
  return out;
}

void append_owned_moments(std::vector<ShardSpec>& out, const std::string& name, const ckpt::Shape& global_shape,
                          const ckpt::Box& box, size_t local_begin, float* shard, const std::vector<OwnedRange>& owned,
                          bool write) {
  const size_t local_end = local_begin + static_cast<size_t>(box.volume());
  for (const OwnedRange& r : owned) {
    const size_t b = std::max(r.begin, local_begin), e = std::min(r.end, local_end);
    if (b >= e) continue;
    // The boxes come in row-major order of `box`, each a contiguous run of the range.
    size_t at = b;
    for (const ckpt::Box& part :
         ckpt::flat_range_to_boxes(box, static_cast<int64_t>(b - local_begin), static_cast<int64_t>(e - local_begin))) {
      ShardSpec sh;
      sh.name = name;
      sh.global_shape = global_shape;
      sh.box = part;
      sh.data = shard + r.shard_offset + (at - r.begin);
      sh.write = write;
      at += static_cast<size_t>(part.volume());
      out.push_back(std::move(sh));
    }
  }
}

Checkpointer::Checkpointer(CheckpointOptions options, const GptConfig& model, Trainer& trainer,
                           std::vector<ShardSpec> shards, metrics::Registry* registry, const metrics::Labels& labels)
    : opt_(std::move(options)), model_(model), trainer_(trainer), shards_(std::move(shards)) {
  if (opt_.every < 0) throw ConfigError("--ckpt-every must be >= 0 (0: only at the end and on SIGTERM)");
  if (opt_.keep < 1) throw ConfigError("--ckpt-keep must be >= 1 (spec.checkpoint.keep)");
  if (opt_.shm_every < 0) throw ConfigError("--ckpt-shm-every must be >= 0");
  if (!(opt_.term_budget_seconds > 0)) throw ConfigError("--ckpt-term-budget must be a positive number of seconds");
  if (opt_.resume.empty()) opt_.resume = "auto";
  if (registry != nullptr) metrics_ = std::make_unique<Metrics>(*registry, labels);
  if (!opt_.dir.empty()) {
    ckpt::WriterOptions w;
    w.root = opt_.dir;
    w.rank = opt_.rank;
    w.world_size = opt_.world_size;
    w.run_id = opt_.run_id;
    w.job = opt_.job;
    w.generation = opt_.generation;
    w.layout = opt_.layout;
    w.keep = opt_.keep;
    w.on_finished = [this](const ckpt::SaveStatus& st) {
      on_finished(st.step, st.state == ckpt::SaveState::Committed, st.persist_seconds, st.bytes);
      if (st.state == ckpt::SaveState::Failed) {
        log::warn("checkpoint", "save failed: training goes on, the previous checkpoint stays",
                  {{"step", std::to_string(st.step)}, {"error", st.error}});
      }
    };
    writer_ = std::make_unique<ckpt::Writer>(std::move(w));
    // Touch the snapshot buffer now, so the first save does not pay its page faults inside a step.
    writer_->reserve(ckpt::snapshot_bytes(tensor_shards(shards_)));
  }
  if (opt_.shm_every > 0) {
    if (opt_.shm_name.empty()) throw ConfigError("--ckpt-shm-every needs a shared-memory name");
    shm_[0] = std::make_unique<ckpt::ShmStore>(opt_.shm_name + "-a");
    shm_[1] = std::make_unique<ckpt::ShmStore>(opt_.shm_name + "-b");
    // Overwrite the older slot first, so the newest snapshot survives a put that a kill tears.
    const auto a = shm_[0]->peek(), b = shm_[1]->peek();
    shm_next_ = (a && (!b || *a > *b)) ? 1 : 0;
    shm_steps_[0] = a.value_or(-1);
    shm_steps_[1] = b.value_or(-1);
    // Every rank has the third slot (no segment until a put goes there): when any rank's peer lags, all divert.
    scratch_ = std::make_unique<ckpt::ShmStore>(opt_.shm_name + "-c");
    scratch_step_ = scratch_->peek().value_or(-1);
    if (!opt_.shm_peer_held.empty()) {
      // The choice of slot must be the same on every rank (a step held in different kinds of slot on different ranks
      // is no use to a restore after a node loss).
      peer_gate_ = opt_.world_size == 1 || static_cast<bool>(opt_.any_rank);
      if (!peer_gate_)
        log::info("checkpoint",
                  "in-memory tier: no collective to choose slots together: puts do not wait for the peer");
    }
  }
}

Checkpointer::~Checkpointer() {
  try {
    // Unwinding (typically a comm::CommError: a peer's process, pod or node is gone): a save in flight may wait in
    // the commit barrier for that peer's part, which never comes, for the writer's commit_timeout. Wait for it only
    // until the agent stops this process (SIGTERM: a new generation is open), then give it up, so a survivor exits
    // at once instead of after the agent's grace period and SIGKILL (docs/elastic.md).
    if (std::uncaught_exceptions() > 0 && writer_) {
      while (!writer_->idle() && !stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!writer_->idle()) {
        log::warn("checkpoint", "stop signal while unwinding: giving up the save in flight");
        writer_->abandon();
      }
    }
    finish();
  } catch (const std::exception& e) {
    log::error("checkpoint", std::string("while finishing: ") + e.what());
  }
}

void Checkpointer::install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

bool Checkpointer::stop_requested() { return g_stop.load(); }

void Checkpointer::reset_stop_for_tests() {
  g_stop.store(false);
  g_stop_ns.store(0);
}

int64_t Checkpointer::last_committed_step() const { return committed_step_.load(); }

nlohmann::json Checkpointer::state_json(const TrainerState& s) const {
  const TrainConfig& c = trainer_.config();
  nlohmann::json j = {{"step", s.step},
                      {"adam_t", s.adam_t},
                      {"bad_steps_total", s.bad_steps_total},
                      {"bad_steps_consecutive", s.bad_steps_consecutive},
                      {"seed", s.seed},
                      {"model", describe(model_)},
                      // The LR schedule is a pure function of the step and these settings: the position is `step`.
                      {"lr_schedule",
                       {{"position", s.step},
                        {"lr", c.lr},
                        {"warmup_steps", c.warmup_steps},
                        {"total_steps", c.steps},
                        {"min_lr_frac", c.min_lr_frac}}}};
  j["loader"] = s.loader ? nlohmann::json(*s.loader) : nlohmann::json(nullptr);
  return j;
}

void Checkpointer::apply_state(const nlohmann::json& j, int64_t step) {
  auto need = [&](const char* k) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(k)) {
      throw Error("checkpoint of step " + std::to_string(step) + ": rank state has no '" + k +
                  "' (not written by railyard-worker train?)");
    }
    return j.at(k);
  };
  if (need("model").get<std::string>() != describe(model_)) {
    throw ConfigError("checkpoint of step " + std::to_string(step) + " holds model " +
                      need("model").get<std::string>() + " but this run trains " + describe(model_) +
                      ": use the same --model or another --ckpt-dir");
  }
  TrainerState s;
  s.step = need("step").get<int64_t>();
  s.adam_t = need("adam_t").get<int64_t>();
  s.bad_steps_total = need("bad_steps_total").get<int64_t>();
  s.bad_steps_consecutive = need("bad_steps_consecutive").get<int64_t>();
  s.seed = need("seed").get<uint64_t>();
  if (!need("loader").is_null()) s.loader = need("loader").get<LoaderState>();
  const TrainConfig& c = trainer_.config();
  if (s.seed != c.seed) {
    log::warn("checkpoint", "the checkpoint was trained with another --seed: the data order changes from here",
              {{"checkpoint_seed", std::to_string(s.seed)}, {"seed", std::to_string(c.seed)}});
  }
  if (const auto& lr = j.value("lr_schedule", nlohmann::json::object());
      lr.value("total_steps", c.steps) != c.steps || lr.value("warmup_steps", c.warmup_steps) != c.warmup_steps ||
      lr.value("lr", c.lr) != c.lr) {
    log::warn("checkpoint", "the learning-rate schedule differs from the checkpoint's: the run continues on this one",
              {{"checkpoint_schedule", lr.dump()}});
  }
  if (s.step > c.steps) {
    throw ConfigError("checkpoint is at step " + std::to_string(s.step) + ", beyond --steps " +
                      std::to_string(c.steps) + ": raise --steps or start from another checkpoint");
  }
  trainer_.restore_counters(s);
}

std::optional<RestoreInfo> Checkpointer::restore() {
  std::optional<RestoreInfo> info = restore_any();
  // The third slot holds a step of the run being restored only up to the restored one: a newer one is of a run
  // abandoned by this restore (its next steps are computed again), so a later restore must never pick it.
  if (scratch_ && scratch_step_ > (info ? info->step : 0)) {
    ckpt::ShmStore::remove(scratch_->name());
    scratch_ = std::make_unique<ckpt::ShmStore>(opt_.shm_name + "-c");
    scratch_step_ = -1;
  }
  return info;
}

std::optional<RestoreInfo> Checkpointer::restore_any() {
  if (opt_.resume == "never") return std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<ckpt::LoadTarget> targets;
  for (const auto& s : shards_) targets.push_back({s.name, ckpt::DType::F32, s.box, s.data});

  std::string root = opt_.resume == "auto" ? opt_.dir : opt_.resume;
  std::optional<int64_t> exact_step;
  if (opt_.resume != "auto" && std::filesystem::exists(std::filesystem::path(root) / "manifest.json")) {
    exact_step = step_of_dir(root);
    if (!exact_step) throw ConfigError("--resume " + root + ": holds a manifest.json but is not named step-N");
    root = std::filesystem::path(root).lexically_normal().parent_path().string();
  }
  std::vector<int64_t> disk;
  if (!root.empty() && std::filesystem::is_directory(root)) disk = ckpt::Reader(root).complete_steps();

  RestoreInfo info;
  if (shm_[0] && !exact_step) {
    if (auto st = restore_from_memory(targets, disk.empty() ? -1 : disk.front())) {
      info.step = *st;
      const auto& peer = opt_.shm_peer_steps;
      info.source = std::find(peer.begin(), peer.end(), *st) != peer.end() ? "peer" : "memory";
      for (const auto& t : targets) info.bytes += static_cast<uint64_t>(t.box.volume()) * sizeof(float);
    } else if (disk.empty()) {
      // get() may have written into some targets before it found the damage: start from a clean initialisation.
      trainer_.reinit_weights();
      for (const auto& sh : shards_)
        if (sh.name.rfind("adam_", 0) == 0)
          std::memset(sh.data, 0, static_cast<size_t>(sh.box.volume()) * sizeof(float));
    }
  }
  if (info.source.empty()) {
    if (!exact_step && disk.empty()) {
      if (opt_.resume != "auto") {
        log::warn("checkpoint", "asked to restore but no complete checkpoint exists there: starting fresh",
                  {{"path", root}});
      } else if (!root.empty()) {
        log::info("checkpoint", "no checkpoint yet: starting fresh", {{"dir", root}});
      }
      return std::nullopt;
    }
    ckpt::Reader reader(root);
    // Ranks read different slices: verifying every checksum makes them all settle on the same step.
    ckpt::LoadOptions load_options;
    load_options.full_verify = opt_.world_size > 1;
    ckpt::LoadResult r =
        exact_step ? reader.load_step(*exact_step, targets) : reader.load_latest(targets, load_options);
    for (const auto& why : r.skipped) {
      log::warn("checkpoint", "skipped a checkpoint that does not verify: falling back to an older one",
                {{"reason", why}});
    }
    // A checkpoint written by fewer ranks (a grown job) still carries the counters and loader position of rank 0.
    auto it = r.manifest.rank_state.find(opt_.rank);
    if (it == r.manifest.rank_state.end()) it = r.manifest.rank_state.find(0);
    if (it == r.manifest.rank_state.end()) {
      throw Error("checkpoint " + root + " step " + std::to_string(r.step) + ": no rank state for rank " +
                  std::to_string(opt_.rank) + " or rank 0");
    }
    apply_state(it->second, r.step);
    info.step = r.step;
    char name[32];
    std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(r.step));
    info.source = (std::filesystem::path(root) / name).string();
    info.skipped = r.skipped;
    info.bytes = r.bytes_read;
  }
  info.seconds = since(t0);
  restore_seconds_ = info.seconds;
  if (metrics_) {
    metrics_->restore_seconds.set(info.seconds);
    metrics_->restore_bytes.set(static_cast<double>(info.bytes));
    metrics_->restored_step.set(static_cast<double>(info.step));
    metrics_->restored_from_memory.set(info.source == "memory" || info.source == "peer" ? 1 : 0);
  }
  log::info("checkpoint", "restored",
            {{"step", std::to_string(info.step)},
             {"from", info.source},
             {"bytes", std::to_string(info.bytes)},
             {"seconds", fmt_s(info.seconds)},
             {"skipped", std::to_string(info.skipped.size())}});
  return info;
}

void Checkpointer::attach() {
  TrainerHooks h;
  h.before_update = [this] { join_copy(); };
  h.after_step = [this](const StepResult& r) { return after_step(r); };
  h.progress_extras = [this](nlohmann::json& record) {
    record["checkpoint_stall_seconds"] = stall_seconds_;
    record["restore_seconds"] = restore_seconds_;
  };
  trainer_.set_hooks(std::move(h));
}

void Checkpointer::join_copy() {
  if (!copy_.joinable()) return;
  const auto t0 = std::chrono::steady_clock::now();
  copy_.join();
  const double waited = since(t0);
  stall_seconds_ += waited;
  if (metrics_) metrics_->stall.observe(waited);
}

bool Checkpointer::all_ranks(bool mine) {
  if (!opt_.all_gather) return mine;
  for (int64_t v : opt_.all_gather({mine ? 1 : 0}))
    if (v == 0) return false;
  return true;
}

std::optional<int64_t> Checkpointer::restore_from_memory(const std::vector<ckpt::LoadTarget>& targets,
                                                         int64_t disk_newest) {
  if (opt_.world_size > 1 && !opt_.all_gather) {
    log::info("checkpoint", "in-memory tier: no collective to agree on a step with the other ranks: reading the disk");
    return std::nullopt;
  }
  // Each rank's slots, a, b and the third (-1: unusable or none; three entries on every rank, so the lists line up).
  // A rank killed in the middle of a put has a torn slot; another holds the step before. Every rank gets the same
  // list, so all pick the same step: the newest one that every rank holds, at least as new as the disk's newest.
  constexpr size_t kSlots = 3;
  ckpt::ShmStore* const slots[kSlots] = {shm_[0].get(), shm_[1].get(), scratch_.get()};
  std::vector<int64_t> mine(kSlots, -1);
  std::vector<std::string> why(kSlots);
  for (size_t i = 0; i < kSlots; ++i)
    if (slots[i] != nullptr)
      if (auto st = slots[i]->peek(&why[i])) mine[i] = *st;
  const std::vector<int64_t> all = opt_.all_gather ? opt_.all_gather(mine) : mine;
  const size_t ranks = all.size() / kSlots;
  std::vector<int64_t> candidates;
  for (size_t i = 0; i < kSlots; ++i) {
    const int64_t s = all[i];  // rank 0's slots: a step every rank holds is among them
    if (s < 0 || s < disk_newest) continue;
    bool everywhere = true;
    for (size_t r = 0; r < ranks && everywhere; ++r)
      everywhere = std::find(all.begin() + static_cast<std::ptrdiff_t>(kSlots * r),
                             all.begin() + static_cast<std::ptrdiff_t>(kSlots * (r + 1)),
                             s) != all.begin() + static_cast<std::ptrdiff_t>(kSlots * (r + 1));
    if (everywhere && std::find(candidates.begin(), candidates.end(), s) == candidates.end()) candidates.push_back(s);
  }
  std::sort(candidates.rbegin(), candidates.rend());
  if (candidates.empty()) {
    std::string mine_text = std::to_string(mine[0]) + "," + std::to_string(mine[1]);
    if (scratch_) mine_text += "," + std::to_string(mine[2]);
    log::info("checkpoint", "no in-memory snapshot that every rank holds and is at least as new as the disk",
              {{"memory_steps", mine_text},
               {"disk_step", std::to_string(disk_newest)},
               {"why", why[0].empty() ? why[1] : why[0]}});
    return std::nullopt;
  }
  for (const int64_t step : candidates) {
    // The first slot holding it: a or b before the third (a step in both was put in a or b since).
    const int slot = static_cast<int>(std::find(mine.begin(), mine.end(), step) - mine.begin());
    nlohmann::json state;
    std::string reason;
    const std::optional<int64_t> got = slots[slot]->get(targets, &state, &reason);
    bool ok = got && *got == step;
    if (ok &&
        (state.value("layout", nlohmann::json()) != opt_.layout || state.value("world_size", 0) != opt_.world_size)) {
      ok = false;
      reason = "snapshot of layout " + state.value("layout", nlohmann::json()).dump() + " world " +
               std::to_string(state.value("world_size", 0)) + ", this run has " + opt_.layout.dump() + " world " +
               std::to_string(opt_.world_size);
    }
    if (!ok && got) reason = reason.empty() ? "slot changed step while reading" : reason;
    if (all_ranks(ok)) {
      apply_state(state.at("trainer"), step);
      if (slot < 2) shm_next_ = 1 - slot;  // keep the restored snapshot until the next put has completed
      return step;
    }
    log::warn("checkpoint", "in-memory snapshot not usable on every rank: trying an older one",
              {{"step", std::to_string(step)}, {"why", ok ? "another rank could not read it" : reason}});
  }
  return std::nullopt;
}

void Checkpointer::put_memory(int64_t step) {
  const int slot = shm_next_;
  shm_steps_[slot] = -1;  // torn until the put completes
  if (put_slot(*shm_[slot], step)) {
    shm_steps_[slot] = step;
    shm_next_ = 1 - slot;
  }
  // Failed: the slot may be torn now; the other keeps the previous snapshot, so the next put goes to this one again.
}

bool Checkpointer::put_slot(ckpt::ShmStore& slot, int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  try {
    const nlohmann::json state = {
        {"trainer", state_json(trainer_.state())}, {"layout", opt_.layout}, {"world_size", opt_.world_size}};
    slot.put(step, tensor_shards(shards_, true), state);
  } catch (const std::exception& e) {
    ok = false;
    log::error("checkpoint", "in-memory snapshot failed: training goes on",
               {{"step", std::to_string(step)}, {"slot", slot.name()}, {"error", e.what()}});
  }
  const double took = since(t0);
  stall_seconds_ += took;
  if (metrics_) metrics_->memory_put.observe(took);
  return ok;
}

// Gemini's rule for the peer copy (docs/checkpointing.md "The peer copy"): the slot that survives a put must hold a
// step the peer also holds. Otherwise a node loss right after the put leaves the survivors with two steps newer than
// any copy of the lost ranks, and the job restores from the disk (steps redone). So while the peer does not yet hold
// the newest snapshot (its copy is on the way), the step goes into the third slot instead, which a restart in place
// restores from (a kill -9 still loses no step); the ranks decide together, since a step is only of use to a restore
// when every rank holds it. Costs no step time beyond one small collective per put: the worker never waits for a copy.
// After kMaxPeerWaits diversions in a row the put goes to the two slots anyway. True: divert this put.
bool Checkpointer::wait_for_peer(int64_t step) {
  const int64_t kept = shm_steps_[1 - shm_next_];
  bool wait = false;
  if (peer_gate_ && kept >= 0) {
    const std::vector<int64_t> held = ckpt::read_peer_held(opt_.shm_peer_held);
    wait = std::find(held.begin(), held.end(), kept) == held.end();
  }
  // Every rank votes at every put, with or without a peer copy of its own: no rank may skip a collective that
  // another one makes (a pod whose agent copies nothing still takes part).
  if (opt_.any_rank) wait = opt_.any_rank(wait);
  if (!wait) {
    peer_waits_ = 0;
    return false;
  }
  if (peer_waits_ < kMaxPeerWaits) {
    ++peer_waits_;
    ++peer_waits_total_;
    return true;
  }
  if (peer_forced_total_++ == 0) {
    log::warn("checkpoint", "in-memory tier: the peer copy lags; putting this step in the copied slots anyway",
              {{"step", std::to_string(step)},
               {"kept_step", std::to_string(kept)},
               {"diverted_in_a_row", std::to_string(peer_waits_)}});
  }
  peer_waits_ = 0;
  return false;
}

void Checkpointer::start_save(int64_t step, bool async) {
  join_copy();
  const nlohmann::json state = state_json(trainer_.state());
  std::vector<ckpt::TensorShard> ts = tensor_shards(shards_);
  last_snapshot_step_ = step;
  auto work = [this, step, state, ts = std::move(ts)] {
    try {
      const ckpt::SaveStatus st = writer_->snapshot(step, ts, state);
      if (metrics_) metrics_->snapshot.observe(st.snapshot_seconds);
    } catch (const std::exception& e) {
      log::error("checkpoint", "snapshot failed: training goes on",
                 {{"step", std::to_string(step)}, {"error", e.what()}});
    }
  };
  if (async) {
    copy_ = std::thread(std::move(work));
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    const double waited = since(t0);
    stall_seconds_ += waited;
    if (metrics_) metrics_->stall.observe(waited);
  }
}

std::optional<int> Checkpointer::after_step(const StepResult& r) {
  const int64_t step = r.step + 1;  // steps completed
  // The in-memory snapshot is taken before the ranks' agreement below (a collective): no rank gets past this step
  // (and reports it: the trainer logs a step after this hook) before every rank holds it in memory. So a process
  // failure never loses a step that was reported.
  if (shm_[0] && step % opt_.shm_every == 0) {
    if (!wait_for_peer(step)) {
      put_memory(step);
    } else {
      scratch_step_ = -1;
      if (put_slot(*scratch_, step)) scratch_step_ = step;
    }
  }
  bool stop = stop_requested();
  if (opt_.any_rank) stop = opt_.any_rank(stop);
  if (stop) return save_on_stop(step);
  const int64_t total = trainer_.config().steps;
  const bool disk_due = writer_ && ((opt_.every > 0 && step % opt_.every == 0) || (opt_.save_final && step == total));
  if (disk_due) {
    const bool async = opt_.async && step != total;
    // A synchronous save blocks the step loop for its whole write: a pause, not a stall, for the monitor (its stall
    // threshold is hangTimeoutSeconds meanwhile). Only the save: the agreement above is a collective where a hung peer
    // must show as a stall.
    std::optional<TrainMetrics::Pause> pause;
    if (!async) pause.emplace(trainer_.metrics());
    start_save(step, async);
  }
  return std::nullopt;
}

std::optional<int> Checkpointer::save_on_stop(int64_t step) {
  TrainMetrics::Pause pause(trainer_.metrics());  // the save before exiting takes up to --ckpt-term-budget
  const int64_t ns = g_stop_ns.load();
  const auto signalled =
      ns > 0 ? std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns)) : std::chrono::steady_clock::now();
  const auto deadline = signalled + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(opt_.term_budget_seconds));
  if (!writer_) {
    log::warn("checkpoint", "stop signal: no checkpoint directory, exiting without a save",
              {{"step", std::to_string(step)}});
    return kPreemptedExitCode;
  }
  log::info("checkpoint", "stop signal: saving a checkpoint before exiting",
            {{"step", std::to_string(step)}, {"budget_seconds", fmt_s(opt_.term_budget_seconds)}});
  join_copy();
  const auto t0 = std::chrono::steady_clock::now();
  ckpt::SaveStatus st;
  if (last_snapshot_step_ == step) {
    st = writer_->wait(step, deadline);  // this step's save is already queued
  } else {
    last_snapshot_step_ = step;
    st = writer_->save_now_and_wait(step, tensor_shards(shards_), state_json(trainer_.state()), deadline);
  }
  if (st.state == ckpt::SaveState::Committed) {
    log::info("checkpoint", "saved on stop signal",
              {{"step", std::to_string(step)}, {"seconds", fmt_s(since(t0))}, {"dir", opt_.dir}});
  } else {
    log::error("checkpoint", "the save on stop signal did not complete: the previous checkpoint stays",
               {{"step", std::to_string(step)},
                {"state", std::string(ckpt::save_state_name(st.state))},
                {"error", st.error.empty() ? "deadline passed (--ckpt-term-budget)" : st.error}});
  }
  return kPreemptedExitCode;
}

void Checkpointer::on_finished(int64_t step, bool ok, double persist_seconds, uint64_t bytes) {
  if (ok) {
    int64_t prev = committed_step_.load();
    while (prev < step && !committed_step_.compare_exchange_weak(prev, step)) {
    }
  }
  if (!metrics_) return;
  metrics_->result(ok ? "committed" : "failed");
  if (!ok) return;
  metrics_->persist.observe(persist_seconds);
  metrics_->save_bytes.set(static_cast<double>(bytes));
  metrics_->last_step.add(metrics_->labels).set(static_cast<double>(step));
  metrics_->last_ts.add(metrics_->labels).set_to_current_time();
}

void Checkpointer::finish() {
  join_copy();
  if (writer_) writer_->flush();
  if (peer_waits_total_ > 0 || peer_forced_total_ > 0) {
    log::info("checkpoint", "in-memory tier: puts diverted to the third slot while the peer copy caught up",
              {{"diverted", std::to_string(peer_waits_total_)}, {"put_anyway", std::to_string(peer_forced_total_)}});
  }
}

}  // namespace railyard::worker
