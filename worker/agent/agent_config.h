// What one pod's agent runs with (AgentConfig, read from the pod's environment by pod_agent.cc) and the credentials
// it derives from the job's rendezvous token: the pieces the agent's parts (metrics, the peer-copy ring, the run
// itself) share, apart from the run (pod_agent.h), so that none of them includes the run.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/stable_names.h"
#include "common/tls/job_identity.h"
#include "worker/agent/hang_watch.h"

namespace railyard::worker {

struct AgentConfig {
  std::string ns;               // RAILYARD_JOB_NAMESPACE
  std::string job;              // RAILYARD_JOB_NAME
  std::string pod;              // RAILYARD_POD_NAME
  std::string pod_uid;          // RAILYARD_POD_UID (metadata.uid): the rendezvous fences a replaced pod by it
  std::string pod_ip;           // RAILYARD_POD_IP
  std::string rendezvous_addr;  // RAILYARD_RENDEZVOUS_ADDR host:port
  std::string token;            // RAILYARD_RENDEZVOUS_TOKEN
  // RAILYARD_RENDEZVOUS_CA (secretKeyRef <job>-rendezvous/ca.crt): the CA of the service's certificate, PEM; the
  // agent then speaks HTTPS and trusts only it. Empty: plain HTTP (the operator runs with --rendezvous-tls off).
  std::string rendezvous_ca;
  int procs_per_pod = 1;  // RAILYARD_PROCS_PER_POD
  // RAILYARD_LAUNCHER=torchrun (spec.program.launcher, resolved by the operator): the command is the pod's torchrun,
  // started once with PET_* and starting procs_per_pod ranks itself (common/torchrun.h). Unset or perRank: the
  // command once per local rank.
  bool torchrun = false;
  std::vector<std::string> command;  // worker command; empty = `<this binary> train --config $RAILYARD_CONFIG`
  std::string work_dir;              // RAILYARD_AGENT_DIR: per-generation config and progress files
  std::chrono::milliseconds poll_interval{500};  // RAILYARD_AGENT_POLL_MS: status poll period
  std::chrono::milliseconds join_wait{2000};     // long-poll hold of one join request
  std::chrono::milliseconds grace{10000};        // RAILYARD_AGENT_GRACE_SECONDS: SIGTERM -> SIGKILL
  // RAILYARD_AGENT_UNREACHABLE_SECONDS: how long an agent with no workers running waits for an unreachable service
  // before it exits kAgentUnreachable (retryable). 0 (the default): for ever. Running workers are never stopped for
  // it: training outlives its control plane, and the agent reports when the service returns.
  std::chrono::milliseconds unreachable_limit{0};
  // How long the service may deny knowing the job (unknown job or a wrong token) before the agent exits
  // kAgentConfigError: RAILYARD_AGENT_UNREACHABLE_SECONDS when set, else 600 s.
  std::chrono::milliseconds unknown_job_limit{600000};
  int metrics_port = -1;  // RAILYARD_AGENT_METRICS_PORT: /metrics on pod_ip:port (0 picks one); -1 = off
  std::string node;       // RAILYARD_NODE_NAME (label of the agent's series; may be empty)
  // RAILYARD_AGENT_PEER_PORT: the peer-copy listener of the in-memory tier on pod_ip (0 picks one; -1 = no peer copy).
  int peer_port = 0;
  // RAILYARD_AGENT_RANK_METRICS=1 (a program's pod): the agent serves each local rank's railyard_worker_* series on
  // pod_ip:(RAILYARD_METRICS_PORT + local rank), from its progress file and output, which it copies to its own
  // (worker/agent/rank_exporter.h). -1: the ranks serve their own (the built-in trainer).
  int rank_metrics_port = -1;
  // RAILYARD_JOB_CA + RAILYARD_JOB_CA_KEY (secretKeyRef <job>-rendezvous/job-ca.crt, job-ca.key): the job's own CA.
  // from_env issues this pod's leaf under it for pod_ip; the peer copies and the workers' bootstrap store then speak
  // TLS with it (common/tls/job_identity.h). Null: both without TLS (an operator that predates the job CA).
  std::shared_ptr<const tls::PodIdentity> identity;
  // RAILYARD_POD_DOMAIN (common/stable_names.h): "<service>.<namespace>.svc.<cluster domain>" when the operator names
  // the job's pods by DNS; the ranks then get MASTER_ADDR and the hostfile as names. "" = pod IPs.
  std::string pod_domain;
  // RAILYARD_AGENT_DNS_WAIT_SECONDS: how long a generation waits for this pod's name and the master's to resolve to
  // their IPs before its ranks start with pod IPs instead (a warning in the agent's log says which name did not).
  std::chrono::milliseconds dns_wait{names::kDefaultDnsWaitSeconds * 1000};
  // RAILYARD_HANG_STOPPED_SECONDS, RAILYARD_HANG_STALL_SECONDS: the agent's own hang detection (hang_watch.h; 0 turns
  // a rule off). Not in torchrun mode.
  HangPolicy hang;

  // Reads the environment; throws ConfigError naming the variable and the fix.
  static AgentConfig from_env(std::vector<std::string> command);
};

// The bootstrap store's token of one generation (RAILYARD_STORE_TOKEN of every worker of it): hex HMAC-SHA256 keyed
// by the job's rendezvous token over the job and the generation. Workers get this instead of the rendezvous token,
// which they never see: a worker (user code) can then read and write its own generation's store and nothing else,
// and the rendezvous token cannot be recovered from it.
std::string store_token(const std::string& rendezvous_token, const std::string& ns, const std::string& job,
                        int64_t generation);

// The token agents of one job present to each other's peer-copy listeners (in-memory checkpoint tier): hex
// HMAC-SHA256 keyed by the rendezvous token over the job. Peer copies travel in cleartext on the pod network, so the
// rendezvous token itself must not; a copy of this one opens the job's peer copies and nothing else.
std::string peer_copy_token(const std::string& rendezvous_token, const std::string& ns, const std::string& job);

// This pod's identity under the job CA of RAILYARD_JOB_CA and RAILYARD_JOB_CA_KEY (a leaf for pod_ip); null when
// neither is set. ConfigError naming the variable when only one is set, one is not PEM, or the key is not the CA's.
std::shared_ptr<const tls::PodIdentity> pod_identity(const std::string& pod_ip);

}  // namespace railyard::worker
