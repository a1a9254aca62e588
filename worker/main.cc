// railyard-worker: the training process. `railyard-worker train ...` trains a GPT on token shards on this machine's
// CPUs (docs/worker.md lists every flag); `railyard-worker gemm-rate ...` prints the GEMM rate MFU is measured
// against; `railyard-worker agent ...` is the pod-level launcher (worker/agent, when built). Exit codes: 0 done, 2 bad
// flags or input, 3 too many consecutive non-finite steps, 1 anything else.
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/shm_store.h"
#include "common/error.h"
#include "common/log.h"
#include "common/metrics/metrics.h"
#include "common/path_roots.h"
#include "common/rendezvous_protocol.h"
#include "worker/agent/agent_main.h"
#include "worker/comm/connect.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_module.h"
#include "worker/comm/process_groups.h"
#include "worker/config_file.h"
#include "worker/data/data_loader.h"
#include "worker/device/cuda_module.h"
#include "worker/device/device.h"
#include "worker/interop/llmc_model.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/parallel/data_parallel.h"
#include "worker/parallel/dist_launcher.h"
#include "worker/parallel/dist_model.h"
#include "worker/parallel/expert_parallel.h"
#include "worker/train/checkpointing.h"
#include "worker/train/loader_source.h"
#include "worker/train/perf.h"
#include "worker/train/train_metrics.h"
#include "worker/train/trainer.h"

using namespace railyard;
using namespace railyard::worker;

