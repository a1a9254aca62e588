// `railyard-worker agent`: the pod-level launcher. Joins the job's rendezvous, starts one worker process per local
// rank with the env a worker needs, reports exits and progress, re-joins in place when the generation is
// superseded, and forwards SIGTERM/SIGINT to its workers. Contract in docs/rendezvous.md.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "common/rendezvous_protocol.h"
#include "worker/agent/agent_config.h"

namespace railyard::worker {

// Exit codes of the agent (and so of the pod's container).
inline constexpr int kAgentSucceeded = 0;    // all local workers exited 0 and the service said the job is done
inline constexpr int kAgentFailed = 1;       // the job was closed while local workers had failed
inline constexpr int kAgentConfigError = 2;  // bad env, token refused, request refused: retrying cannot help
// The service stayed unreachable for unreachable_limit with no workers running (retryable, common/).
inline constexpr int kAgentUnreachable = rdzv::kAgentExitUnreachable;
// The service said another pod (UID) holds this pod's name: a leftover of a lost node; workers killed (common/).
inline constexpr int kAgentFenced = rdzv::kAgentExitFenced;

// Runs until the job is done/closed, a fatal error, or *stop_signal becomes non-zero (then returns 128 + signal
// after stopping the workers).
int run_agent(const AgentConfig& config, const std::atomic<int>& stop_signal);

}  // namespace railyard::worker
