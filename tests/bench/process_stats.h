// What a benchmark reads of its own process: /proc/self/status fields (VmHWM, VmRSS, Threads) and CPU time.
#pragma once

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace railyard::bench {

// The number after `field` ("VmHWM:" in kiB, "Threads:") in /proc/self/status; -1 when absent.
inline long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field));
  return -1;
}

// Resident set size in bytes (VmRSS).
inline double rss_bytes() { return static_cast<double>(status_kib("VmRSS:")) * 1024; }

// User + system CPU seconds of this process so far.
inline double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace railyard::bench
