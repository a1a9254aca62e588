// `railyard-worker train` as stages (docs/worker.md): flags completed by the worker configuration, the device, the
// paths under the platform's roots, the model and recipe, the world, the data, the parallel model, the trainer, its
// metrics and checkpoints, the starting weights, the run, the export. Each stage lives beside this file.
#include "worker/cmd/train_command.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/metrics/metrics.h"
#include "common/pod_env.h"
#include "worker/cmd/checkpoint_setup.h"
#include "worker/cmd/config_file.h"
#include "worker/cmd/flags.h"
#include "worker/cmd/path_checks.h"
#include "worker/cmd/train_setup.h"
#include "worker/cmd/world.h"
#include "worker/data/data_loader.h"
#include "worker/interop/llmc_model.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/train/loader_source.h"
#include "worker/train/perf.h"
#include "worker/train/train_metrics.h"
#include "worker/train/trainer.h"

namespace railyard::worker {
namespace {

const std::vector<std::string> kTrainFlags = {"model",
                                              "device",
                                              "data",
                                              "val-data",
                                              "steps",
                                              "batch",
                                              "seq",
                                              "global-batch",
                                              "lr",
                                              "warmup",
                                              "min-lr-frac",
                                              "weight-decay",
                                              "grad-clip",
                                              "seed",
                                              "val-every",
                                              "val-steps",
                                              "sample-every",
                                              "sample-tokens",
                                              "threads",
                                              "init-from",
                                              "export",
                                              "log-json",
                                              "peak-flops",
                                              "max-bad-steps",
                                              "gemm-split",
                                              "config",
                                              "metrics-port",
                                              "metrics-host",
                                              "ckpt-dir",
                                              "ckpt-every",
                                              "ckpt-keep",
                                              "ckpt-async",
                                              "ckpt-shm-every",
                                              "ckpt-term-budget",
                                              "resume",
                                              "data-root",
                                              "ckpt-root",
                                              "nproc",
                                              "tp",
                                              "pp",
                                              "zero",
                                              "deterministic",
                                              "sequence-parallel",
                                              "cp",
                                              "bucket-mb",
                                              "recompute",
                                              "recompute-layers",
                                              "offload",
                                              "offload-threads",
                                              "moe-experts",
                                              "moe-top-k",
                                              "moe-capacity-factor",
                                              "moe-aux-coef",
                                              "ep",
                                              "ep-a2a",
                                              "ep-node-size",
                                              "dp-split",
                                              "slow-ranks",
                                              "slow-factor"};

// --metrics-port (rank r of a --nproc world on P + LOCAL_RANK) or RAILYARD_METRICS_PORT + LOCAL_RANK: the same
// numbers as the step log line, for Prometheus and railyard-monitor. Null when neither is set.
struct MetricsServer {
  metrics::Registry registry;
  std::unique_ptr<TrainMetrics> train;
  std::unique_ptr<metrics::Exposer> exposer;
};
std::unique_ptr<MetricsServer> serve_metrics(const Flags& f, Trainer& trainer) {
  std::optional<int64_t> port;
  if (f.count("metrics-port")) {
    port = to_int(f, "metrics-port", 0);
    // One flag for a whole --nproc world: rank r serves on P + LOCAL_RANK (0 stays "any free port").
    if (*port > 0) *port += std::atol(env_or("LOCAL_RANK", "0").c_str());
  } else if (const char* p = std::getenv(pod_env::kMetricsPort); p != nullptr && *p != '\0') {
    char* end = nullptr;
    const long base = std::strtol(p, &end, 10);
    if (*end != '\0' || base < 0) throw ConfigError(std::string("RAILYARD_METRICS_PORT '") + p + "' is not a port");
    port = base + std::atol(env_or("LOCAL_RANK", "0").c_str());
  }
  if (!port) return nullptr;
  if (*port < 0 || *port > 65535) throw ConfigError("--metrics-port must be in 0..65535");
  auto m = std::make_unique<MetricsServer>();
  const std::string host = f.count("metrics-host") ? f.at("metrics-host") : env_or(pod_env::kPodIp, "127.0.0.1");
  m->train = std::make_unique<TrainMetrics>(m->registry, TrainMetrics::labels_from_env());
  trainer.set_metrics(m->train.get());
  m->exposer = std::make_unique<metrics::Exposer>(m->registry, host, static_cast<int>(*port));
  log::info("worker", "serving metrics", {{"address", host + ":" + std::to_string(m->exposer->port())}});
  return m;
}

// --init-from / spec.model.initFrom: the starting weights when no checkpoint was restored (a restore wins: a
// restarted job continues from its checkpoint, not from the file). Called after restore(), which may also have
// re-initialised the weights after a damaged in-memory snapshot.
void load_initial_weights(const Flags& f, const ConfigOrigins& origins, const GptConfig& cfg, bool restored,
                          DistSetup& dist, DeviceKind device, Trainer& trainer) {
  if (!f.count("init-from")) return;
  const std::string& path = f.at("init-from");
  if (restored) {
    log::info("worker", "restored a checkpoint: not initialising from the llm.c model",
              {{"path", path}, {"field", flag_name("init-from", origins.init_from, f)}});
    return;
  }
  if (dist.sharded != nullptr) {
    std::vector<float> full(num_parameters(cfg));
    load_llmc_model(path, cfg, full.data());
    dist.sharded->load_full(full.data());  // each rank keeps its slices
  } else if (device != DeviceKind::kCpu) {
    std::vector<float> full(num_parameters(cfg));
    load_llmc_model(path, cfg, full.data());
    trainer.load_params(full.data());
  } else {
    load_llmc_model(path, cfg, trainer.model().params());
  }
  log::info("worker", "initialised from llm.c model", {{"path", path}});
}

// --export: the final weights as an llm.c model file, written by rank 0 (a tp/pp stage gathers them first: a
// collective every rank joins).
void export_model(const Flags& f, const GptConfig& cfg, const DistSetup& dist, Trainer& trainer) {
  if (!f.count("export")) return;
  const std::string& path = f.at("export");
  if (dist.sharded != nullptr) {
    const std::vector<float> full = dist.sharded->gather_full(dist.groups->coord().dp);  // collective
    if (dist.groups->rank() != 0) return;
    save_llmc_model(path, cfg, full.data());
  } else if (dist.groups == nullptr || dist.groups->rank() == 0) {
    save_llmc_model(path, cfg, trainer.state().params);  // host memory on every device
  } else {
    return;
  }
  log::info("worker", "exported llm.c model", {{"path", path}});
}

}  // namespace

int cmd_train(int argc, char** argv) {
  Flags f = parse_flags(argc, argv, 2, kTrainFlags);
  if (f.count("nproc")) return launch_train_world(argc, argv, f);
  ConfigOrigins origins;
  if (f.count("config")) origins = apply_config_file(f.at("config"), f);
  // The device first: a wrong --device / spec.device fails before any data or model is touched.
  const DeviceChoice device = choose_device(f);
  if (!f.count("data")) {
    if (const char* d = std::getenv(pod_env::kDataDir); d != nullptr && *d != '\0') f["data"] = d;
  }
  if (!f.count("data")) {
    usage_error(
        "--data DIR is required (make shards with `railyard data prepare`; or data.train in --config, or "
        "RAILYARD_DATA_DIR)");
  }
  enforce_path_roots(f, origins);
  const GptConfig cfg = model_config(f, origins);
  TrainConfig tc = train_config(f, cfg);
  const ShardGlobs shards = shard_globs(f, origins, tc);

  // Joins the world the launcher (--nproc or the agent) describes in RANK/WORLD_SIZE/MASTER_*; one process otherwise.
  DistSetup dist = join_world(f, tc, device.kind, device.visible_gpus, device.cuda);
  const bool model_parallel =
      dist.groups != nullptr && (dist.groups->layout().tp * dist.groups->layout().pp > 1 || tc.cp > 1);
  if ((!tc.dp_split.empty() || tc.slow_factor > 1) && model_parallel)
    throw ConfigError("--dp-split and --slow-ranks apply to plain data parallelism: drop --tp/--pp/--cp");
  // Data parallel: replica r reads its run of every global step; deterministic mode and an uneven --dp-split read the
  // job's whole sequence and the trainer keeps this replica's micro-batches (trainer.h).
  const bool whole_sequence = dist.deterministic || dist.groups == nullptr || !tc.dp_split.empty();
  LoaderBatchSource train(std::make_unique<DataLoader>(
      shards.train, tc.batch, tc.seq_len, whole_sequence ? 0 : dist.groups->dp().rank() / tc.cp,
      whole_sequence ? 1 : dist.groups->dp().size() / tc.cp, tc.seed, cfg.vocab_size, true));
  std::unique_ptr<LoaderBatchSource> val;
  if (tc.val_every > 0) {
    val = std::make_unique<LoaderBatchSource>(
        std::make_unique<DataLoader>(shards.val, tc.batch, tc.seq_len, 0, 1, tc.seed, cfg.vocab_size, false));
  }

  const int threads = threads_from(f);
  // Refuse up front what cannot fit, instead of dying in an allocation or the OOM killer later. With expert-parallel
  // storage a rank holds E/ep experts (every shard the same size); a bad --ep is refused below.
  const int ep_flag = static_cast<int>(to_int(f, "ep", 1));
  const bool ep_storage =
      ep_flag > 1 && cfg.moe.experts > 0 && cfg.moe.experts % ep_flag == 0 && dist.zero == 0 && !dist.deterministic;
  check_memory_budget(ep_storage ? expert_shard_config(cfg, ep_flag, 0) : cfg, tc, threads);
  const std::string split = f.count("gemm-split") ? f.at("gemm-split") : "pool";
  if (split != "pool" && split != "openblas") throw ConfigError("--gemm-split must be pool or openblas");
  ThreadPool pool(threads);
  cpu::set_gemm_threading(split == "pool" ? cpu::GemmThreading::kPool : cpu::GemmThreading::kOpenBlas, threads);
  if (tc.sample_every > 0) {
    // Samples come from a whole model in one process; data-parallel replicas hold the same one, so rank 0 alone
    // draws them.
    if (model_parallel || ep_flag > 1)
      throw ConfigError(
          "--sample-every (spec.training.sampleEvery) needs the whole model in one process: not with "
          "--tp/--pp/--cp/--ep; sample from a checkpoint with `railyard generate --checkpoint` instead");
    if (dist.groups != nullptr && dist.groups->rank() != 0) tc.sample_every = 0;
  }
  // The device before the model (a tensor/pipeline-parallel stage allocates on it) and the data-parallel reducer,
  // which enqueues on its stream (after join_world: on CUDA that made this rank's GPU current).
  std::unique_ptr<Kernels<float>> kernels;
  if (device.kind == DeviceKind::kCuda) kernels = device.cuda->create_kernels();
  ParallelModel pm = build_parallel_model(f, cfg, tc, dist, device.kind, device.cuda, kernels.get(), pool);
  Trainer trainer(pm.local_cfg, tc, pool, train, val.get(), dist.sync.get(), dist.sharded.get(), kernels.get());
  if (dist.groups != nullptr) trainer.set_layout(dist.groups->describe());
  if (pm.experts && dist.sharded != nullptr) {
    pm.experts->attach(dist.sharded->model().stage());  // the dp group is this (tp, pp) coordinate's
  } else if (pm.experts) {
    pm.experts->attach(trainer.model());
  }
  const std::unique_ptr<MetricsServer> metrics = serve_metrics(f, trainer);

  // Checkpoints (docs/checkpointing.md): restore before the first step, save every --ckpt-every steps, and on
  // SIGTERM save and exit 143.
  std::vector<ShardSpec> ckpt_shards = checkpoint_shards(cfg, trainer, dist, pm.experts.get());
  const CheckpointOptions co = checkpoint_options(f, dist, pm.experts.get(), ckpt_shards);
  Checkpointer checkpointer(co, cfg, trainer, std::move(ckpt_shards), metrics ? &metrics->registry : nullptr,
                            TrainMetrics::labels_from_env());
  const bool restored = checkpointer.restore().has_value();
  load_initial_weights(f, origins, cfg, restored, dist, device.kind, trainer);
  checkpointer.attach();
  Checkpointer::install_signal_handlers();
  const int rc = trainer.run();
  checkpointer.finish();
  if (rc == 0) export_model(f, cfg, dist, trainer);
  return rc;
}

int cmd_gemm_rate(int argc, char** argv) {
  Flags f = parse_flags(argc, argv, 2, {"model", "batch", "seq", "threads", "split"});
  const GptConfig cfg = parse_model_spec(f.count("model") ? f.at("model") : "gpt2-124m");
  const int B = static_cast<int>(to_int(f, "batch", 4)), T = static_cast<int>(to_int(f, "seq", 64));
  const std::string split = f.count("split") ? f.at("split") : "pool";
  if (split != "pool" && split != "openblas") throw ConfigError("--split must be pool or openblas");
  const int threads = threads_from(f);
  ThreadPool pool(threads);
  double rate;
  cpu::set_gemm_threading(split == "pool" ? cpu::GemmThreading::kPool : cpu::GemmThreading::kOpenBlas, threads);
  double per_cpu = 0;
  rate = measure_gemm_rate(pool, cfg, B, T, 5, nullptr, 0, &per_cpu);
  std::printf(
      "{\"gemm_flops_per_s\": %.6g, \"gemm_flops_per_cpu_s\": %.6g, \"threads\": %d, \"split\": \"%s\", "
      "\"model\": \"%s\", \"B\": %d, \"T\": %d}\n",
      rate, per_cpu, threads, split.c_str(), describe(cfg).c_str(), B, T);
  return 0;
}

}  // namespace railyard::worker
