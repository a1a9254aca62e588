// Signal names for the fault-injection CLI ("KILL", "SIGTERM", "9").
#pragma once

#include <string>

namespace railyard::node_agent {

// Throws ConfigError listing accepted names.
int parse_signal(const std::string& text);
// "SIGKILL", or "signal 42" for unnamed ones.
std::string signal_name(int sig);

}  // namespace railyard::node_agent
