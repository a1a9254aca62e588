#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <stdexcept>

#include "common/pod_env.h"

namespace railyard::log {
namespace {

Level initial_level() {
  const char* env = std::getenv(pod_env::kLogLevel);
  if (env == nullptr || *env == '\0') return Level::Info;
  try {
    return parse_level(env);
  } catch (const std::invalid_argument&) {
    return Level::Info;  // a bad level must not stop a component; the first line says so
  }
}

std::atomic<int>& threshold() {
  static std::atomic<int> t{static_cast<int>(initial_level())};
  return t;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::Debug:
      return "DEBUG";
    case Level::Info:
      return "INFO ";
    case Level::Warn:
      return "WARN ";
    case Level::Error:
      return "ERROR";
  }
  return "?????";
}

// Values with spaces, quotes or '=' are quoted so lines stay machine-splittable.
void append_value(std::string& out, const std::string& v) {
  bool quote = v.empty();
  for (char ch : v) {
    if (ch == ' ' || ch == '"' || ch == '=' || ch == '\n' || ch == '\t') quote = true;
  }
  if (!quote) {
    out += v;
    return;
  }
  out += '"';
  for (char ch : v) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace

void set_level(Level level) { threshold().store(static_cast<int>(level)); }
Level level() { return static_cast<Level>(threshold().load()); }

Level parse_level(std::string_view name) {
  if (name == "debug") return Level::Debug;
  if (name == "info") return Level::Info;
  if (name == "warn" || name == "warning") return Level::Warn;
  if (name == "error") return Level::Error;
  throw std::invalid_argument("unknown log level '" + std::string(name) + "': use debug, info, warn or error");
}

std::string format_line(Level lvl, std::string_view component, std::string_view message, const Fields& fields) {
  using namespace std::chrono;
  auto now = system_clock::now();
  auto secs = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[64];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(ms));
  std::string line;
  line.reserve(96 + message.size());
  line += ts;
  line += ' ';
  line += level_name(lvl);
  line += ' ';
  line += component;
  line += ": ";
  line += message;
  for (const auto& [k, v] : fields) {
    line += ' ';
    line += k;
    line += '=';
    append_value(line, v);
  }
  line += '\n';
  return line;
}

void write(Level lvl, std::string_view component, std::string_view message, const Fields& fields) {
  if (static_cast<int>(lvl) < threshold().load(std::memory_order_relaxed)) return;
  std::string line = format_line(lvl, component, message, fields);
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace railyard::log
