#include "worker/agent/agent_main.h"

#include <signal.h>
#include <sys/prctl.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "worker/agent/pod_agent.h"

namespace railyard::worker {
namespace {

constexpr const char* kUsage = R"(usage: railyard-worker agent [-- COMMAND [ARGS...]]
Joins the job's rendezvous and runs one worker process per local rank (RAILYARD_PROCS_PER_POD).
The worker command is everything after `--`; by default `railyard-worker train --config $RAILYARD_CONFIG`.
Environment (set by the operator; docs/rendezvous.md has the whole contract):
  RAILYARD_JOB_NAMESPACE, RAILYARD_JOB_NAME   the TrainingJob
  RAILYARD_POD_NAME, RAILYARD_POD_IP          this pod (downward API)
  RAILYARD_POD_UID                            this pod's metadata.uid: a replacement under the same name is told
                                              apart from a lost node's leftover (which is fenced: exit 202)
  RAILYARD_RENDEZVOUS_ADDR                    host:port of the operator's rendezvous service
  RAILYARD_RENDEZVOUS_TOKEN                   the job's token (Secret <job>-rendezvous, key token)
  RAILYARD_RENDEZVOUS_CA                      PEM of the CA that signed the service's certificate (the Secret's key
                                              ca.crt): HTTPS trusting only it; unset: plain HTTP
  RAILYARD_PROCS_PER_POD                      local ranks (default 1)
  RAILYARD_LAUNCHER                           perRank (default): the command once per local rank; torchrun: once
                                              per pod with PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
                                              PET_MASTER_ADDR/PORT, PET_MAX_RESTARTS=0 (the command is torchrun)
  RAILYARD_AGENT_DIR                          config/progress files (default $TMPDIR/railyard-agent/<ns>_<job>_<pod>)
  RAILYARD_AGENT_GRACE_SECONDS                SIGTERM -> SIGKILL grace for workers (default 10)
  RAILYARD_AGENT_POLL_MS                      status poll period, 50..1000 (default 500)
  RAILYARD_AGENT_UNREACHABLE_SECONDS          with no workers running, give up (exit 201) after the service is
                                              unreachable this long (default 0: never); running workers are never
                                              stopped for it
  RAILYARD_AGENT_RANK_METRICS=1               serve the ranks' series on RAILYARD_METRICS_PORT + local rank from
                                              their progress files and output (a program's pod; docs/programs.md)
Exit codes: 0 job done, 1 job closed after a local failure, 2 configuration/token error, 201 service unreachable
(retryable), 202 fenced (another pod holds this pod's name), 128+N stopped by signal N.
)";

std::atomic<int> g_stop{0};

extern "C" void on_stop_signal(int sig) { g_stop.store(sig); }

}  // namespace

int agent_main(int argc, char** argv) {
  std::vector<std::string> command;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (int k = i + 1; k < argc; ++k) command.emplace_back(argv[k]);
      if (command.empty()) {
        std::fprintf(stderr, "railyard-worker agent: nothing after `--`: give the worker command\n%s", kUsage);
        return kAgentConfigError;
      }
      break;
    }
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "railyard-worker agent: unknown argument \"%s\" (the worker command goes after `--`)\n%s",
                 a.c_str(), kUsage);
    return kAgentConfigError;
  }
  static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free atomic");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a service that goes away mid-request must not kill the agent
  // The agent's environment holds the job's rendezvous token and CA key, which its ranks never get (rank_env.h). The
  // ranks run as the agent's uid, and a process of the same uid may read /proc/<agent>/environ and /mem: not
  // dumpable, those files belong to root and only the agent reads its own secrets. The ranks are dumpable again (the
  // flag resets at exec).
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
    log::warn("agent", std::string("prctl(PR_SET_DUMPABLE, 0) failed: ") + std::strerror(errno));
  try {
    AgentConfig cfg = AgentConfig::from_env(std::move(command));
    return run_agent(cfg, g_stop);
  } catch (const ConfigError& e) {
    log::error("agent", e.what());
    return kAgentConfigError;
  } catch (const std::exception& e) {
    log::error("agent", std::string("fatal: ") + e.what());
    return kAgentFailed;
  }
}

}  // namespace railyard::worker
