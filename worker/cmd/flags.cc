#include "worker/cmd/flags.h"

#include <cstdio>
#include <cstdlib>

namespace railyard::worker {

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "railyard-worker: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

std::map<std::string, std::string> parse_flags(int argc, char** argv, int first,
                                               const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a.rfind("--", 0) != 0) usage_error("unexpected argument '" + a + "'");
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (key == "deterministic" || key == "sequence-parallel") {  // a switch: no value
      value = "true";
    } else {
      if (i + 1 >= argc) usage_error("--" + key + " needs a value");
      value = argv[++i];
    }
    bool ok = false;
    for (const auto& k : known) ok |= k == key;
    if (!ok) usage_error("unknown flag --" + key);
    out[key] = value;
  }
  return out;
}

}  // namespace railyard::worker
