// A process's last words: the bounded tail of its output (the agent keeps one per rank, the way Kubernetes'
// terminationMessagePolicy FallbackToLogsOnError keeps a container's), and the sanitizing every such text gets before
// it reaches a job's status, conditions and events. The text comes from a tenant's process: it is bounded, valid UTF-8
// and free of control characters (but newlines) whatever the process wrote, so it can never break the JSON or the
// status write it travels in.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace railyard {

// Valid UTF-8 with at most max_bytes bytes: invalid or overlong sequences become '?', terminal escape sequences
// (ESC [ ... colours) are dropped, a tab becomes a space, other control characters (C0 but newline, DEL, C1) are
// dropped, and a cut never splits a character. Carriage returns are dropped, so "\r\n" reads as "\n". Leading and
// trailing whitespace is trimmed. A text longer than max_bytes keeps its start (keep_end: its end) and shows the cut as
// "..." (within max_bytes).
std::string sanitize_message(std::string_view text, size_t max_bytes, bool keep_end = false);

// Keeps the last max_lines lines of a byte stream, at most max_bytes bytes in all (the oldest lines go first; a
// single line longer than that keeps its end). Bytes arrive in arbitrary chunks: a line split across writes, or a
// UTF-8 character split across them, is joined before it is judged. Not thread-safe.
class LogTail {
 public:
  static constexpr size_t kDefaultLines = 10;
  static constexpr size_t kDefaultBytes = 2048;

  explicit LogTail(size_t max_lines = kDefaultLines, size_t max_bytes = kDefaultBytes);

  void append(std::string_view bytes);
  void clear();
  // The kept lines (the unfinished last one included), sanitized and joined with '\n'; at most max_bytes bytes.
  std::string text() const;

 private:
  void push_line(std::string line);

  size_t max_lines_, max_bytes_;
  std::deque<std::string> lines_;  // complete lines, raw bytes (sanitized in text())
  size_t bytes_ = 0;               // sum of lines_' sizes
  std::string partial_;            // the current unfinished line (its newest max_bytes * 2 bytes)
};

}  // namespace railyard
