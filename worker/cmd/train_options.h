// The options of `railyard-worker train`, typed and complete: built once by parse_train_options (command_line.h) from,
// in this order of
// precedence, the command line, the worker configuration (--config FILE, what the agent writes from the TrainingJob),
// the environment (LauncherEnv), and the defaults written in TrainOptions below (the only place they live). Every stage
// of cmd_train reads this struct; none parses a flag or reads the environment again. docs/worker.md "Options".
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "worker/kernels/cpu/kernels.h"
#include "worker/optim/offload.h"

namespace railyard::worker {

// The process environment the train command reads, once (LauncherEnv::from_process). The world in
// torch.distributed's names comes from the launcher (the agent, or --nproc); the RAILYARD_* ones from the operator's
// pod spec or the agent (common/pod_env.h). "" = unset.
struct LauncherEnv {
  std::string rank, local_rank, world_size, local_world_size, master_addr, master_port;
  std::string data_dir, data_root, checkpoint_root;  // RAILYARD_DATA_DIR, _DATA_ROOT, _CHECKPOINT_ROOT
  std::string metrics_port, pod_ip;                  // RAILYARD_METRICS_PORT, RAILYARD_POD_IP
  std::string restore;                               // RAILYARD_RESTORE
  std::string job_namespace, job_name, job_uid;      // the TrainingJob, for the checkpoints' identity
  std::string generation, shm_prefix, peer_steps;    // the in-memory tier (common/flash_checkpoint.h)
  std::string shm_peer_copy;                         // RAILYARD_SHM_PEER_COPY ("1": slots copied to a peer)
  std::string progress_file;                         // RAILYARD_PROGRESS_FILE (common/torchrun.h)
  std::string num_threads;                           // RAILYARD_NUM_THREADS

  static LauncherEnv from_process();
  // RANK / LOCAL_RANK / LOCAL_WORLD_SIZE as numbers (0, 0, 1 when unset); WORLD_SIZE is checked where it is joined.
  int rank_number() const;
  int local_rank_number() const;
  int local_world_number() const;
};

// Which worker-configuration field set an option (messages then name the TrainingJob's field, e.g. spec.data.train);
// "" = the command line or the environment.
struct ConfigOrigins {
  std::string data, val_data, init_from, ckpt_dir;
};

struct TrainOptions {
  std::string config;  // --config FILE, "" = none
  ConfigOrigins origins;
  LauncherEnv env;
  std::set<std::string> given;       // flags given on the command line (without "--"): they win over the configuration
  std::set<std::string> configured;  // flags the configuration set (config_file.cc)

  // Where it runs.
  int nproc = 0;  // --nproc N: launch N local ranks of this command (0 = not given)
  std::string device = "auto";
  int threads = 0;  // resolved: --threads, else RAILYARD_NUM_THREADS, else the CPUs this process may use
  cpu::GemmThreading gemm_split = cpu::GemmThreading::kPool;  // --gemm-split pool|openblas

  // The model. The spec text is resolved against --init-from's file in model_config (train_setup.h).
  std::optional<std::string> model;  // preset or l=,c=,nh=,t=,v=; absent: --init-from's shape, else tiny
  std::optional<std::string> init_from, export_to;
  std::optional<int> moe_experts;  // absent: dense
  int moe_top_k = 1;
  double moe_capacity_factor = 1.25, moe_aux_coef = 0.01;
  bool moe_tuning_given = false;  // --moe-top-k / --moe-capacity-factor / --moe-aux-coef (they need --moe-experts)

  // The data: globs (a directory means its train_*.bin / val_*.bin); --data falls back to RAILYARD_DATA_DIR.
  std::optional<std::string> data, val_data;
  // The platform's roots and how messages name them (the flag, or the variable it came from); "" = no restriction.
  std::string data_root, data_root_name, ckpt_root, ckpt_root_name;

  // The recipe.
  int steps = 10, batch = 4, seq = 64;
  int64_t global_batch_tokens = 0;  // 0 = batch * seq
  double lr = 6e-4, min_lr_frac = 0.1, weight_decay = 0.1, grad_clip = 1.0;
  int warmup = 0;
  uint64_t seed = 1337;
  int val_every = 0, val_steps = 10, sample_every = 0, sample_tokens = 64;
  double peak_flops = 0;
  int max_bad_steps = 3;
  std::string log_json;

  // Memory.
  std::optional<std::string> recompute;  // none|selective|full, resolved against the model (parse_recompute)
  std::optional<int> recompute_layers;
  OffloadMode offload = OffloadMode::kNone;
  int offload_threads = 1;

  // Parallelism over the launcher's world.
  int tp = 1, pp = 1, cp = 1, zero = 0;
  bool deterministic = false, sequence_parallel = false;
  double bucket_mb = 25;
  int ep = 1;
  std::string ep_a2a = "flat";
  int ep_node_size = 0;  // 0 = LOCAL_WORLD_SIZE
  std::vector<int> dp_split, slow_ranks;
  double slow_factor = 1;

  // Observability.
  std::optional<int> metrics_port;  // this rank's port: --metrics-port or RAILYARD_METRICS_PORT, plus LOCAL_RANK
  std::string metrics_host;         // --metrics-host, else RAILYARD_POD_IP, else 127.0.0.1

  // Checkpoints.
  std::string ckpt_dir;
  int ckpt_every = 0, ckpt_keep = 3, ckpt_shm_every = 0;
  bool ckpt_async = true;
  double ckpt_term_budget = 8;
  std::string resume = "auto";  // --resume, the configuration's restore, RAILYARD_RESTORE; never without anything to
                                // restore from

  bool has(const std::string& flag) const { return given.count(flag) != 0; }
  // How messages name an option: "--data", or "spec.data.train (--config FILE)" when the configuration set it.
  std::string name_of(const std::string& flag, const std::string& origin) const;
};

}  // namespace railyard::worker
