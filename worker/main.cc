// railyard-worker: the training process. `railyard-worker train ...` trains a GPT on token shards on this machine's
// CPUs (docs/worker.md lists every flag); `railyard-worker gemm-rate ...` prints the GEMM rate MFU is measured
// against; `railyard-worker agent ...` is the pod-level launcher (worker/agent, when built). Exit codes: 0 done, 2 bad
// flags or input, 3 too many consecutive non-finite steps, 1 anything else.
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "common/rendezvous_protocol.h"
#include "worker/agent/agent_main.h"
#include "worker/cmd/flags.h"
#include "worker/cmd/train_command.h"
#include "worker/comm/communicator.h"

using namespace railyard;
using namespace railyard::worker;

using rdzv::kExitPeerLost;

int main(int argc, char** argv) {
  if (argc < 2) usage_error("missing command (train, gemm-rate or agent)");
  const std::string cmd = argv[1];
  try {
    if (cmd == "train") return cmd_train(argc, argv);
    if (cmd == "gemm-rate") return cmd_gemm_rate(argc, argv);
    if (cmd == "agent") return agent_main(argc - 1, argv + 1);  // argv[0] of agent_main is "agent"
    if (cmd == "-h" || cmd == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    usage_error("unknown command '" + cmd + "' (train, gemm-rate or agent)");
  } catch (const std::bad_alloc&) {
    log::error("worker",
               "out of memory allocating the training buffers: lower --batch or --seq, or use a smaller "
               "--model");
    return 1;
  } catch (const ConfigError& e) {
    log::error("worker", e.what());
    return 2;
  } catch (const comm::CommError& e) {
    // A lost peer (its process, pod or node died) is the peer's failure, not this rank's: exit with a code the
    // operator's default failure policy retries (>= 128), or losing a node would fail the job through the survivor's
    // exit before the lost pod is noticed (docs/elastic.md).
    log::error("worker", e.what(), {{"exit_code", std::to_string(kExitPeerLost)}});
    return kExitPeerLost;
  } catch (const std::exception& e) {
    log::error("worker", e.what());
    return 1;
  }
}
