#include "worker/agent/rank_env.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "common/flash_checkpoint.h"
#include "common/pod_env.h"
#include "common/torchrun.h"

namespace railyard::worker {

WorkerConfig generation_config(const rdzv::Assignment& a) {
  WorkerConfig config = a.config;
  WorkerConfig::Layout& layout = config.layout ? *config.layout : config.layout.emplace();
  layout.dp = a.layout.dp;
  layout.tp = a.layout.tp;
  layout.pp = a.layout.pp;
  config.restore = a.restore;
  config.generation = a.generation;
  config.world_size = a.world_size;
  return config;
}

std::vector<std::string> worker_command(std::vector<std::string> command, const std::string& config_path) {
  if (!command.empty()) return command;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return {ec ? std::string("railyard-worker") : self.string(), "train", "--config", config_path};
}

std::vector<std::string> inherited_env(const char* const* envp) {
  static const std::set<std::string> kOverridden = {
      pod_env::kRank,
      pod_env::kLocalRank,
      pod_env::kWorldSize,
      pod_env::kLocalWorldSize,
      pod_env::kMasterAddr,
      pod_env::kMasterPort,
      pod_env::kGroupRank,
      "GROUP_WORLD_SIZE",
      pod_env::kRoleRank,
      "ROLE_WORLD_SIZE",
      "ROLE_NAME",
      "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_MAX_RESTARTS",
      "TORCHELASTIC_RUN_ID",
      "TORCHELASTIC_USE_AGENT_STORE",
      flash::kGenerationEnv,
      pod_env::kConfig,
      pod_env::kRestore,
      pod_env::kPodIndex,
      pod_env::kNumPods,
      pod_env::kDp,
      pod_env::kTp,
      pod_env::kPp,
      torchrun::kProgressFileEnv,
      torchrun::kProgressDirEnv,
      flash::kShmPrefixEnv,
      flash::kPeerStepsEnv,
      pod_env::kStoreToken,
      pod_env::kShmPeerCopy,
      names::kHostfileEnv,
      tls::kPeerCaEnv,
      tls::kPeerCertEnv,
      tls::kPeerKeyEnv,
      tls::kJobCaCertEnv,
      tls::kJobCaKeyEnv,  // the job CA's key stays in the agent: workers get a leaf, never the power to issue one
      pod_env::kRendezvousCa,
      pod_env::kRendezvousToken  // workers never talk to the service: keep the secret in the agent
  };
  std::vector<std::string> env;
  for (const char* const* e = envp; *e != nullptr; ++e) {
    std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (kOverridden.count(name)) continue;
    // torchrun mode's world (a template's PET_NNODES would be stale after the first resize); unset per rank too.
    if (std::find(torchrun::kAgentSetEnv.begin(), torchrun::kAgentSetEnv.end(), name) != torchrun::kAgentSetEnv.end())
      continue;
    // NCCL_* from the downward API read as empty when the Binding had no value for them (operator nccl_env.h):
    // unset, not empty, is NCCL's "choose yourself".
    if (kv.rfind("NCCL_", 0) == 0 && kv.back() == '=') continue;
    env.push_back(std::move(kv));
  }
  return env;
}

namespace {
bool is_ip(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

// The RAILYARD_* variables of the worker contract that do not depend on the local rank (both launch modes).
void add_railyard_env(std::vector<std::string>& env, const rdzv::Assignment& a, const RankEnvParams& p) {
  auto add = [&](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
  add(flash::kGenerationEnv, std::to_string(a.generation));
  add(pod_env::kConfig, p.config_path);
  add(pod_env::kRestore, a.restore);
  add(pod_env::kPodIndex, std::to_string(a.pod_index));
  add(pod_env::kNumPods, std::to_string(a.num_pods));
  add(pod_env::kDp, std::to_string(a.layout.dp));
  add(pod_env::kTp, std::to_string(a.layout.tp));
  add(pod_env::kPp, std::to_string(a.layout.pp));
  add(torchrun::kProgressDirEnv, p.progress_dir);
  add(flash::kShmPrefixEnv, p.shm_prefix);
  if (!p.peer_steps.empty()) {
    std::string steps;
    for (int64_t st : p.peer_steps) {
      if (!steps.empty()) steps += ',';
      steps += std::to_string(st);
    }
    add(flash::kPeerStepsEnv, steps);
  }
  add(pod_env::kStoreToken, p.store_token);
  if (p.peer_copy) add(pod_env::kShmPeerCopy, "1");
  if (!p.hostfile.empty()) add(names::kHostfileEnv, p.hostfile);
  if (!p.python_path.empty()) {
    std::string value = p.python_path;
    auto it =
        std::find_if(env.begin(), env.end(), [](const std::string& kv) { return kv.rfind("PYTHONPATH=", 0) == 0; });
    if (it != env.end()) {
      const std::string own = it->substr(std::string_view("PYTHONPATH=").size());
      env.erase(it);
      if (!own.empty()) {  // the image's or template's own entries stay, after ours
        value.push_back(':');
        value.append(own);
      }
    }
    add("PYTHONPATH", value);
  }
  if (p.peer_tls) {
    add(tls::kPeerCaEnv, p.peer_tls->ca_pem);
    add(tls::kPeerCertEnv, p.peer_tls->leaf.cert_pem);
    add(tls::kPeerKeyEnv, p.peer_tls->leaf.key_pem);
  }
}

}  // namespace

WorldHosts world_hosts(const rdzv::Assignment& a, const std::string& pod_domain, bool use_names) {
  WorldHosts w;
  if (!pod_domain.empty() && use_names && !a.pods.empty()) {
    w.names = true;
    for (const std::string& pod : a.pods) w.hosts.push_back(names::pod_fqdn(pod, pod_domain));
    w.master = w.hosts.front();
    return w;
  }
  w.master = a.master_addr;
  if (a.addresses.size() != a.pods.size()) return w;
  for (const std::string& ip : a.addresses) {
    if (!is_ip(ip)) return {a.master_addr, {}, false};
    w.hosts.push_back(ip);
  }
  return w;
}

std::vector<std::string> torchrun_env(std::vector<std::string> inherited, const rdzv::Assignment& a,
                                      const RankEnvParams& p) {
  std::vector<std::string> env = std::move(inherited);
  auto add = [&](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
  add(torchrun::kNnodesEnv, std::to_string(a.num_pods));
  add(torchrun::kNprocPerNodeEnv, std::to_string(a.local_world_size));
  add(torchrun::kNodeRankEnv, std::to_string(a.pod_index));
  add(torchrun::kMasterAddrEnv, p.master_addr.empty() ? a.master_addr : p.master_addr);
  add(torchrun::kMasterPortEnv, std::to_string(a.master_port));
  add(torchrun::kMaxRestartsEnv, "0");
  add(torchrun::kRdzvBackendEnv, "static");
  add(torchrun::kRdzvIdEnv, p.run_id);
  add_railyard_env(env, a, p);
  return env;
}

std::vector<std::string> rank_env(std::vector<std::string> inherited, const rdzv::Assignment& a, int local_rank,
                                  const RankEnvParams& p) {
  std::vector<std::string> env = std::move(inherited);
  auto add = [&](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
  const int global_rank = a.ranks[local_rank];
  add(pod_env::kRank, std::to_string(global_rank));
  add(pod_env::kLocalRank, std::to_string(local_rank));
  add(pod_env::kWorldSize, std::to_string(a.world_size));
  add(pod_env::kLocalWorldSize, std::to_string(a.local_world_size));
  add(pod_env::kGroupRank, std::to_string(a.pod_index));
  // The rest of what torch.distributed.run gives a script (one role, "default"), so an unmodified torchrun
  // script runs: a restart count of generation - 1 (every restart or resize opens a generation).
  add("GROUP_WORLD_SIZE", std::to_string(a.num_pods));
  add(pod_env::kRoleRank, std::to_string(global_rank));
  add("ROLE_WORLD_SIZE", std::to_string(a.world_size));
  add("ROLE_NAME", "default");
  add("TORCHELASTIC_RESTART_COUNT", std::to_string(std::max<int64_t>(0, a.generation - 1)));
  add("TORCHELASTIC_MAX_RESTARTS", p.max_restarts);
  add("TORCHELASTIC_RUN_ID", p.run_id);
  add("TORCHELASTIC_USE_AGENT_STORE", "False");
  add(pod_env::kMasterAddr, p.master_addr.empty() ? a.master_addr : p.master_addr);
  add(pod_env::kMasterPort, std::to_string(a.master_port));
  add(torchrun::kProgressFileEnv, p.progress_file);
  add_railyard_env(env, a, p);
  return env;
}

}  // namespace railyard::worker
