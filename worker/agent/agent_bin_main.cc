// Temporary stand-alone `railyard-agent [agent] [-- COMMAND...]` until `railyard-worker agent` dispatches to
// agent_main; accepts the `agent` word so that callers can switch binaries without changing arguments.
#include <cstring>

#include "worker/agent/agent_main.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "agent") == 0) return railyard::worker::agent_main(argc - 1, argv + 1);
  return railyard::worker::agent_main(argc, argv);
}