namespace {

constexpr const char* kUsage = R"(usage: railyard-worker train [flags]
  --device D           auto (default: CUDA when this binary has CUDA and a GPU is visible, else the CPU), cpu or
                       cuda (an error without a GPU); the config file's "device" / spec.device
  --model SPEC         preset (tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b) or l=L,c=C,nh=NH,t=maxT,v=V
                       (default tiny; with --init-from, the file's shape unless given)
  --data PATH          training shards, from `railyard data prepare`: a directory DIR (its train_*.bin) or a glob
                       (e.g. /data/train_*.bin; the matching files, sorted); the config's data.train / spec.data.train
  --val-data PATH      validation shards: a glob, or a directory (its val_*.bin); default val_*.bin beside --data's
                       shards (DIR/val_*.bin); the config's data.val / spec.data.val
  --steps N            optimizer steps (default 10)
  --batch B            sequences per micro-batch (default 4)
  --seq T              tokens per sequence (default 64, <= maxT)
  --global-batch TOK   tokens per optimizer step, a multiple of B*T (default B*T; more = gradient accumulation)
  --lr X               peak learning rate (default 6e-4)
  --warmup N           linear warmup steps (default 0)
  --min-lr-frac F      cosine decays to lr*F at the last step (default 0.1)
  --weight-decay X     AdamW decay on 2-D weights (default 0.1)
  --grad-clip X        global-norm clip, 0 = off (default 1.0)
  --seed N             weight init and data order (default 1337)
  --val-every N        validate every N steps, 0 = never (default 0)
  --val-steps N        batches per validation (default 10)
  --sample-every N     log a text sample drawn from the model every N steps and after the last (default 0 = never;
                       rank 0, whole models only; "worker: sample" and the JSON log's "sample" event; the config's
                       training.sampleEvery / spec.training.sampleEvery)
  --sample-tokens N    tokens per sample (default 64, below the model's maxT; spec.training.sampleTokens)
  --threads N          compute threads (default RAILYARD_NUM_THREADS, else the CPUs this process may use)
  --init-from FILE     start from an llm.c GPT-2 model file (the config's model.initFrom / spec.model.initFrom); a
                       restored checkpoint wins over it
  --export FILE        write the final weights as an llm.c GPT-2 model file (fp32, version 3)
  --log-json FILE      append one JSON object per step/validation
  --peak-flops X       FLOP/s that MFU is relative to (default: the measured GEMM rate of this step's shapes)
  --max-bad-steps K    exit 3 after K consecutive steps with non-finite loss/gradients (default 3)
  --metrics-port P     serve Prometheus /metrics on P (0 = any free port; default RAILYARD_METRICS_PORT + LOCAL_RANK
                       when that is set, else off); labels from the agent's env (docs/worker.md)
  --metrics-host H     address to listen on (default RAILYARD_POD_IP, else 127.0.0.1)
  --config FILE        the worker configuration (the agent's RAILYARD_CONFIG: model, training, layout, data,
                       checkpoint, parallelism, memory; docs/rendezvous.md); flags given on the command line win
  --ckpt-dir DIR       checkpoint root (spec.checkpoint.path); saves params, AdamW m/v, counters, loader and LR position
  --ckpt-every N       save every N steps (default spec.checkpoint.intervalSteps, else 0: only at the end / SIGTERM)
  --ckpt-keep K        complete checkpoints kept (default 3)
  --ckpt-async on|off  copy the snapshot during the next step's forward/backward (default on)
  --ckpt-shm-every N   also keep the newest snapshot in shared memory every N steps, taken before the step is
                       reported (default spec.checkpoint.memoryIntervalSteps, else 0: off); restores prefer it when
                       every rank holds it and it is at least as new as the disk
  --ckpt-term-budget S on SIGTERM: finish the step, save within S seconds of the signal, exit 143 (default 8)
  --data-root DIR      refuse a --data/--val-data (or the config's data.train/val), or a shard they match, that
                       resolves outside DIR, symlinks included
                       (default RAILYARD_DATA_ROOT, which the operator's --data-root sets; unset = no restriction)
  --ckpt-root DIR      the same for --ckpt-dir and a --resume PATH (default RAILYARD_CHECKPOINT_ROOT)
  --resume MODE        auto (newest valid checkpoint in --ckpt-dir; the default without --config), never, or PATH (a
                       checkpoint root or one step-N directory; default RAILYARD_RESTORE / the config's restore)
  --nproc N            launch N local processes of this command as one world (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1,
                       MASTER_PORT = a free port); output prefixed "[rank R]"; SIGINT/SIGTERM forwarded; fails as a
                       whole when one rank fails. Under `railyard-worker agent` the world comes from the environment
  --tp T, --pp P       tensor / pipeline degree (default 1; dp = world / (T*P)); from the config's layout when given
  --zero S             ZeRO stage over the dp group: 0 off, 1 AdamW moments sharded, 2 gradients sharded too
  --deterministic      fixed reduction order independent of dp: bitwise-identical results for dp=4, dp=2 x
                       accumulation 2, dp=1 x accumulation 4 (needs a power-of-two accumulation per rank)
  --bucket-mb X        data-parallel all-reduce bucket size in MiB (default 25)
  --dp-split A0,A1,..  micro-batches per data-parallel rank for replicas of different speeds (sum = global batch /
                       micro-batch; default even); gradients are weighted by micro-batches, so any split trains the
                       same model as one process. Plain data parallelism only (no --tp/--pp/--deterministic)
  --slow-ranks R1,R2 --slow-factor F
                       TEST KNOB: ranks R1,R2 sleep (F-1) x each micro-batch's forward+backward wall time, as devices
                       F times slower would (measuring --dp-split; not for real runs; no --tp/--pp)
  --recompute MODE     activation recomputation: none (default), selective (each layer's attention probabilities are
                       recomputed in backward) or full (a layer keeps only its input and reruns its forward in
                       backward); results are bitwise unchanged, activation memory drops (docs/worker.md)
  --recompute-layers K recompute only the first K layers (default: all)
  --cp N               context parallelism: each sequence split over N ranks (ring attention), dp x cp x tp x pp =
                       world; needs T divisible by N; not with --sequence-parallel/--deterministic (docs/parallel.md)
  --sequence-parallel  Megatron sequence parallelism over the tp group (needs --tp > 1 and B*T divisible by tp):
                       layernorm/residual activations split along the tokens, all-gather/reduce-scatter instead of
                       all-reduce; same results (docs/parallel.md)
  --offload MODE       none (default) or optimizer: AdamW's moments in host memory, the update on a CPU thread
                       overlapped with the next step's forward layer by layer; results are bitwise unchanged, device
                       memory drops by 8 bytes per parameter (docs/worker.md "Optimizer offload"; not with
                       --zero/--tp/--pp)
  --offload-threads N  CPU threads of the offloaded update (default 1)
  --moe-experts E      mixture-of-experts MLP with E experts per layer (default: dense); with --nproc/--ep/--tp/--pp
  --moe-top-k K        experts per token (default 1)
  --moe-capacity-factor F  tokens per expert per micro-batch <= ceil(F * K * B*T / E); over it a token's choice is
                       dropped (its MLP contribution is 0, the residual passes); <= 0: no limit (default 1.25)
  --moe-aux-coef A     weight of the load-balancing loss A * E * sum_e f_e P_e per layer (default 0.01)
  --ep N               expert parallelism: experts split over groups of N data-parallel ranks (N divides E and dp)
  --ep-a2a ALG         flat (default) or hierarchical all_to_all for the expert dispatch/combine
  --ep-node-size G     ranks per node for --ep-a2a hierarchical (default LOCAL_WORLD_SIZE)
  --gemm-split MODE    pool (default: our threads split each GEMM over single-threaded OpenBLAS) or openblas
                       (OpenBLAS's own threads run the GEMMs); for measuring the threading choice
       railyard-worker gemm-rate [--model SPEC] [--batch B] [--seq T] [--threads N] [--split pool|openblas]
         (pool: our split over single-threaded OpenBLAS, what training uses; openblas: OpenBLAS's own threads)
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "railyard-worker: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

std::map<std::string, std::string> parse_flags(int argc, char** argv, int first,
                                               const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a.rfind("--", 0) != 0) usage_error("unexpected argument '" + a + "'");
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (key == "deterministic" || key == "sequence-parallel") {  // a switch: no value
      value = "true";
    } else {
      if (i + 1 >= argc) usage_error("--" + key + " needs a value");
      value = argv[++i];
    }
    bool ok = false;
    for (const auto& k : known) ok |= k == key;
    if (!ok) usage_error("unknown flag --" + key);
    out[key] = value;
  }
  return out;
}

long long to_int(const std::map<std::string, std::string>& f, const std::string& key, long long fallback) {
  auto it = f.find(key);
  if (it == f.end()) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0') throw ConfigError("--" + key + " '" + it->second + "' is not an integer");
  return v;
}

double to_double(const std::map<std::string, std::string>& f, const std::string& key, double fallback) {
  auto it = f.find(key);
  if (it == f.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') throw ConfigError("--" + key + " '" + it->second + "' is not a number");
  return v;
}

// "3,1" -> {3, 1}; names the flag on anything else.
std::vector<int> int_list(const std::map<std::string, std::string>& f, const std::string& key) {
  const std::string& text = f.at(key);
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    char* stop = nullptr;
    const long v = std::strtol(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || v < INT32_MIN || v > INT32_MAX)
      throw ConfigError("--" + key + " '" + text + "' is not a comma-separated list of integers (e.g. 3,1)");
    out.push_back(static_cast<int>(v));
    start = end + 1;
  }
  return out;
}

int threads_from(const std::map<std::string, std::string>& f) {
  const long long t = to_int(f, "threads", 0);
  if (t < 0 || t > 4096) throw ConfigError("--threads must be in 1..4096");
  return t > 0 ? static_cast<int>(t) : default_num_threads();
}

int cmd_gemm_rate(int argc, char** argv) {
  auto f = parse_flags(argc, argv, 2, {"model", "batch", "seq", "threads", "split"});
  const GptConfig cfg = parse_model_spec(f.count("model") ? f["model"] : "gpt2-124m");
  const int B = static_cast<int>(to_int(f, "batch", 4)), T = static_cast<int>(to_int(f, "seq", 64));
  const std::string split = f.count("split") ? f["split"] : "pool";
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

// The distributed side of `train` (docs/parallel.md "Running it").
struct DistSetup {
  std::unique_ptr<comm::ProcessGroups> groups;  // null: one process. Gloo: host buffers (and CPU tensors)
  // CUDA: the same layout over NCCL (comm::connect_worker_groups), the gradient buckets' dup of its dp group and the
  // stream-ordered reducer on it (declared before `sync`, which uses it).
  std::unique_ptr<comm::ProcessGroups> device_groups;
  std::unique_ptr<comm::Communicator> grad_comm;
  std::unique_ptr<comm::StreamReducer> reducer;
  std::unique_ptr<comm::Communicator> cp;         // --cp > 1: this rank's block of cp consecutive dp ranks
  std::unique_ptr<comm::Communicator> device_cp;  // the same block over NCCL (CUDA): ring attention's device memory
  std::unique_ptr<parallel::DataParallel> sync;
  std::unique_ptr<parallel::ParallelGpt> sharded;  // tp * pp > 1
  int zero = 0;
  bool deterministic = false;
  size_t bucket_bytes = size_t{25} << 20;
};

// The NCCL backend is in the CUDA module (worker/comm/nccl_module.h): railyard-worker links neither NCCL nor cudart.
comm::DeviceWorldConnector nccl_world_from(const CudaModule* m) {
  const auto fn = m != nullptr ? reinterpret_cast<comm::NcclConnectFn>(m->symbol(comm::kNcclConnectSymbol)) : nullptr;
  if (fn == nullptr) return nullptr;
  return [fn](const comm::GlooOptions& o, int cuda_device) {
    char err[1024] = {0};
    comm::Communicator* c = fn(&o, cuda_device, err, sizeof err);
    if (c == nullptr) throw comm::CommError(err[0] != '\0' ? err : "connect_nccl failed");
    return std::unique_ptr<comm::Communicator>(c);
  };
}

// The communicators of the tensor/pipeline-parallel stage (tp, pp, the tied-embedding pair, cp). On the CPU they are
// the Gloo process groups. On CUDA the stage hands them device memory (GptStage, ParallelModel), so they are the NCCL
// groups over the same ranks (comm::connect_worker_groups; docs/gpu.md "Tensor and pipeline parallelism on CUDA").
parallel::ModelGroups model_parallel_groups(DistSetup& d, DeviceKind device) {
  if (device == DeviceKind::kCuda) {
    if (d.device_groups == nullptr) {
      throw ConfigError(
          "--tp/--pp with spec.device / --device cuda: no NCCL groups were built (a CUDA build with the "
          "NCCL backend is needed): use --device cpu");
    }
    comm::ProcessGroups& g = *d.device_groups;
    return {&g.tp(), &g.pp(), g.embedding(), d.device_cp.get()};
  }
  comm::ProcessGroups& g = *d.groups;
  return {&g.tp(), &g.pp(), g.embedding(), d.cp.get()};
}

// CUDA with a dp group: the stream-ordered reducer of the gradient buckets (NCCL, on a dup of the device dp group,
// after the compute stream's kernels; docs/parallel.md "Data parallelism on CUDA"), and for ZeRO 1/2 and
// --deterministic the device and that dup (reduce-scatter/all-gather of device pieces; the fixed tree's all_to_all).
// Losses and flags still go over the Gloo dp group. Nothing on the CPU (the DataParallel background thread reduces host
// buffers).
void set_device_reduction(DistSetup& d, Kernels<float>* device, const CudaModule* cuda_module,
                          parallel::DataParallelOptions& dpo) {
  if (device == nullptr) return;
  dpo.device = device;  // ZeRO-1 with one replica needs no communicator
  if (d.device_groups == nullptr) return;
  d.grad_comm = d.device_groups->dp().dup("dp-grad");
  const auto fn = cuda_module != nullptr
                      ? reinterpret_cast<comm::NcclStreamReducerFn>(cuda_module->symbol(comm::kNcclStreamReducerSymbol))
                      : nullptr;
  char err[1024] = {0};
  comm::StreamReducer* r = fn != nullptr ? fn(d.grad_comm.get(), device->compute_stream(), err, sizeof err) : nullptr;
  if (r == nullptr) throw comm::CommError(std::string("nccl_stream_reducer: ") + err);
  d.reducer.reset(r);
  dpo.stream_reducer = r;
  dpo.device = device;
  dpo.device_dp = d.grad_comm.get();
}

DistSetup join_world(std::map<std::string, std::string>& f, TrainConfig& tc, DeviceKind device, int visible_gpus,
                     const CudaModule* cuda_module) {
  DistSetup d;
  const long long zero = to_int(f, "zero", 0);
  if (zero < 0 || zero > 2) throw ConfigError("--zero " + std::to_string(zero) + ": must be 0, 1 or 2");
  d.zero = static_cast<int>(zero);
  d.deterministic = f.count("deterministic") && f["deterministic"] != "false" && f["deterministic"] != "0";
  const double mb = to_double(f, "bucket-mb", 25);
  if (!(mb > 0) || mb > 65536) throw ConfigError("--bucket-mb must be a positive number of MiB");
  d.bucket_bytes = static_cast<size_t>(mb * 1048576.0);
  const long long tp = to_int(f, "tp", 1), pp = to_int(f, "pp", 1);
  if (tp < 1 || pp < 1) throw ConfigError("--tp and --pp must be >= 1");
  const std::string ws = env_or("WORLD_SIZE", "");
  char* end = nullptr;
  const long world = ws.empty() ? 1 : std::strtol(ws.c_str(), &end, 10);
  if (!ws.empty() && (*end != '\0' || world < 1)) {
    throw ConfigError("WORLD_SIZE '" + ws + "' is not a positive integer");
  }
  if (world == 1) {
    if (tc.cp > 1) throw ConfigError("--cp " + std::to_string(tc.cp) + " needs as many ranks: add --nproc");
    if (tp * pp > 1) {
      throw ConfigError("--tp " + std::to_string(tp) + " --pp " + std::to_string(pp) + " needs " +
                        std::to_string(tp * pp) + "+ ranks: add --nproc " + std::to_string(tp * pp) +
                        " (or run under `railyard-worker agent`)");
    }
    return d;
  }
  tc.world_size = static_cast<int>(world);
  const comm::Layout layout{static_cast<int>(world / (tp * pp)), static_cast<int>(tp), static_cast<int>(pp)};
  comm::validate_layout(layout, static_cast<int>(world));
  if (tc.cp > 1 && (layout.dp % tc.cp != 0 || d.deterministic)) {
    throw ConfigError("--cp " + std::to_string(tc.cp) + ": WORLD_SIZE / (tp*pp) = " + std::to_string(layout.dp) +
                      " ranks must be a multiple of cp (dp x cp), and --deterministic is not supported with it");
  }
  // One place builds the groups by device (Gloo on the CPU; Gloo for host values plus NCCL on CUDA).
  const int cuda_device = device == DeviceKind::kCuda
                              ? comm::cuda_device_for(std::atoi(env_or("LOCAL_RANK", "0").c_str()), visible_gpus)
                              : 0;
  comm::WorkerGroups wg = comm::connect_worker_groups(device, layout, comm::gloo_options_from_env(), cuda_device,
                                                      nccl_world_from(cuda_module));
  d.groups = std::move(wg.host);
  d.device_groups = std::move(wg.device);
  if (tc.cp > 1) {
    // cp consecutive ranks of the dp group share a replica's sequences; the gradient reduction stays over all dp x cp
    comm::Communicator& dp = d.groups->dp();
    std::vector<int> block;
    for (int i = 0; i < tc.cp; ++i) block.push_back(dp.rank() / tc.cp * tc.cp + i);
    d.cp = dp.split(block, "cp");
    if (d.device_groups != nullptr) d.device_cp = d.device_groups->dp().split(block, "cp");
  }
  if (d.groups->rank() != 0) {
    // Files and step lines that speak for the whole job come from rank 0 only.
    tc.progress_file.clear();
    tc.log_json.clear();
    tc.quiet = true;
  }
  return d;
}

// --ep/--ep-a2a/--ep-node-size: expert-parallel groups of consecutive dp ranks (docs/parallel.md "Expert
// parallelism"), installed in the trainer's model by attach(). Null without --ep (or --ep 1).
std::unique_ptr<parallel::ExpertParallel> join_expert_parallel(std::map<std::string, std::string>& f,
                                                               const GptConfig& cfg, const TrainConfig& tc,
                                                               DistSetup& dist, DeviceKind device) {
  parallel::ExpertParallelOptions o;
  o.ep = static_cast<int>(to_int(f, "ep", 1));
  o.algorithm = f.count("ep-a2a") ? f["ep-a2a"] : "flat";
  o.node_size = static_cast<int>(to_int(f, "ep-node-size", 0));
  o.deterministic = dist.deterministic;
  if (o.node_size < 0) throw ConfigError("--ep-node-size must be >= 1 (ranks per node)");
  if (o.ep == 1 && (f.count("ep-a2a") || f.count("ep-node-size"))) {
    throw ConfigError("--ep-a2a/--ep-node-size need --ep N > 1");
  }
  const comm::Layout l = dist.groups != nullptr ? dist.groups->layout() : comm::Layout{};
  parallel::validate_expert_parallel(cfg, o, l.dp, l.tp, l.pp, dist.zero, dist.deterministic, !tc.dp_split.empty());
  if (o.ep == 1) return nullptr;
  // On CUDA the model hands the exchange device memory: its all_to_all (and the expert gradients' reduction) run
  // over splits of the NCCL dp group. The tensor/pipeline stage's experts stay on the host (refused there).
  if (device == DeviceKind::kCuda && dist.sharded != nullptr) {
    throw ConfigError("--ep " + std::to_string(o.ep) +
                      " with --tp/--pp/--cp and spec.device / --device cuda: expert parallelism inside a "
                      "tensor/pipeline stage runs on the CPU only so far: use --device cpu, drop --tp/--pp/--cp (plain "
                      "data parallelism runs --ep on the device), or --ep 1");
  }
  comm::Communicator* device_dp = nullptr;
  if (device == DeviceKind::kCuda) {
    if (dist.device_groups == nullptr) {
      throw ConfigError(
          "--ep with spec.device / --device cuda: no NCCL groups were built (a CUDA build with the NCCL backend is "
          "needed): use --device cpu");
    }
    device_dp = &dist.device_groups->dp();
  }
  auto ep = std::make_unique<parallel::ExpertParallel>(dist.groups->dp(), o, device_dp);
  log::info("worker", "expert parallel", {{"layout", ep->describe()}});
  return ep;
}

// Expert-parallel storage: a rank holds only its ep group's share of the experts (E/ep per layer), reduced over the
// dp ranks holding the same ones. ZeRO and --deterministic keep the full layout (docs/parallel.md).
// The tensor/pipeline stage path keeps every expert (docs/parallel.md "MoE with tensor, pipeline and sequence
// parallelism").
bool expert_storage_sharded(const parallel::ExpertParallel* ep, const DistSetup& dist) {
  return ep != nullptr && dist.zero == 0 && !dist.deterministic && dist.sharded == nullptr;
}

// The checkpoint's tensor list: the full model, or a tp/pp stage's slices (shard_map), and with ZeRO over dp the
// parameters plus this rank's owned ranges of the moments (of the llm.c buffer, or of the stage's local buffer mapped
// through its shard_map). Every layout saves the same global tensors, so any checkpoint loads into any layout.
std::vector<ShardSpec> checkpoint_shards(const GptConfig& cfg, Trainer& trainer, const DistSetup& dist,
                                         parallel::ExpertParallel* ep) {
  if (expert_storage_sharded(ep, dist)) {
    comm::Communicator& edp = ep->expert_data_parallel();
    return expert_shard_state_shards(trainer.model().config(), trainer.state(), dist.groups->dp().rank(),
                                     dist.groups->dp().size(), edp.rank(), edp.size());
  }
  if (dist.sharded == nullptr && dist.zero == 0) return full_state_shards(cfg, trainer.state());
  std::vector<OwnedRange> owned;
  if (dist.zero > 0) {
    const parallel::BucketLayout& bl = dist.sync->layout();
    for (size_t b = 0; b < bl.buckets().size(); ++b) {
      const auto [s, e] = bl.own(b, dist.sync->rank());
      if (s < e) owned.push_back({s, e, bl.buckets()[b].shard_offset});
    }
  }
  if (dist.sharded == nullptr) {
    return zero_state_shards(cfg, trainer.state().params, dist.sync->shard_m(), dist.sync->shard_v(), owned,
                             dist.sync->rank(), dist.sync->size());
  }
  const comm::Layout& l = dist.groups->layout();
  const comm::Coord& c = dist.groups->coord();
  if (dist.zero == 0) {
    return shards_from_slices(dist.sharded->model().shard_map(), dist.sharded->host_params(), dist.sharded->adam_m(),
                              dist.sharded->adam_v(), c.tp, l.tp, c.dp, l.dp);
  }
  return zero_slices_shards(dist.sharded->model().shard_map(), dist.sharded->host_params(), dist.sync->shard_m(),
                            dist.sync->shard_v(), owned, c.tp, l.tp, c.dp, l.dp);
}

// `train --nproc N ...`: N copies of this command (without --nproc) as one local world.
int launch_train_world(int argc, char** argv, const std::map<std::string, std::string>& f) {
  const long long n = to_int(f, "nproc", 1);
  if (n < 1 || n > 256) throw ConfigError("--nproc must be in 1..256");
  if (const std::string ws = env_or("WORLD_SIZE", ""); !ws.empty()) {
    throw ConfigError("--nproc inside a world (WORLD_SIZE=" + ws + " is set): the agent already launched the ranks");
  }
  parallel::LaunchOptions o;
  o.nproc = static_cast<int>(n);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    o.args.push_back(a);
  }
  if (!f.count("threads") && env_or("RAILYARD_NUM_THREADS", "").empty()) {
    // The ranks share this machine's cores.
    o.args.push_back("--threads");
    o.args.push_back(std::to_string(std::max(1, default_num_threads() / o.nproc)));
  }
  return parallel::launch_local_world(o);
}

// The platform's roots (the operator's --data-root / --checkpoint-root reach us as env): the operator refuses specs
// that leave them lexically; here the paths are resolved on this pod's filesystem, so a symlink out of a root is
// caught too. Exit 2 (ConfigError) naming the flag, the config field and the root.
void enforce_path_roots(const std::map<std::string, std::string>& f, const ConfigOrigins& origins) {
  auto root_of = [&](const char* flag, const char* env) -> std::pair<std::string, std::string> {
    if (auto it = f.find(flag); it != f.end() && !it->second.empty()) return {it->second, std::string("--") + flag};
    if (const char* v = std::getenv(env); v != nullptr && *v != '\0') return {v, env};
    return {"", ""};
  };
  const bool from_config = f.count("config") != 0;
  const auto [data_root, data_root_name] = root_of("data-root", "RAILYARD_DATA_ROOT");
  const auto [ckpt_root, ckpt_root_name] = root_of("ckpt-root", "RAILYARD_CHECKPOINT_ROOT");
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> checks;  // what, path, root, root name
  // Data sources are globs: the pattern itself (lexically and through its existing directories), and every file it
  // matches (a symlinked shard, or a directory a wildcard crosses, that leads out of the root); the validation shards
  // also when they are the default beside the training shards.
  if (auto it = f.find("data"); it != f.end()) {
    const auto val = f.find("val-data");
    const struct {
      std::string what, pattern;
      bool given;
    } sources[] = {
        {from_config && !origins.data.empty() ? "--data (" + origins.data + " of --config)" : "--data", it->second,
         true},
        {val != f.end() && from_config && !origins.val_data.empty()
             ? "--val-data (" + origins.val_data + " of --config)"
         : val != f.end() ? "--val-data"
                          : "--val-data (the default, beside --data)",
         val != f.end() ? shard_glob(val->second, "val_*.bin") : default_val_glob(it->second), val != f.end()}};
    for (const auto& src : sources) {
      if (src.given) checks.emplace_back(src.what, src.pattern, data_root, data_root_name);
      if (data_root.empty()) continue;
      std::vector<std::string> files;
      try {
        files = expand_shard_pattern(src.pattern);
      } catch (const ConfigError&) {
        // nothing matches: cmd_train says so, naming the field
      }
      for (const auto& file : files) checks.emplace_back(src.what + " shard", file, data_root, data_root_name);
    }
  }
  if (auto it = f.find("ckpt-dir"); it != f.end())
    checks.emplace_back(from_config ? "--ckpt-dir (checkpoint.path of --config)" : "--ckpt-dir", it->second, ckpt_root,
                        ckpt_root_name);
  if (auto it = f.find("resume"); it != f.end() && it->second != "auto" && it->second != "never")
    checks.emplace_back("--resume", it->second, ckpt_root, ckpt_root_name);
  // --export writes weights: an output like checkpoints.
  if (auto it = f.find("export"); it != f.end()) checks.emplace_back("--export", it->second, ckpt_root, ckpt_root_name);
  for (const auto& [what, path, root, root_name] : checks) {
    if (auto msg = paths::check_within(what, path, root, root_name, true)) throw ConfigError(*msg);
  }
  // --init-from reads weights: the model a job starts from is either input data or the export/checkpoint of an
  // earlier job, so either root may hold it; with roots set it must be under one of them.
  if (auto it = f.find("init-from"); it != f.end() && (!data_root.empty() || !ckpt_root.empty())) {
    auto in_data = paths::check_within("--init-from", it->second, data_root, data_root_name, true);
    auto in_ckpt = paths::check_within("--init-from", it->second, ckpt_root, ckpt_root_name, true);
    if ((data_root.empty() || in_data) && (ckpt_root.empty() || in_ckpt)) {
      const bool relative = it->second.empty() || it->second.front() != '/';
      if (data_root.empty() || ckpt_root.empty() || relative) throw ConfigError(in_data ? *in_data : *in_ckpt);
      const std::string resolved = paths::resolve(it->second);
      throw ConfigError("--init-from '" + it->second + "'" +
                        (resolved != it->second ? " (resolves to " + resolved + ")" : std::string()) +
                        " is outside both " + data_root_name + " " + data_root + " and " + ckpt_root_name + " " +
                        ckpt_root + ": use a model file under one of them or ask the platform team to widen a root");
    }
  }
}

int cmd_train(int argc, char** argv) {
  auto f = parse_flags(argc, argv, 2,
                       {"model",
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
                        "slow-factor"});
  if (f.count("nproc")) return launch_train_world(argc, argv, f);
  ConfigOrigins origins;
  if (f.count("config")) origins = apply_config_file(f["config"], f);
  // The device first: a wrong --device / spec.device fails before any data or model is touched.
  const std::string device_spec = f.count("device") ? f["device"] : "auto";
  // The CUDA libraries are a module loaded only for CUDA runs (worker/device/cuda_module.h): `cuda`, or `auto` with
  // GPU device nodes. Its runtime then gives the GPU count resolve_device sees; CPU runs never load it.
  int visible_gpus = 0;
  CudaModule* cuda_module = nullptr;
#ifdef RAILYARD_HAVE_CUDA
  const bool built_with_cuda = true;
  if (device_spec == "cuda" || ((device_spec == "auto" || device_spec.empty()) && gpu_device_nodes() > 0)) {
    try {
      cuda_module = &CudaModule::load();
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(e.what()) + " (--device " + device_spec + ")");
    }
    visible_gpus = cuda_module->device_count();
  }
#else
  const bool built_with_cuda = false;
#endif
  DeviceKind device_kind;
  try {
    device_kind = resolve_device(device_spec, visible_gpus, built_with_cuda);
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) + " (--device " + device_spec + ")");
  }
  log::info("worker", "device",
            {{"device", device_name(device_kind)},
             {"requested", device_spec},
             {"visible_gpus", std::to_string(visible_gpus)},
             {"built_with_cuda", built_with_cuda ? "true" : "false"},
             {"cuda_module", cuda_module != nullptr ? cuda_module->path() : "not loaded"},
             {"cudart_mapped", library_mapped("libcudart") ? "true" : "false"}});
  if (!f.count("data")) {
    if (const char* d = std::getenv("RAILYARD_DATA_DIR"); d != nullptr && *d != '\0') f["data"] = d;
  }
  if (!f.count("data")) {
    usage_error(
        "--data DIR is required (make shards with `railyard data prepare`; or data.path in --config, or "
        "RAILYARD_DATA_DIR)");
  }

  enforce_path_roots(f, origins);

  std::optional<GptConfig> cfg;
  if (f.count("model")) cfg = parse_model_spec(f["model"]);
  if (f.count("init-from")) {
    const std::string& from = f["init-from"];
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
    const std::string world = env_or("WORLD_SIZE", "1");
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
  if (f.count("log-json")) tc.log_json = f["log-json"];
  if (f.count("recompute") || f.count("recompute-layers")) {
    tc.recompute = parse_recompute(f.count("recompute") ? f["recompute"] : "none",
                                   static_cast<int>(to_int(f, "recompute-layers", -1)), *cfg);
  }
  if (f.count("sequence-parallel")) {
    const std::string v = f["sequence-parallel"];
    if (v != "true" && v != "false" && v != "1" && v != "0") {
      throw ConfigError("--sequence-parallel=" + v + ": give it without a value, or true/false");
    }
    tc.sequence_parallel = v == "true" || v == "1";
    if (tc.sequence_parallel && to_int(f, "tp", 1) < 2) {
      throw ConfigError("--sequence-parallel needs tensor parallelism: add --tp 2 (or more) or drop the flag");
    }
  }
  tc.cp = static_cast<int>(to_int(f, "cp", 1));
  if (f.count("offload")) tc.offload = parse_offload(f["offload"]);
  tc.offload_threads = static_cast<int>(to_int(f, "offload-threads", 1));
  if (const char* p = std::getenv("RAILYARD_PROGRESS_FILE"); p != nullptr && *p != '\0') tc.progress_file = p;
  tc.validate(*cfg);

  // The shards: --data / spec.data.train and --val-data / spec.data.val are globs (a directory means its
  // train_*.bin / val_*.bin); validation defaults to val_*.bin beside the training shards.
  const std::string data = f["data"];
  const std::string val_data = f.count("val-data") ? shard_glob(f["val-data"], "val_*.bin") : default_val_glob(data);
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
  // Joins the world the launcher (--nproc or the agent) describes in RANK/WORLD_SIZE/MASTER_*; one process otherwise.
  DistSetup dist = join_world(f, tc, device_kind, visible_gpus, cuda_module);
  if ((!tc.dp_split.empty() || tc.slow_factor > 1) && dist.groups != nullptr &&
      (dist.groups->layout().tp * dist.groups->layout().pp > 1 || tc.cp > 1))
    throw ConfigError("--dp-split and --slow-ranks apply to plain data parallelism: drop --tp/--pp/--cp");
  // Data parallel: replica r reads its run of every global step; deterministic mode and an uneven --dp-split read the
  // job's whole sequence and the trainer keeps this replica's micro-batches (trainer.h).
  const bool whole_sequence = dist.deterministic || dist.groups == nullptr || !tc.dp_split.empty();
  LoaderBatchSource train(std::make_unique<DataLoader>(
      data, tc.batch, tc.seq_len, whole_sequence ? 0 : dist.groups->dp().rank() / tc.cp,
      whole_sequence ? 1 : dist.groups->dp().size() / tc.cp, tc.seed, cfg->vocab_size, true));
  std::unique_ptr<LoaderBatchSource> val;
  if (tc.val_every > 0) {
    val = std::make_unique<LoaderBatchSource>(
        std::make_unique<DataLoader>(val_data, tc.batch, tc.seq_len, 0, 1, tc.seed, cfg->vocab_size, false));
  }

  const int threads = threads_from(f);
  // Refuse up front what cannot fit, instead of dying in an allocation or the OOM killer later.
  // With expert-parallel storage a rank holds E/ep experts (every shard the same size); a bad --ep is refused below.
  const int ep_flag = static_cast<int>(to_int(f, "ep", 1));
  const bool ep_storage =
      ep_flag > 1 && cfg->moe.experts > 0 && cfg->moe.experts % ep_flag == 0 && dist.zero == 0 && !dist.deterministic;
  const MemoryBudget need = memory_budget(ep_storage ? expert_shard_config(*cfg, ep_flag, 0) : *cfg, tc.batch,
                                          tc.seq_len, threads, tc.recompute);
  const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (phys > 0 && static_cast<double>(need.total()) > phys) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "needs %.2f GiB (%s) but the machine has %.2f GiB", need.total() / 1073741824.0,
                  "params + grads + AdamW m, v + activations", phys / 1073741824.0);
    throw ConfigError(std::string("--model/--batch/--seq: training ") + buf +
                      ": use a smaller model, --batch or --seq (and --global-batch to keep the batch)");
  }
  const std::string split = f.count("gemm-split") ? f["gemm-split"] : "pool";
  if (split != "pool" && split != "openblas") throw ConfigError("--gemm-split must be pool or openblas");
  ThreadPool pool(threads);
  cpu::set_gemm_threading(split == "pool" ? cpu::GemmThreading::kPool : cpu::GemmThreading::kOpenBlas, threads);
  // The device before the model (a tensor/pipeline-parallel stage allocates on it) and the data-parallel reducer,
  // which enqueues on its stream (after join_world: on CUDA that made this rank's GPU current).
  std::unique_ptr<Kernels<float>> device;
  if (device_kind == DeviceKind::kCuda) device = cuda_module->create_kernels();
  const bool model_parallel =
      dist.groups != nullptr && (dist.groups->layout().tp * dist.groups->layout().pp > 1 || tc.cp > 1);
  if (tc.sample_every > 0) {
    // Samples come from a whole model in one process; data-parallel replicas hold the same one, so rank 0 alone
    // draws them.
    if (model_parallel || ep_flag > 1)
      throw ConfigError(
          "--sample-every (spec.training.sampleEvery) needs the whole model in one process: not with "
          "--tp/--pp/--cp/--ep; sample from a checkpoint with `railyard generate --checkpoint` instead");
    if (dist.groups != nullptr && dist.groups->rank() != 0) tc.sample_every = 0;
  }
  if (model_parallel) {
    comm::ProcessGroups& g = *dist.groups;
    const parallel::ModelGroups mg = model_parallel_groups(dist, device_kind);
    dist.sharded = std::make_unique<parallel::ParallelGpt>(*cfg, tc, tc.micro_steps() / (g.layout().dp / tc.cp), pool,
                                                           g.world(), mg, device.get());
    log::info("worker", "model-parallel stage", {{"stage", dist.sharded->describe()}});
    if (g.layout().dp > 1 || dist.zero > 0 || dist.deterministic) {
      parallel::DataParallelOptions dpo;
      dpo.zero_stage = dist.zero;
      dpo.deterministic = dist.deterministic;
      dpo.bucket_bytes = dist.bucket_bytes;
      // dp x tp x pp on CUDA: the replica's gradient buckets over NCCL as the stage's backward reports them, as
      // plain data parallelism does (ZeRO 1/2: reduce-scatter and all-gather of device pieces; --deterministic: the
      // fixed tree on device leaves, all_to_all/all_gather over the NCCL dp dup).
      set_device_reduction(dist, device.get(), cuda_module, dpo);
      dist.sync = parallel::parallel_gpt_data_parallel(&g.dp(), *dist.sharded, mg, tc, pool, dpo);
    }
  }
  std::unique_ptr<parallel::ExpertParallel> expert_parallel = join_expert_parallel(f, *cfg, tc, dist, device_kind);
  // The layout of this rank's buffers: the global one, or with expert-parallel storage its E/ep experts per layer.
  const GptConfig model_cfg =
      expert_storage_sharded(expert_parallel.get(), dist) ? expert_parallel->local_config(*cfg) : *cfg;
  if (model_cfg.moe.expert_shards > 1) log::info("worker", "expert storage", {{"model", describe(model_cfg)}});
  if (!model_parallel && (dist.groups != nullptr || dist.deterministic || dist.zero > 0)) {
    parallel::DataParallelOptions dpo;
    dpo.zero_stage = dist.zero;
    dpo.deterministic = dist.deterministic;
    dpo.bucket_bytes = dist.bucket_bytes;
    set_device_reduction(dist, device.get(), cuda_module, dpo);
    if (expert_storage_sharded(expert_parallel.get(), dist)) {
      // The span's reduction takes the gradients' memory (NCCL on CUDA: reduced after backward, not overlapped); its
      // norm sums are host doubles over the Gloo ep group.
      dpo.group_spans = parallel::expert_group_spans(model_cfg, &expert_parallel->device_expert_data_parallel(),
                                                     &expert_parallel->group());
    }
    dist.sync = parallel::gpt_data_parallel(dist.groups ? &dist.groups->dp() : nullptr, model_cfg, tc, pool, dpo);
  }
  Trainer trainer(model_cfg, tc, pool, train, val.get(), dist.sync.get(), dist.sharded.get(), device.get());
  if (dist.groups != nullptr) trainer.set_layout(dist.groups->describe());
  if (expert_parallel && dist.sharded != nullptr) {
    expert_parallel->attach(dist.sharded->model().stage());  // the dp group is this (tp, pp) coordinate's
  } else if (expert_parallel) {
    expert_parallel->attach(trainer.model());
  }
  // Metrics: the same numbers as the step log line, for Prometheus and railyard-monitor.
  std::optional<int64_t> metrics_port;
  if (f.count("metrics-port")) {
    metrics_port = to_int(f, "metrics-port", 0);
    // One flag for a whole --nproc world: rank r serves on P + LOCAL_RANK (0 stays "any free port").
    if (*metrics_port > 0) *metrics_port += std::atol(env_or("LOCAL_RANK", "0").c_str());
  } else if (const char* p = std::getenv("RAILYARD_METRICS_PORT"); p != nullptr && *p != '\0') {
    char* end = nullptr;
    const long base = std::strtol(p, &end, 10);
    if (*end != '\0' || base < 0) throw ConfigError(std::string("RAILYARD_METRICS_PORT '") + p + "' is not a port");
    metrics_port = base + std::atol(env_or("LOCAL_RANK", "0").c_str());
  }
  metrics::Registry registry;
  std::unique_ptr<TrainMetrics> train_metrics;
  std::unique_ptr<metrics::Exposer> exposer;
  if (metrics_port) {
    if (*metrics_port < 0 || *metrics_port > 65535) throw ConfigError("--metrics-port must be in 0..65535");
    const std::string host = f.count("metrics-host") ? f["metrics-host"] : env_or("RAILYARD_POD_IP", "127.0.0.1");
    train_metrics = std::make_unique<TrainMetrics>(registry, TrainMetrics::labels_from_env());
    trainer.set_metrics(train_metrics.get());
    exposer = std::make_unique<metrics::Exposer>(registry, host, static_cast<int>(*metrics_port));
    log::info("worker", "serving metrics", {{"address", host + ":" + std::to_string(exposer->port())}});
  }
  // Checkpoints (docs/checkpointing.md): restore before the first step, save every --ckpt-every steps, and on
  // SIGTERM save and exit 143.
  if (!f.count("resume")) {
    if (const char* r = std::getenv("RAILYARD_RESTORE"); r != nullptr && *r != '\0') f["resume"] = r;
  }
  CheckpointOptions co;
  if (f.count("ckpt-dir")) co.dir = f["ckpt-dir"];
  co.every = static_cast<int>(to_int(f, "ckpt-every", 0));
  co.keep = static_cast<int>(to_int(f, "ckpt-keep", 3));
  const std::string async = f.count("ckpt-async") ? f["ckpt-async"] : "on";
  if (async != "on" && async != "off") throw ConfigError("--ckpt-async must be on or off");
  co.async = async == "on";
  co.shm_every = static_cast<int>(to_int(f, "ckpt-shm-every", 0));
  co.term_budget_seconds = to_double(f, "ckpt-term-budget", 8);
  co.resume = f.count("resume") ? f["resume"] : "auto";
  if (co.resume == "auto" && co.dir.empty() && co.shm_every == 0) co.resume = "never";
  const std::string job_id = env_or("RAILYARD_JOB_NAMESPACE", "") + "_" + env_or("RAILYARD_JOB_NAME", "local");
  // The agent names its pod's segments (RAILYARD_SHM_PREFIX) and removes them when the pod ends (worker/agent).
  const int global_rank = static_cast<int>(std::atol(env_or("RANK", "0").c_str()));
  if (const std::string prefix = env_or("RAILYARD_SHM_PREFIX", ""); !prefix.empty()) {
    co.shm_name = prefix + "-r" + std::to_string(global_rank);
  } else {
    co.shm_name = ckpt::ShmStore::name_for(job_id, global_rank);
  }
  // Steps the agent fetched from a peer pod into this rank's slots (a replacement pod; docs/checkpointing.md).
  for (std::string rest = env_or("RAILYARD_SHM_PEER_STEPS", ""); !rest.empty();) {
    const auto comma = rest.find(',');
    co.shm_peer_steps.push_back(std::atoll(rest.substr(0, comma).c_str()));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  co.layout = nlohmann::json{{"dp", 1}, {"tp", 1}, {"pp", 1}, {"zero", dist.zero}};
  std::vector<ShardSpec> ckpt_shards = checkpoint_shards(*cfg, trainer, dist, expert_parallel.get());
  if (const int world = std::atoi(env_or("WORLD_SIZE", "1").c_str()); world > 1) {
    // Every rank of the world saves into the same directory under its global rank, with one run id for all ranks
    // of this world; data-parallel replicas split the writes of their identical state, and all ranks stop at the
    // same step on SIGTERM.
    co.rank = std::atoi(env_or("RANK", "0").c_str());
    co.world_size = world;
    co.run_id = job_id + "-g" + env_or("RAILYARD_GENERATION", "0") + "-" + env_or("MASTER_ADDR", "") + "-" +
                env_or("MASTER_PORT", "");
    for (char& c : co.run_id)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '-';
    if (dist.groups != nullptr) {
      const auto& l = dist.groups->layout();
      co.layout = nlohmann::json{{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"zero", dist.zero}};
      // Stage slices, ZeRO lists and expert shards carry their own split.
      if (dist.sharded == nullptr && dist.zero == 0 && !expert_storage_sharded(expert_parallel.get(), dist)) {
        for (auto& s : ckpt_shards) {
          s.replica_index = dist.groups->dp().rank();
          s.num_replicas = dist.groups->dp().size();
        }
      }
    }
    if (dist.groups != nullptr) {
      co.all_gather = [&dist](const std::vector<int64_t>& mine) {
        std::vector<int64_t> all(mine.size() * static_cast<size_t>(dist.groups->world().size()));
        dist.groups->world().all_gather(mine.data(), all.data(), mine.size(), comm::DType::kInt64);
        return all;
      };
    }
    if (dist.sharded != nullptr) {
      co.any_rank = [&dist](bool mine) { return dist.sharded->any(mine); };  // over the whole world
    } else if (dist.sync != nullptr) {
      co.any_rank = [&dist](bool mine) {
        for (double v : dist.sync->all_gather({mine ? 1.0 : 0.0}))
          if (v != 0) return true;
        return false;
      };
    }
  }
  Checkpointer checkpointer(co, *cfg, trainer, std::move(ckpt_shards), train_metrics ? &registry : nullptr,
                            TrainMetrics::labels_from_env());
  const auto restored = checkpointer.restore();
  // --init-from / spec.model.initFrom: the starting weights when no checkpoint was restored (a restore wins: a
  // restarted job continues from its checkpoint, not from the file). Loaded after restore(), which may also have
  // re-initialised the weights after a damaged in-memory snapshot.
  if (f.count("init-from") && restored) {
    log::info("worker", "restored a checkpoint: not initialising from the llm.c model",
              {{"path", f["init-from"]}, {"field", flag_name("init-from", origins.init_from, f)}});
  } else if (f.count("init-from") && dist.sharded != nullptr) {
    std::vector<float> full(num_parameters(*cfg));
    load_llmc_model(f["init-from"], *cfg, full.data());
    dist.sharded->load_full(full.data());  // each rank keeps its slices
    log::info("worker", "initialised from llm.c model", {{"path", f["init-from"]}});
  } else if (f.count("init-from") && device_kind != DeviceKind::kCpu) {
    std::vector<float> full(num_parameters(*cfg));
    load_llmc_model(f["init-from"], *cfg, full.data());
    trainer.load_params(full.data());
    log::info("worker", "initialised from llm.c model", {{"path", f["init-from"]}});
  } else if (f.count("init-from")) {
    load_llmc_model(f["init-from"], *cfg, trainer.model().params());
    log::info("worker", "initialised from llm.c model", {{"path", f["init-from"]}});
  }
  checkpointer.attach();
  Checkpointer::install_signal_handlers();
  const int rc = trainer.run();
  checkpointer.finish();
  if (rc == 0 && f.count("export") && dist.sharded != nullptr) {
    const std::vector<float> full = dist.sharded->gather_full(dist.groups->coord().dp);  // collective
    if (dist.groups->rank() == 0) {
      save_llmc_model(f["export"], *cfg, full.data());
      log::info("worker", "exported llm.c model", {{"path", f["export"]}});
    }
  } else if (rc == 0 && f.count("export") && (dist.groups == nullptr || dist.groups->rank() == 0)) {
    save_llmc_model(f["export"], *cfg, trainer.state().params);  // host memory on every device
    log::info("worker", "exported llm.c model", {{"path", f["export"]}});
  }
  return rc;
}

}  // namespace

using rdzv::kExitPeerLost;

int main(int argc, char** argv) {
  if (argc < 2) usage_error("missing command (train, gemm-rate or agent)");
  const std::string cmd = argv[1];
  try {
    if (cmd == "train") return cmd_train(argc, argv);
    if (cmd == "gemm-rate") return cmd_gemm_rate(argc, argv);
    if (cmd == "agent") return agent_main(argc - 1, argv + 1);  // argv[0] of agent_main is "agent"
    if (cmd == "-h" || cmd == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    usage_error("unknown command '" + cmd + "' (train, gemm-rate or agent)");
  } catch (const std::bad_alloc&) {
    log::error("worker",
               "out of memory allocating the training buffers: lower --batch or --seq, or use a smaller "
               "--model");
    return 1;
  } catch (const ConfigError& e) {
    log::error("worker", e.what());
    return 2;
  } catch (const comm::CommError& e) {
    // A lost peer (its process, pod or node died) is the peer's failure, not this rank's: exit with a code the
    // operator's default failure policy retries (>= 128), or losing a node would fail the job through the survivor's
    // exit before the lost pod is noticed (docs/elastic.md).
    log::error("worker", e.what(), {{"exit_code", std::to_string(kExitPeerLost)}});
    return kExitPeerLost;
  } catch (const std::exception& e) {
    log::error("worker", e.what());
    return 1;
  }
}
