// The syntax of the worker's command lines: `--key value`, `--key=value`, and the switches --deterministic and
// --sequence-parallel. What the values mean is train_options.h's (and gemm-rate's) business: the map lives only
// while those options are built.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace railyard::worker {

using Flags = std::map<std::string, std::string>;

// The usage text of `railyard-worker` (every train flag, gemm-rate).
extern const char* const kUsage;

// Prints the message and the usage to stderr and exits 2.
[[noreturn]] void usage_error(const std::string& msg);

// argv[first..]: every flag must be in `known`; -h/--help prints the usage and exits 0.
Flags parse_flags(int argc, char** argv, int first, const std::vector<std::string>& known);

}  // namespace railyard::worker
