// Structured, line-oriented logging to stderr: `2026-11-22T02:40:00.123Z INFO  component: message k=v ...`.
// One line per call, written with a single write(2) so concurrent threads and processes never interleave.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace railyard::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

// Threshold from RAILYARD_LOG_LEVEL (debug|info|warn|error), default info.
void set_level(Level level);
Level level();
Level parse_level(std::string_view name);  // throws std::invalid_argument naming the accepted values

using Fields = std::vector<std::pair<std::string, std::string>>;

void write(Level level, std::string_view component, std::string_view message, const Fields& fields = {});

inline void debug(std::string_view c, std::string_view m, const Fields& f = {}) { write(Level::Debug, c, m, f); }
inline void info(std::string_view c, std::string_view m, const Fields& f = {}) { write(Level::Info, c, m, f); }
inline void warn(std::string_view c, std::string_view m, const Fields& f = {}) { write(Level::Warn, c, m, f); }
inline void error(std::string_view c, std::string_view m, const Fields& f = {}) { write(Level::Error, c, m, f); }

// Formats one line without writing it (used by write and by tests).
std::string format_line(Level level, std::string_view component, std::string_view message, const Fields& fields);

}  // namespace railyard::log
