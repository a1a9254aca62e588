// A rank in its own process, for the failure tests (worker_comm_failures): the test SIGKILLs or SIGSTOPs it.
// Usage: worker_comm_peer HOST PORT RANK SIZE TIMEOUT_MS MODE. MODE "all_reduce" or "groups": the FaultWorkload
// forever; "idle": connect, then sleep (a peer that never sends).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/worker_comm/fault_workload.h"
#include "worker/comm/gloo_communicator.h"

using namespace railyard::worker::comm;

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s HOST PORT RANK SIZE TIMEOUT_MS all_reduce|groups|idle\n", argv[0]);
    return 2;
  }
  try {
    GlooOptions o;
    o.store_host = argv[1];
    o.bind_host = argv[1];
    o.store_port = std::atoi(argv[2]);
    o.rank = std::atoi(argv[3]);
    o.size = std::atoi(argv[4]);
    o.timeout = std::chrono::milliseconds(std::atoi(argv[5]));
    o.serve_store = false;
    o.prefix = "failure";
    auto comm = connect_gloo(o);
    std::string mode = argv[6];
    if (mode == "idle") {
      for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    testing::FaultWorkload work(*comm, mode);
    for (;;) work.step();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker_comm_peer: %s\n", e.what());
    return 1;
  }
}
