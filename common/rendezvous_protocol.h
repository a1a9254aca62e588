// JSON shapes of the rendezvous protocol between the operator's RendezvousService and `railyard-worker agent`
// (docs/rendezvous.md). Shared by both sides, which may not depend on each other. Parsing validates every field
// and throws ProtocolError naming the field, which the service turns into a 400.
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/worker_config.h"

namespace railyard::rdzv {

// Exit code of a rank whose collective failed because a peer went away (retryable; not a signal number 129-192). The
// operator holds a restart whose only causes are such exits briefly for the culprit's own report.
inline constexpr int kExitPeerLost = 200;
// Exit codes of the pod agent itself for infrastructure reasons, never a verdict on the training: the operator treats
// them as retryable whatever the job's exit-code policy says (a pod that ends with one is replaced, never failed).
// Unreachable: RAILYARD_AGENT_UNREACHABLE_SECONDS passed with no workers running and no service. Fenced: the service
// said another pod (another UID) now holds this pod's name, so this one is a leftover of a lost node and must stop.
inline constexpr int kAgentExitUnreachable = 201;
inline constexpr int kAgentExitFenced = 202;
inline constexpr bool is_agent_infrastructure_exit(int code) {
  return code == kAgentExitUnreachable || code == kAgentExitFenced;
}
// The pod's metadata.uid in the agent's environment (a fieldRef the operator puts in every agent pod).
inline constexpr const char* kPodUidEnv = "RAILYARD_POD_UID";
// Longest pod UID a request may carry (Kubernetes UIDs are 36-character UUIDs).
inline constexpr size_t kMaxPodUidLength = 128;

inline constexpr const char* kJoinPath = "/v1/join";
inline constexpr const char* kStatusPath = "/v1/status";
inline constexpr const char* kExitPath = "/v1/exit";
inline constexpr const char* kProgressPath = "/v1/progress";

class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline const nlohmann::json& field(const nlohmann::json& j, const char* name) {
  if (!j.is_object()) throw ProtocolError("request body must be a JSON object");
  auto it = j.find(name);
  if (it == j.end()) throw ProtocolError(std::string("field '") + name + "' is required");
  return *it;
}

inline std::string get_string(const nlohmann::json& j, const char* name, bool allow_empty = false) {
  const auto& v = field(j, name);
  if (!v.is_string()) throw ProtocolError(std::string("field '") + name + "' must be a string");
  auto s = v.get<std::string>();
  if (s.empty() && !allow_empty) throw ProtocolError(std::string("field '") + name + "' must not be empty");
  return s;
}

inline int64_t get_int(const nlohmann::json& j, const char* name, int64_t min, int64_t max) {
  const auto& v = field(j, name);
  if (!v.is_number_integer()) throw ProtocolError(std::string("field '") + name + "' must be an integer");
  int64_t x = v.get<int64_t>();
  if (x < min || x > max) {
    throw ProtocolError(std::string("field '") + name + "' must be in [" + std::to_string(min) + ", " +
                        std::to_string(max) + "], got " + std::to_string(x));
  }
  return x;
}

inline int64_t get_int_or(const nlohmann::json& j, const char* name, int64_t min, int64_t max, int64_t fallback) {
  if (!j.is_object() || !j.contains(name)) return fallback;
  return get_int(j, name, min, max);
}

inline double get_number(const nlohmann::json& j, const char* name) {
  const auto& v = field(j, name);
  if (!v.is_number()) throw ProtocolError(std::string("field '") + name + "' must be a number");
  return v.get<double>();
}

// Field `name` of j, an array of strings; with `per_pod`, exactly that many (one per pod).
inline std::vector<std::string> get_strings(const nlohmann::json& j, const char* name,
                                            std::optional<size_t> per_pod = std::nullopt) {
  const auto& v = field(j, name);
  const std::string bad =
      std::string("field '") + name + "' must be an array of strings" + (per_pod ? ", one per pod" : "");
  if (!v.is_array() || (per_pod && v.size() != *per_pod)) throw ProtocolError(bad);
  std::vector<std::string> out;
  for (const auto& s : v) {
    if (!s.is_string()) throw ProtocolError(bad);
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace detail

// Every request names its job and pod; the token travels as "Authorization: Bearer <token>". The pod is known by its
// name and its UID: a name is reused when a pod is replaced, so a container left running on a lost node (its kubelet
// dead) speaks under the same name as its replacement, and only the UID tells them apart (docs/rendezvous.md
// "Fencing").
struct JobRef {
  JobRef() = default;
  JobRef(std::string ns_, std::string job_, std::string pod_, std::string uid_ = "")
      : ns(std::move(ns_)), job(std::move(job_)), pod(std::move(pod_)), uid(std::move(uid_)) {}
  std::string ns;   // "namespace"
  std::string job;  // "job"
  std::string pod;  // "pod"
  std::string uid;  // "pod_uid": metadata.uid (RAILYARD_POD_UID); "" from an agent that predates fencing
  std::string key() const { return ns + "/" + job; }
};

inline void to_json(nlohmann::json& j, const JobRef& r) {
  j = {{"namespace", r.ns}, {"job", r.job}, {"pod", r.pod}};
  if (!r.uid.empty()) j["pod_uid"] = r.uid;
}
inline JobRef parse_job_ref(const nlohmann::json& j) {
  JobRef r{detail::get_string(j, "namespace"), detail::get_string(j, "job"), detail::get_string(j, "pod"), ""};
  if (j.contains("pod_uid")) {
    r.uid = detail::get_string(j, "pod_uid");
    if (r.uid.size() > kMaxPodUidLength)
      throw ProtocolError("field 'pod_uid' is longer than " + std::to_string(kMaxPodUidLength) + " characters");
  }
  return r;
}

struct JoinRequest {
  JobRef ref;
  int64_t generation = 0;  // the generation the agent last ran (0: none yet); informational
  int local_procs = 1;     // must equal the generation's procs_per_pod
  std::string pod_ip;
  int store_port = 0;    // a free port on pod_ip the agent offers for the bootstrap store if it gets rank 0 (0: none)
  std::string agent_id;  // random per agent process: tells a retried join from a restarted agent
  int64_t wait_ms = 0;   // long-poll: hold the request up to this long while the world is incomplete
  int peer_port = 0;     // port of the agent's peer-copy listener on pod_ip (0: it keeps no peer copies)
  // The agent promises a request (a status poll) at least this often for as long as it runs, whatever it is doing
  // (kMaxHeartbeatMs at most; 0: no promise). The service may then take a long silence of the pod as its loss
  // (docs/rendezvous.md "A pod that falls silent").
  int64_t heartbeat_ms = 0;
};
inline constexpr int64_t kMaxHeartbeatMs = 60000;

inline nlohmann::json to_json(const JoinRequest& r) {
  nlohmann::json j = r.ref;
  j["generation"] = r.generation;
  j["local_procs"] = r.local_procs;
  j["pod_ip"] = r.pod_ip;
  j["store_port"] = r.store_port;
  j["agent_id"] = r.agent_id;
  j["wait_ms"] = r.wait_ms;
  j["peer_port"] = r.peer_port;
  if (r.heartbeat_ms > 0) j["heartbeat_ms"] = r.heartbeat_ms;
  return j;
}

inline JoinRequest parse_join_request(const nlohmann::json& j) {
  JoinRequest r;
  r.ref = parse_job_ref(j);
  r.generation = detail::get_int(j, "generation", 0, INT64_MAX);
  r.local_procs = static_cast<int>(detail::get_int(j, "local_procs", 1, 4096));
  r.pod_ip = detail::get_string(j, "pod_ip");
  r.store_port = static_cast<int>(detail::get_int_or(j, "store_port", 0, 65535, 0));
  r.agent_id = detail::get_string(j, "agent_id");
  r.wait_ms = detail::get_int_or(j, "wait_ms", 0, 3600000, 0);
  r.peer_port = static_cast<int>(detail::get_int_or(j, "peer_port", 0, 65535, 0));
  r.heartbeat_ms = detail::get_int_or(j, "heartbeat_ms", 0, kMaxHeartbeatMs, 0);
  return r;
}

struct Layout {
  int dp = 1, tp = 1, pp = 1;
};

// 200 from /v1/join: the agent's place in the world.
struct Assignment {
  int64_t generation = 0;
  int world_size = 0;
  int num_pods = 0;
  int pod_index = 0;
  int local_world_size = 0;
  std::vector<int> ranks;  // global ranks of local ranks 0..local_world_size-1
  Layout layout;
  std::string master_addr;  // rank 0's pod IP: the bootstrap store
  int master_port = 0;
  std::string restore;  // checkpoint to restore from, "" = fresh start
  std::vector<std::string> pods;
  // The peer-copy listener of every pod, in pod order ("ip:port", "" when that agent offered none): the in-memory
  // tier's copies go around this ring (docs/checkpointing.md "The peer copy").
  std::vector<std::string> peers;
  // Every pod's IP, in pod order ("" where unknown): the hostfile's hosts when the job's pods are not named by DNS
  // (common/stable_names.h). Empty from a service that predates it.
  std::vector<std::string> addresses;
  WorkerConfig config;  // the generation's worker configuration (common/worker_config.h)
};

inline nlohmann::json to_json(const Assignment& a) {
  return {{"status", "ready"},
          {"generation", a.generation},
          {"world_size", a.world_size},
          {"num_pods", a.num_pods},
          {"pod_index", a.pod_index},
          {"local_world_size", a.local_world_size},
          {"ranks", a.ranks},
          {"layout", {{"dp", a.layout.dp}, {"tp", a.layout.tp}, {"pp", a.layout.pp}}},
          {"master_addr", a.master_addr},
          {"master_port", a.master_port},
          {"restore", a.restore},
          {"pods", a.pods},
          {"peers", a.peers},
          {"addresses", a.addresses},
          {"config", to_json(a.config)}};
}

inline Assignment parse_assignment(const nlohmann::json& j) {
  Assignment a;
  a.generation = detail::get_int(j, "generation", 1, INT64_MAX);
  a.world_size = static_cast<int>(detail::get_int(j, "world_size", 1, 1 << 24));
  a.num_pods = static_cast<int>(detail::get_int(j, "num_pods", 1, 1 << 24));
  a.pod_index = static_cast<int>(detail::get_int(j, "pod_index", 0, a.num_pods - 1));
  a.local_world_size = static_cast<int>(detail::get_int(j, "local_world_size", 1, 4096));
  const auto& ranks = detail::field(j, "ranks");
  if (!ranks.is_array() || static_cast<int>(ranks.size()) != a.local_world_size) {
    throw ProtocolError("field 'ranks' must be an array of local_world_size integers");
  }
  for (const auto& r : ranks) {
    if (!r.is_number_integer()) throw ProtocolError("field 'ranks' must hold integers");
    a.ranks.push_back(r.get<int>());
  }
  const auto& layout = detail::field(j, "layout");
  a.layout.dp = static_cast<int>(detail::get_int(layout, "dp", 1, 1 << 24));
  a.layout.tp = static_cast<int>(detail::get_int(layout, "tp", 1, 1 << 24));
  a.layout.pp = static_cast<int>(detail::get_int(layout, "pp", 1, 1 << 24));
  a.master_addr = detail::get_string(j, "master_addr");
  a.master_port = static_cast<int>(detail::get_int(j, "master_port", 1, 65535));
  a.restore = detail::get_string(j, "restore", true);
  a.pods = detail::get_strings(j, "pods");
  // Absent from a service that predates the peer copy: no peers.
  if (j.contains("peers")) a.peers = detail::get_strings(j, "peers", a.pods.size());
  // Absent from a service that predates it: no addresses (the hostfile then needs DNS names).
  if (j.contains("addresses")) a.addresses = detail::get_strings(j, "addresses", a.pods.size());
  try {
    a.config = parse_worker_config(detail::field(j, "config"));
  } catch (const WorkerConfigError& e) {
    throw ProtocolError(std::string("field 'config': ") + e.what());
  }
  return a;
}

struct StatusRequest {
  JobRef ref;
  int64_t generation = 0;  // the generation the agent runs
  int64_t wait_ms = 0;     // long-poll: hold while the answer would be "running"
};

inline nlohmann::json to_json(const StatusRequest& r) {
  nlohmann::json j = r.ref;
  j["generation"] = r.generation;
  j["wait_ms"] = r.wait_ms;
  return j;
}

inline StatusRequest parse_status_request(const nlohmann::json& j) {
  return {parse_job_ref(j), detail::get_int(j, "generation", 0, INT64_MAX),
          detail::get_int_or(j, "wait_ms", 0, 3600000, 0)};
}

// Reasons an exit report carries (see WorkerExit in operator/rendezvous/rendezvous.h).
inline constexpr const char* kExitExited = "exited";
inline constexpr const char* kExitStopped = "stopped";
// The rank still runs but its agent found it hung (worker/agent/hang_watch.h: stopped, or no step and no CPU); the
// message says which and why. exit_code and signal are 0: nothing exited.
inline constexpr const char* kExitHung = "hung";

// The most an exit report's "message" may carry (bytes): the agent sends at most LogTail's 2 KiB; the rest is room.
inline constexpr size_t kMaxExitMessageBytes = 4096;

struct ExitReport {
  JobRef ref;
  int64_t generation = 0;
  int local_rank = 0;
  int exit_code = 0;  // -1 when killed by a signal
  int signal = 0;
  std::string reason = kExitExited;
  // The rank's last output lines (common/log_tail.h) when it failed: why, in its own words. Optional ("" when an
  // older agent sends none); a tenant's text, so the service sanitizes it again before it reaches the job's status.
  std::string message{};  // a default member initializer: positional initializers may leave it out
  // reason "hung": when the hang began (unix seconds: the rank's last progress, or when it was first seen stopped); the
  // operator's time to detect. Optional (0: not sent), 0..kMaxOnset.
  double onset = 0;
};

// Upper bound of an exit report's onset (unix seconds, year 33658): a bound, so that no difference overflows.
inline constexpr double kMaxOnset = 1e12;

inline nlohmann::json to_json(const ExitReport& r) {
  nlohmann::json j = r.ref;
  j["generation"] = r.generation;
  j["local_rank"] = r.local_rank;
  j["exit_code"] = r.exit_code;
  j["signal"] = r.signal;
  j["reason"] = r.reason;
  if (!r.message.empty()) j["message"] = r.message;
  if (r.onset > 0) j["onset"] = r.onset;
  return j;
}

inline ExitReport parse_exit_report(const nlohmann::json& j) {
  ExitReport r;
  r.ref = parse_job_ref(j);
  r.generation = detail::get_int(j, "generation", 1, INT64_MAX);
  r.local_rank = static_cast<int>(detail::get_int(j, "local_rank", 0, 4095));
  r.exit_code = static_cast<int>(detail::get_int(j, "exit_code", -1, 255));
  r.signal = static_cast<int>(detail::get_int(j, "signal", 0, 128));
  r.reason = detail::get_string(j, "reason");
  if (r.reason != kExitExited && r.reason != kExitStopped && r.reason != kExitHung) {
    throw ProtocolError("field 'reason' must be \"exited\", \"stopped\" or \"hung\", got \"" + r.reason + "\"");
  }
  if (j.contains("message")) {
    r.message = detail::get_string(j, "message", true);
    if (r.message.size() > kMaxExitMessageBytes) {
      throw ProtocolError("field 'message' must be at most " + std::to_string(kMaxExitMessageBytes) + " bytes, got " +
                          std::to_string(r.message.size()));
    }
  }
  if (j.contains("onset")) {
    const auto& o = j["onset"];
    if (!o.is_number() || !(o.get<double>() >= 0 && o.get<double>() <= kMaxOnset))
      throw ProtocolError("field 'onset' must be a number of unix seconds in 0..1e12");
    r.onset = o.get<double>();
  }
  return r;
}

// Upper bound of the optional seconds in a progress report (about 31 years): a bound, so that no sum overflows.
inline constexpr double kMaxReportedSeconds = 1e9;

struct ProgressReport {
  JobRef ref;
  int64_t generation = 0;
  int local_rank = 0;
  int64_t step = 0;
  double loss = 0;
  double tokens_per_second = 0;
  // Optional, cumulative for the rank's process: seconds its steps waited for synchronous checkpoint saves, and its
  // checkpoint restore took (the operator's goodput ledger splits them out of training and start-up).
  std::optional<double> checkpoint_stall_seconds{};
  std::optional<double> restore_seconds{};
};

inline nlohmann::json to_json(const ProgressReport& r) {
  nlohmann::json j = r.ref;
  j["generation"] = r.generation;
  j["local_rank"] = r.local_rank;
  j["step"] = r.step;
  j["loss"] = r.loss;
  j["tokens_per_second"] = r.tokens_per_second;
  if (r.checkpoint_stall_seconds) j["checkpoint_stall_seconds"] = *r.checkpoint_stall_seconds;
  if (r.restore_seconds) j["restore_seconds"] = *r.restore_seconds;
  return j;
}

inline ProgressReport parse_progress_report(const nlohmann::json& j) {
  ProgressReport r;
  r.ref = parse_job_ref(j);
  r.generation = detail::get_int(j, "generation", 1, INT64_MAX);
  r.local_rank = static_cast<int>(detail::get_int(j, "local_rank", 0, 4095));
  r.step = detail::get_int(j, "step", 0, INT64_MAX);
  r.loss = detail::get_number(j, "loss");
  r.tokens_per_second = detail::get_number(j, "tokens_per_second");
  for (auto [name, field] : {std::pair{"checkpoint_stall_seconds", &r.checkpoint_stall_seconds},
                             std::pair{"restore_seconds", &r.restore_seconds}}) {
    if (!j.contains(name)) continue;
    const double v = detail::get_number(j, name);
    if (!std::isfinite(v) || v < 0 || v > kMaxReportedSeconds)
      throw ProtocolError(std::string("field '") + name + "' must be seconds from 0 to 1e9");
    *field = v;
  }
  return r;
}

// A 202 or 408 join reply names at most this many missing pods ("missing", in pod order) and counts them all in
// "missing_count"; messages that list pods do the same ("a, b, ... (N in all)"). Every waiting agent of a world of N
// gets such a reply, so a full list would cost N x N names (10,000 pods: 10^8) at the moment the service is busiest.
inline constexpr size_t kMaxPodsNamed = 20;
inline constexpr const char* kMissingCountKey = "missing_count";

// The "status" values of responses (docs/rendezvous.md has the status code of each).
namespace status {
inline constexpr const char* kReady = "ready";              // 200 join: the assignment
inline constexpr const char* kWaiting = "waiting";          // 202 join / 200 status: world incomplete
inline constexpr const char* kRunning = "running";          // 200 status: generation current and started
inline constexpr const char* kSuperseded = "superseded";    // 409 join / 200 status: a newer generation exists
inline constexpr const char* kDone = "done";                // 200 status: every rank of the generation exited 0
inline constexpr const char* kClosed = "closed";            // 410 / 200 status: the operator closed the job
inline constexpr const char* kUnknownJob = "unknown_job";   // 404: the service does not know the job (yet)
inline constexpr const char* kNotMember = "not_member";     // 409 join: pod is not part of the generation
inline constexpr const char* kFenced = "fenced";            // 409 join / 200 status: another pod UID holds the name
inline constexpr const char* kStarted = "already_started";  // 409 join: the generation started without this agent
inline constexpr const char* kTimeout = "timeout";          // 408 join: the world did not complete in time
inline constexpr const char* kRecorded = "recorded";        // 200 exit/progress
inline constexpr const char* kDuplicate = "duplicate";      // 200 exit: already recorded
inline constexpr const char* kStale = "stale";              // 200 exit/progress: for an older generation
inline constexpr const char* kError = "error";              // 400/401/403: body "error" says why
}  // namespace status

}  // namespace railyard::rdzv
