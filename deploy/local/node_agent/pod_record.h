// What the agent knows about one pod bound to one of its nodes. Touched by the loop thread only (see README.md),
// so the record has no lock: the coordinator, the status reporter and the control actions all run there.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace railyard::node_agent {

struct PodRec {
  using Json = nlohmann::json;
  using Clock = std::chrono::steady_clock;
  using SysClock = std::chrono::system_clock;

  enum class State { New, Waiting, Running, Lost, Done };
  std::string uid, ns, name, node, container, image;
  Json pod;
  std::string ip;
  State state = State::New;
  int restart_count = 0;
  int backoff_step = 0;
  bool restart_pending = false;  // Waiting for a restart (not for a missing secret)
  pid_t pid = 0;
  SysClock::time_point started_at;
  Clock::time_point started_steady;
  std::string start_time;  // status.startTime, set once
  Json last_terminated;    // lastState.terminated after a restart
  std::string waiting_reason, waiting_message;
  Clock::time_point retry_at;
  std::optional<int64_t> grace_sent;  // deletion grace already applied
  bool delete_sent = false;
  bool frozen = false;
  std::string phase;  // last phase reported
  // A status patch the API server did not take (down, starting, or its authorizer not yet synced after a restart,
  // which answers 403 for a moment): resent by the loop's tick until it lands or a newer patch replaces it.
  // Without this a pod whose process ended during an API-server restart stayed Running forever.
  Json unsent_status;
  std::string unsent_phase;
  Clock::time_point status_retry_at;
  std::string key() const { return ns + "/" + name; }
  bool deleting() const { return pod["metadata"].contains("deletionTimestamp"); }
};

inline const char* state_name(PodRec::State s) {
  switch (s) {
    case PodRec::State::New:
      return "New";
    case PodRec::State::Waiting:
      return "Waiting";
    case PodRec::State::Running:
      return "Running";
    case PodRec::State::Lost:
      return "Lost";
    case PodRec::State::Done:
      return "Done";
  }
  return "?";
}

}  // namespace railyard::node_agent
