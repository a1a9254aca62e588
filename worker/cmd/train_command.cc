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
#include "worker/cmd/command_line.h"
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

// --metrics-port (rank r of a --nproc world on P + LOCAL_RANK) or RAILYARD_METRICS_PORT + LOCAL_RANK: the same
// numbers as the step log line, for Prometheus and railyard-monitor. Null when neither is set.
struct MetricsServer {
  metrics::Registry registry;
  std::unique_ptr<TrainMetrics> train;
  std::unique_ptr<metrics::Exposer> exposer;
};
std::unique_ptr<MetricsServer> serve_metrics(const TrainOptions& o, Trainer& trainer) {
  if (!o.metrics_port) return nullptr;
  auto m = std::make_unique<MetricsServer>();
  const std::string& host = o.metrics_host;
  m->train = std::make_unique<TrainMetrics>(m->registry, TrainMetrics::labels_from_env());
  trainer.set_metrics(m->train.get());
  m->exposer = std::make_unique<metrics::Exposer>(m->registry, host, *o.metrics_port);
  log::info("worker", "serving metrics", {{"address", host + ":" + std::to_string(m->exposer->port())}});
  return m;
}

// --init-from / spec.model.initFrom: the starting weights when no checkpoint was restored (a restore wins: a
// restarted job continues from its checkpoint, not from the file). Called after restore(), which may also have
// re-initialised the weights after a damaged in-memory snapshot.
void load_initial_weights(const TrainOptions& o, const GptConfig& cfg, bool restored, DistSetup& dist,
                          DeviceKind device, Trainer& trainer) {
  if (!o.init_from) return;
  const std::string& path = *o.init_from;
  if (restored) {
    log::info("worker", "restored a checkpoint: not initialising from the llm.c model",
              {{"path", path}, {"field", o.name_of("init-from", o.origins.init_from)}});
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
void export_model(const TrainOptions& o, const GptConfig& cfg, const DistSetup& dist, Trainer& trainer) {
  if (!o.export_to) return;
  const std::string& path = *o.export_to;
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
  const TrainOptions o = parse_train_options(argc, argv, 2, LauncherEnv::from_process());
  if (o.nproc > 0) return launch_train_world(argc, argv, o);
  // The device first: a wrong --device / spec.device fails before any data or model is touched.
  const DeviceChoice device = choose_device(o);
  if (!o.data) {
    usage_error(
        "--data DIR is required (make shards with `railyard data prepare`; or data.train in --config, or "
        "RAILYARD_DATA_DIR)");
  }
  enforce_path_roots(o);
  const GptConfig cfg = model_config(o);
  TrainConfig tc = train_config(o, cfg);
  const ShardGlobs shards = shard_globs(o, tc);

  // Joins the world the launcher (--nproc or the agent) describes in RANK/WORLD_SIZE/MASTER_*; one process otherwise.
  DistSetup dist = join_world(o, tc, device.kind, device.visible_gpus, device.cuda);
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

  const int threads = o.threads;
  // Refuse up front what cannot fit, instead of dying in an allocation or the OOM killer later. With expert-parallel
  // storage a rank holds E/ep experts (every shard the same size); a bad --ep is refused below.
  const int ep_flag = o.ep;
  const bool ep_storage =
      ep_flag > 1 && cfg.moe.experts > 0 && cfg.moe.experts % ep_flag == 0 && dist.zero == 0 && !dist.deterministic;
  check_memory_budget(ep_storage ? expert_shard_config(cfg, ep_flag, 0) : cfg, tc, o);
  ThreadPool pool(threads);
  cpu::set_gemm_threading(o.gemm_split, threads);
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
  ParallelModel pm = build_parallel_model(o, cfg, tc, dist, device.kind, device.cuda, kernels.get(), pool);
  Trainer trainer(pm.local_cfg, tc, pool, train, val.get(), dist.sync.get(), dist.sharded.get(), kernels.get());
  if (dist.groups != nullptr) trainer.set_layout(dist.groups->describe());
  if (pm.experts && dist.sharded != nullptr) {
    pm.experts->attach(dist.sharded->model().stage());  // the dp group is this (tp, pp) coordinate's
  } else if (pm.experts) {
    pm.experts->attach(trainer.model());
  }
  const std::unique_ptr<MetricsServer> metrics = serve_metrics(o, trainer);

  // Checkpoints (docs/checkpointing.md): restore before the first step, save every --ckpt-every steps, and on
  // SIGTERM save and exit 143.
  std::vector<ShardSpec> ckpt_shards = checkpoint_shards(cfg, trainer, dist, pm.experts.get());
  const CheckpointOptions co = checkpoint_options(o, dist, pm.experts.get(), ckpt_shards);
  Checkpointer checkpointer(co, cfg, trainer, std::move(ckpt_shards), metrics ? &metrics->registry : nullptr,
                            TrainMetrics::labels_from_env());
  const bool restored = checkpointer.restore().has_value();
  load_initial_weights(o, cfg, restored, dist, device.kind, trainer);
  checkpointer.attach();
  Checkpointer::install_signal_handlers();
  const int rc = trainer.run();
  checkpointer.finish();
  if (rc == 0) export_model(o, cfg, dist, trainer);
  return rc;
}

int cmd_gemm_rate(int argc, char** argv) {
  const GemmRateOptions o = parse_gemm_rate_options(argc, argv, 2);
  const GptConfig cfg = parse_model_spec(o.model);
  const int B = o.batch, T = o.seq;
  const int threads = o.threads > 0 ? o.threads : default_num_threads();
  const char* split = o.split == cpu::GemmThreading::kPool ? "pool" : "openblas";
  ThreadPool pool(threads);
  double rate;
  cpu::set_gemm_threading(o.split, threads);
  double per_cpu = 0;
  rate = measure_gemm_rate(pool, cfg, B, T, 5, nullptr, 0, &per_cpu);
  std::printf(
      "{\"gemm_flops_per_s\": %.6g, \"gemm_flops_per_cpu_s\": %.6g, \"threads\": %d, \"split\": \"%s\", "
      "\"model\": \"%s\", \"B\": %d, \"T\": %d}\n",
      rate, per_cpu, threads, split, describe(cfg).c_str(), B, T);
  return 0;
}

}  // namespace railyard::worker
