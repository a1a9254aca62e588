// What one local rank is started with: the generation's configuration file, the worker command, and the
// environment (docs/rendezvous.md "What each worker process gets"). Pure functions of the assignment and the agent's
// settings, so the contract with the worker is testable without forking anything.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous_protocol.h"
#include "common/stable_names.h"
#include "common/tls/job_identity.h"
#include "common/worker_config.h"

namespace railyard::worker {

// The generation's worker configuration (the content of the file RAILYARD_CONFIG names): the operator's, completed
// with this generation's place in the world (layout, restore, generation, world size).
WorkerConfig generation_config(const rdzv::Assignment& a);

// The worker command: the agent's own when it was given one (`agent -- COMMAND ...`), else
// `<this binary> train --config <config_path>`.
std::vector<std::string> worker_command(std::vector<std::string> command, const std::string& config_path);

// The agent's environment ("NAME=value" entries, e.g. from environ) as every rank inherits it: without the variables
// rank_env sets (a value in the pod spec never outlives the generation's), without the rendezvous token and the job
// CA's key (workers never talk to the service and never issue certificates: the secrets stay in the agent), and
// without NCCL_* variables set but empty.
std::vector<std::string> inherited_env(const char* const* envp);

// How a generation's ranks name its pods: MASTER_ADDR and the hosts of the hostfile (common/stable_names.h).
struct WorldHosts {
  std::string master;              // MASTER_ADDR: pod 0's DNS name, or its IP (the assignment's master_addr)
  std::vector<std::string> hosts;  // one per pod, in pod (rank) order; empty when a pod's IP is unknown: no hostfile
  bool names = false;              // DNS names (else pod IPs)
};

// With `pod_domain` (RAILYARD_POD_DOMAIN) and `use_names` (the agent found its own name and the master's resolving),
// every pod's DNS name `<pod>.<pod_domain>`; else the pods' IPs from the assignment (an address that is not an IPv4 or
// IPv6 address counts as unknown: it would otherwise go into every pod's hostfile as it came).
WorldHosts world_hosts(const rdzv::Assignment& a, const std::string& pod_domain, bool use_names);

// What a rank's environment needs besides the assignment.
struct RankEnvParams {
  std::string run_id;               // TORCHELASTIC_RUN_ID: "<namespace>_<job>"
  std::string max_restarts;         // TORCHELASTIC_MAX_RESTARTS: the job's failurePolicy.maxRestarts
  std::string config_path;          // RAILYARD_CONFIG
  std::string progress_file;        // RAILYARD_PROGRESS_FILE (per local rank; unused by torchrun_env)
  std::string progress_dir;         // RAILYARD_PROGRESS_DIR: progress-<local rank>.json in it, in both modes
  std::string shm_prefix;           // RAILYARD_SHM_PREFIX: the agent's in-memory checkpoint segments
  std::vector<int64_t> peer_steps;  // RAILYARD_SHM_PEER_STEPS: steps fetched from a peer; empty = not set
  bool peer_copy = false;           // RAILYARD_SHM_PEER_COPY=1: the agent copies the rank's slots to a peer pod
  std::string store_token;          // RAILYARD_STORE_TOKEN: the generation's bootstrap store token
  // RAILYARD_PEER_TLS_CA/_CERT/_KEY: the pod's identity under the job's CA, for the store over TLS; null: not set.
  std::shared_ptr<const tls::PodIdentity> peer_tls;
  std::string master_addr;  // MASTER_ADDR: a name (WorldHosts::master); "" = the assignment's master_addr
  std::string hostfile;     // RAILYARD_HOSTFILE: the generation's hostfile; "" = not set
  // Prepended to PYTHONPATH (the inherited value, if any, follows): the folder of the flash checkpoint module
  // (common/flash_checkpoint.h); "" = PYTHONPATH as inherited.
  std::string python_path;
};

// The environment of local rank `local_rank` of assignment a: `inherited` (see inherited_env) followed by the
// rank's place in the world as torch.distributed.run gives it (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...) and
// the RAILYARD_* variables of the worker contract.
std::vector<std::string> rank_env(std::vector<std::string> inherited, const rdzv::Assignment& a, int local_rank,
                                  const RankEnvParams& p);

// torchrun mode: the environment of the one process per pod (the user's torchrun): `inherited` followed by PET_*
// (common/torchrun.h: this generation's pod count, the pod's index, procs per pod, pod 0's address and the
// generation's port, static rendezvous, no restarts of torchrun's own, the run id) and the same RAILYARD_* variables as
// rank_env but RAILYARD_PROGRESS_FILE, which one environment for all local ranks cannot give per rank. RANK,
// LOCAL_RANK, WORLD_SIZE, MASTER_*, GROUP_*, ROLE_* and TORCHELASTIC_* are torchrun's to set for its ranks.
std::vector<std::string> torchrun_env(std::vector<std::string> inherited, const rdzv::Assignment& a,
                                      const RankEnvParams& p);

}  // namespace railyard::worker
