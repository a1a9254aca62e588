// `railyard-worker train --nproc N`: a local world of N worker processes on this machine for development and tests
// (docs/parallel.md "Running it"). Under the operator, `railyard-worker agent` plays this role per pod.
#pragma once

#include <string>
#include <vector>

namespace railyard::worker::parallel {

struct LaunchOptions {
  int nproc = 1;
  std::string exe = "/proc/self/exe";
  std::vector<std::string> args;  // argv[1..] of every child (the same for all ranks)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port of master_addr
  // After the first rank fails, the others get this long to fail on their own (their collectives time out with a
  // CommError naming the dead peer) before they are sent SIGTERM, then SIGKILL 5 s later.
  int grace_ms = 0;  // 0: RAILYARD_COMM_TIMEOUT_MS (default 30000) + 5000
};

// Starts the ranks with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, prefixes
// every line they print with "[rank R] " (stdout to stdout, stderr to stderr), forwards SIGINT and SIGTERM to all of
// them, and waits for all. Returns 0 when every rank exited 0, else the first failure's exit code (128 + signal
// for a rank killed by a signal).
int launch_local_world(const LaunchOptions& options);

// A TCP port on `host` that nothing listens on right now.
int free_port(const std::string& host);

}  // namespace railyard::worker::parallel
