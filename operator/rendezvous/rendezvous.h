// The rendezvous service: the operator's side of the agent protocol (docs/rendezvous.md). Served only by the
// leader; the operator constructs it on gaining leadership and destroys it on losing it. Agents re-join from
// scratch when a new leader has forgotten their job, so the service keeps no persistent state.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/tls/pki.h"
#include "common/worker_config.h"

namespace railyard::op {

// One rendezvous round of a job. open_generation() validates it and throws std::invalid_argument naming the field.
struct GenerationSpec {
  std::string job_key;            // "namespace/name"
  int64_t generation = 0;         // > 0; increases with every restart/resize (status.generation)
  std::vector<std::string> pods;  // pod names in replica order: pod i holds global ranks [i*procs, (i+1)*procs)
  int procs_per_pod = 1;
  // The worker configuration handed to every agent (the workers' RAILYARD_CONFIG). The service itself reads
  // layout {dp, tp, pp} with dp*tp*pp == pods.size()*procs_per_pod (absent: dp = world, tp = pp = 1) and restore,
  // the checkpoint to restore from (absent or "" = start fresh).
  WorkerConfig config;
  std::string token;  // the job's secret (Secret <job>-rendezvous, key "token"); compared in constant time
  // The UID of the pod that holds each name now (metadata.uid), as far as the operator has seen: see
  // RendezvousService::set_pod_uids (a name without a pod is absent). nullopt: the operator tells none, and pods are
  // known by name alone.
  std::optional<std::map<std::string, std::string>> pod_uids;
};

// A worker process of the current generation ended (reported by its agent). Delivered once per
// (generation, pod, local_rank). reason: "exited" (the process ended on its own), "stopped" (the agent stopped
// it because the agent itself got SIGTERM/SIGINT, e.g. pod deletion), "hung" (it runs, but its agent found it hung:
// message says why, onset since when), "agent_restarted" (a new agent instance
// joined a generation that had already started: the world is broken; local_rank/global_rank are -1), "silent" (no
// agent sent it: the service heard nothing from the pod for RendezvousOptions::silence_after while a peer was heard;
// uid names the pod, onset is when it was last heard, message says so; ranks are -1).
inline constexpr const char* kExitSilent = "silent";  // WorkerExit::reason of a pod that fell silent

struct WorkerExit {
  std::string job_key;
  int64_t generation = 0;
  std::string pod;
  int local_rank = -1;
  int global_rank = -1;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // 0 when it exited normally
  std::string reason = "exited";
  // The rank's last output lines when it failed (the agent's ExitReport "message"), sanitized and bounded
  // (kMaxExitMessageBytes); "" when the agent sent none.
  std::string message{};  // a default member initializer: positional initializers may leave it out
  double onset = 0;       // reason "hung": when the hang began (unix seconds; the ExitReport's); "silent": last heard
  std::string uid{};      // reason "silent": the UID of the pod that fell silent
  // When the operator received the report (set by Controller::report_exit): how long a survivor's peer-lost exit has
  // waited for the culprit's own report (op::hold_for_culprit).
  std::chrono::steady_clock::time_point received{};
};

// The world did not complete within join_timeout after a pod started waiting for it.
struct JoinTimeout {
  std::string job_key;
  int64_t generation = 0;
  std::vector<std::string> missing;  // pods that never joined
  std::vector<std::string> joined;
};

struct RendezvousOptions {
  // How long a pod waits for the rest of the world before it gets 408 (then it retries, starting a new window).
  std::chrono::milliseconds join_timeout{300000};
  // Upper bound for one long-poll request (join/status "wait_ms"); the agent re-polls after it.
  std::chrono::milliseconds max_poll{10000};
  // HTTP request threads: `threads` always run; a request that finds none idle gets one more, up to `max_threads`
  // (request_pool.h). A long-poll (a join while the world forms) holds its thread, so a world of N pods forming at
  // once needs about N; beyond max_threads requests wait for a free thread.
  int threads = 64;
  int max_threads = 2048;
  // Base for the bootstrap store port when rank 0's agent reported none (29500 + fnv1a(job_key) % 1000).
  int default_store_port_base = 29500;
  // The server certificate (chained to the CA the pods trust, RAILYARD_RENDEZVOUS_CA) and its key, PEM. Empty:
  // plain HTTP (--rendezvous-tls off; the token then crosses the pod network in cleartext).
  tls::CertKey serving;
  // A pod whose agent promised a heartbeat and sent no request for max(this, 3 x its heartbeat) while a peer of its job
  // was heard is reported as a "silent" exit (silence.h; docs/rendezvous.md "A pod that falls silent"). 0: never.
  std::chrono::milliseconds silence_after{0};
};

class RendezvousService {
 public:
  // Binds host:port (port 0 = any free port) and starts serving, over TLS when options.serving is set; throws
  // railyard::Error when it cannot bind, ConfigError when the certificate or key is unusable.
  RendezvousService(std::string host, int port, RendezvousOptions options = {});
  ~RendezvousService();  // stops the server and joins its threads
  RendezvousService(const RendezvousService&) = delete;
  RendezvousService& operator=(const RendezvousService&) = delete;

  int port() const;
  bool tls() const;

  // Replaces the job's older generation: agents waiting on or running it learn promptly that it is superseded.
  // Re-opening the current generation with the same number is a no-op (idempotent reconcile); a lower number
  // than the current one is ignored (stale).
  void open_generation(const GenerationSpec& spec);
  // Which pod (UID) holds each of the job's pod names now: the pods the operator sees that are not being deleted.
  // A UID that held a name once and no longer does comes from a pod that was replaced (a container left running on a
  // node whose kubelet died, a partitioned pod): fenced for good, even if a stale cache names it again. Its join is
  // refused with "fenced" and it is told to stop; its status poll says "fenced"; its exits and progress are stale. A
  // UID the service has not been told of yet (a replacement created a moment ago, even while the name's holder is still
  // the pod it replaces) is asked to retry. A joined pod of a forming generation whose UID no longer holds its name
  // leaves the world. Replaces what was told before, across generations.
  void set_pod_uids(const std::string& job_key, std::map<std::string, std::string> uids);
  // Forgets the job; agents then see status "closed" and stop. Their requests keep being authenticated.
  void close_job(const std::string& job_key);

  // Called from a service thread, outside the service's lock (it may call back into the service).
  void set_exit_handler(std::function<void(const WorkerExit&)> handler);
  void set_join_timeout_handler(std::function<void(const JoinTimeout&)> handler);

  struct Progress {
    int64_t generation = 0;
    int64_t step = 0;  // from the lowest global rank that reported
    double loss = 0;
    double tokens_per_second = 0;
    int ranks_done = 0;  // ranks of this generation that exited with code 0
    int world_size = 0;
    bool all_succeeded = false;
    bool world_complete = false;       // every pod joined this generation
    std::vector<std::string> missing;  // pods that have not joined yet
    int64_t first_step = 0;            // the first step any rank reported in this generation (0: none yet)
    std::chrono::system_clock::time_point first_step_at{};  // when it arrived
    std::chrono::system_clock::time_point last_step_at{};   // when the highest step so far arrived (epoch: none)
    // The most any rank of this generation reported (cumulative for its process): seconds its steps waited for
    // synchronous checkpoint saves, and its checkpoint restore took. 0 when none reported them.
    double checkpoint_stall_seconds = 0;
    double restore_seconds = 0;
  };
  std::optional<Progress> progress(const std::string& job_key) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace railyard::op
