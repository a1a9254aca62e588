// railyard-monitor's command line: one typed struct with its defaults, the usage text, and a parser that either
// fills the struct or names the flag and the fix (exit 2). Pure, so every flag is unit-tested
// (tests/unit/monitor/flags_test.cc) without starting a monitor.
#pragma once

#include <string>
#include <vector>

#include "common/error.h"
#include "monitor/monitor.h"

namespace railyard::monitor {

struct MonitorFlags {
  bool help = false;  // -h/--help: print kMonitorUsage and exit 0
  std::string kubeconfig;
  std::string token_file;  // --webhook-token-file; read by main, into opts.webhook_token
  Options opts;            // everything the Monitor itself takes
  bool leader_elect = false;
  std::string le_namespace, le_name = "railyard-monitor";
  double lease_duration = 15, renew_deadline = 10, retry_period = 2;
};

extern const char* const kMonitorUsage;

// args: argv[1..]. Throws ConfigError naming the flag and the fix; never exits.
MonitorFlags parse_monitor_flags(const std::vector<std::string>& args);

// What no single flag can check: --listen's HOST:PORT and, with --leader-elect, the order of the three timings.
// Separate from the parser because main reads the webhook token file in between, and its errors come first.
void check_monitor_flags(const MonitorFlags& f);

}  // namespace railyard::monitor
