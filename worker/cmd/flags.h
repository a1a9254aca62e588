// The train command's flags: `--key value`, `--key=value`, and the switches --deterministic and
// --sequence-parallel; values stay strings until a stage reads them (to_int, to_double, int_list), so that the
// worker configuration (config_file.h) can fill in what the command line did not give.
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

// The flag's value as a number (fallback when absent); ConfigError naming the flag when it is not one.
long long to_int(const Flags& f, const std::string& key, long long fallback);
double to_double(const Flags& f, const std::string& key, double fallback);
// "3,1" -> {3, 1}; names the flag on anything else.
std::vector<int> int_list(const Flags& f, const std::string& key);
// --threads, else RAILYARD_NUM_THREADS, else the CPUs this process may use.
int threads_from(const Flags& f);

}  // namespace railyard::worker
