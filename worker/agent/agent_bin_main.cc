// Temporary stand-alone `railyard-agent` until `railyard-worker agent` dispatches to agent_main.
#include "worker/agent/agent_main.h"

int main(int argc, char** argv) { return railyard::worker::agent_main(argc, argv); }
