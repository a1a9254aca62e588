#include "common/log_tail.h"

#include <algorithm>
#include <cstdint>

namespace railyard {
namespace {

constexpr std::string_view kCut = "...";

bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The length of the well-formed UTF-8 sequence at s[i] and its code point; 0 when it is not one (stray continuation
// byte, truncated, overlong, surrogate, past U+10FFFF).
size_t decode(std::string_view s, size_t i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if (!continuation(d)) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

bool blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

}  // namespace

std::string sanitize_message(std::string_view text, size_t max_bytes, bool keep_end) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes * 2 + 8));
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t n = decode(text, i, cp);
    if (n == 0) {
      out += '?';
      ++i;
      continue;
    }
    if (cp == 0x1B && i + 1 < text.size() && text[i + 1] == '[') {
      // A terminal escape sequence (colours, cursor moves): CSI, parameter and intermediate bytes, a final byte.
      size_t j = i + 2;
      while (j < text.size() && text[j] >= 0x20 && text[j] <= 0x3F) ++j;
      if (j < text.size() && text[j] >= 0x40 && text[j] <= 0x7E) {
        i = j + 1;
        continue;
      }
    }
    if (cp == '\n') {
      out += '\n';
    } else if (cp == '\t') {
      out += ' ';
    } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) {
      // Control characters (escape sequences' ESC, NUL, CR, C1): dropped.
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  const size_t first = out.find_first_not_of(" \n");
  if (first == std::string::npos) return {};
  out.erase(0, first);
  out.erase(out.find_last_not_of(" \n") + 1);
  if (out.size() <= max_bytes) return out;
  if (max_bytes <= kCut.size()) {
    // No room for the marker: a plain cut at a character boundary.
    size_t end = max_bytes;
    while (end > 0 && continuation(static_cast<unsigned char>(out[end]))) --end;
    return out.substr(0, end);
  }
  const size_t room = max_bytes - kCut.size();
  if (keep_end) {
    size_t start = out.size() - room;
    while (start < out.size() && continuation(static_cast<unsigned char>(out[start]))) ++start;
    return std::string(kCut) + out.substr(start);
  }
  size_t end = room;
  while (end > 0 && continuation(static_cast<unsigned char>(out[end]))) --end;
  return out.substr(0, end) + std::string(kCut);
}

LogTail::LogTail(size_t max_lines, size_t max_bytes) : max_lines_(max_lines), max_bytes_(max_bytes) {}

void LogTail::append(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    partial_.append(bytes.substr(0, nl));
    if (partial_.size() > 2 * max_bytes_) {
      // A line without end (a progress bar, binary output): only its newest bytes can be shown.
      size_t cut = partial_.size() - max_bytes_;
      while (cut < partial_.size() && continuation(static_cast<unsigned char>(partial_[cut]))) ++cut;
      partial_.erase(0, cut);
    }
    if (nl == std::string_view::npos) return;
    push_line(std::move(partial_));
    partial_.clear();
    bytes.remove_prefix(nl + 1);
  }
}

void LogTail::push_line(std::string line) {
  if (blank(line)) return;  // blank lines say nothing and would push the cause out
  if (line.size() > max_bytes_) {
    size_t cut = line.size() - max_bytes_;
    while (cut < line.size() && continuation(static_cast<unsigned char>(line[cut]))) ++cut;
    line.erase(0, cut);
  }
  bytes_ += line.size();
  lines_.push_back(std::move(line));
  while (lines_.size() > max_lines_ || (bytes_ > max_bytes_ && lines_.size() > 1)) {
    bytes_ -= lines_.front().size();
    lines_.pop_front();
  }
}

void LogTail::clear() {
  lines_.clear();
  bytes_ = 0;
  partial_.clear();
}

std::string LogTail::text() const {
  std::string all;
  size_t shown = 0;
  for (const std::string& l : lines_) {
    // The unfinished line counts against the line bound as well: the oldest line goes for it.
    if (!blank(partial_) && lines_.size() - shown >= max_lines_) {
      ++shown;
      continue;
    }
    ++shown;
    all += l;
    all += '\n';
  }
  all += partial_;
  return sanitize_message(all, max_bytes_, true);
}

}  // namespace railyard
