#include "deploy/local/node_agent/signals.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace railyard::node_agent {

int parse_signal(const std::string& text) {
  std::string s = text;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  if (!s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); })) {
    if (s.size() <= 2) {
      int n = std::stoi(s);
      if (n >= 1 && n < NSIG) return n;
    }
  } else if (!s.empty()) {
    for (int n = 1; n < NSIG; ++n) {
      const char* abbrev = sigabbrev_np(n);
      if (abbrev != nullptr && s == abbrev) return n;
    }
  }
  throw ConfigError("--signal '" + text + "': not a signal: use a name like KILL, TERM, INT, HUP, USR1 or a number 1-" +
                    std::to_string(NSIG - 1));
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace railyard::node_agent
