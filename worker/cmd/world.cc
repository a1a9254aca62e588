#include "worker/cmd/world.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/pod_env.h"
#include "worker/comm/connect.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_module.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/parallel/dist_launcher.h"

namespace railyard::worker {
namespace {

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

}  // namespace
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

DistSetup join_world(const TrainOptions& o, TrainConfig& tc, DeviceKind device, int visible_gpus,
                     const CudaModule* cuda_module) {
  DistSetup d;
  d.zero = o.zero;
  d.deterministic = o.deterministic;
  d.bucket_bytes = static_cast<size_t>(o.bucket_mb * 1048576.0);
  const long long tp = o.tp, pp = o.pp;
  const std::string& ws = o.env.world_size;
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
  const int cuda_device =
      device == DeviceKind::kCuda ? comm::cuda_device_for(o.env.local_rank_number(), visible_gpus) : 0;
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
std::unique_ptr<parallel::ExpertParallel> join_expert_parallel(const TrainOptions& opts, const GptConfig& cfg,
                                                               const TrainConfig& tc, DistSetup& dist,
                                                               DeviceKind device) {
  parallel::ExpertParallelOptions o;
  o.ep = opts.ep;
  o.algorithm = opts.ep_a2a;
  o.node_size = opts.ep_node_size;
  o.deterministic = dist.deterministic;
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

ParallelModel build_parallel_model(const TrainOptions& o, const GptConfig& cfg, const TrainConfig& tc, DistSetup& dist,
                                   DeviceKind device, const CudaModule* cuda, Kernels<float>* kernels,
                                   ThreadPool& pool) {
  const bool model_parallel =
      dist.groups != nullptr && (dist.groups->layout().tp * dist.groups->layout().pp > 1 || tc.cp > 1);
  if (model_parallel) {
    comm::ProcessGroups& g = *dist.groups;
    const parallel::ModelGroups mg = model_parallel_groups(dist, device);
    dist.sharded = std::make_unique<parallel::ParallelGpt>(cfg, tc, tc.micro_steps() / (g.layout().dp / tc.cp), pool,
                                                           g.world(), mg, kernels);
    log::info("worker", "model-parallel stage", {{"stage", dist.sharded->describe()}});
    if (g.layout().dp > 1 || dist.zero > 0 || dist.deterministic) {
      parallel::DataParallelOptions dpo;
      dpo.zero_stage = dist.zero;
      dpo.deterministic = dist.deterministic;
      dpo.bucket_bytes = dist.bucket_bytes;
      // dp x tp x pp on CUDA: the replica's gradient buckets over NCCL as the stage's backward reports them, as
      // plain data parallelism does (ZeRO 1/2: reduce-scatter and all-gather of device pieces; --deterministic: the
      // fixed tree on device leaves, all_to_all/all_gather over the NCCL dp dup).
      set_device_reduction(dist, kernels, cuda, dpo);
      dist.sync = parallel::parallel_gpt_data_parallel(&g.dp(), *dist.sharded, mg, tc, pool, dpo);
    }
  }
  ParallelModel out;
  out.experts = join_expert_parallel(o, cfg, tc, dist, device);
  std::unique_ptr<parallel::ExpertParallel>& expert_parallel = out.experts;
  // The layout of this rank's buffers: the global one, or with expert-parallel storage its E/ep experts per layer.
  out.local_cfg = expert_storage_sharded(expert_parallel.get(), dist) ? expert_parallel->local_config(cfg) : cfg;
  const GptConfig& model_cfg = out.local_cfg;
  if (model_cfg.moe.expert_shards > 1) log::info("worker", "expert storage", {{"model", describe(model_cfg)}});
  if (!model_parallel && (dist.groups != nullptr || dist.deterministic || dist.zero > 0)) {
    parallel::DataParallelOptions dpo;
    dpo.zero_stage = dist.zero;
    dpo.deterministic = dist.deterministic;
    dpo.bucket_bytes = dist.bucket_bytes;
    set_device_reduction(dist, kernels, cuda, dpo);
    if (expert_storage_sharded(expert_parallel.get(), dist)) {
      // The span's reduction takes the gradients' memory (NCCL on CUDA: reduced after backward, not overlapped); its
      // norm sums are host doubles over the Gloo ep group.
      dpo.group_spans = parallel::expert_group_spans(model_cfg, &expert_parallel->device_expert_data_parallel(),
                                                     &expert_parallel->group());
    }
    dist.sync = parallel::gpt_data_parallel(dist.groups ? &dist.groups->dp() : nullptr, model_cfg, tc, pool, dpo);
  }
  return out;
}

// `train --nproc N ...`: N copies of this command (without --nproc) as one local world.
int launch_train_world(int argc, char** argv, const TrainOptions& opts) {
  const int n = opts.nproc;
  if (const std::string& ws = opts.env.world_size; !ws.empty()) {
    throw ConfigError("--nproc inside a world (WORLD_SIZE=" + ws + " is set): the agent already launched the ranks");
  }
  parallel::LaunchOptions o;
  o.nproc = n;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    o.args.push_back(a);
  }
  if (!opts.has("threads") && opts.env.num_threads.empty()) {
    // The ranks share this machine's cores.
    o.args.push_back("--threads");
    o.args.push_back(std::to_string(std::max(1, default_num_threads() / o.nproc)));
  }
  return parallel::launch_local_world(o);
}

}  // namespace railyard::worker
