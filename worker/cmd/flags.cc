#include "worker/cmd/flags.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/error.h"
#include "worker/kernels/cpu/thread_pool.h"

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

long long to_int(const std::map<std::string, std::string>& f, const std::string& key, long long fallback) {
  auto it = f.find(key);
  if (it == f.end()) return fallback;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0') throw ConfigError("--" + key + " '" + it->second + "' is not an integer");
  return v;
}

double to_double(const std::map<std::string, std::string>& f, const std::string& key, double fallback) {
  auto it = f.find(key);
  if (it == f.end()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') throw ConfigError("--" + key + " '" + it->second + "' is not a number");
  return v;
}

std::vector<int> int_list(const std::map<std::string, std::string>& f, const std::string& key) {
  const std::string& text = f.at(key);
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    char* stop = nullptr;
    const long v = std::strtol(item.c_str(), &stop, 10);
    if (item.empty() || *stop != '\0' || v < INT32_MIN || v > INT32_MAX)
      throw ConfigError("--" + key + " '" + text + "' is not a comma-separated list of integers (e.g. 3,1)");
    out.push_back(static_cast<int>(v));
    start = end + 1;
  }
  return out;
}

int threads_from(const std::map<std::string, std::string>& f) {
  const long long t = to_int(f, "threads", 0);
  if (t < 0 || t > 4096) throw ConfigError("--threads must be in 1..4096");
  return t > 0 ? static_cast<int>(t) : default_num_threads();
}

}  // namespace railyard::worker
