// Watch-stream framing and event decoding (common/kube/client.h: LineFramer, parse_watch_line): the bytes a
// (possibly truncated or garbled) watch connection delivers. The first byte picks where the stream is cut into
// chunks, so lines spanning reads are exercised too.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/kube/client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;
  std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  railyard::kube::LineFramer framer;
  size_t lines = 0;
  auto on_line = [&](std::string_view line) {
    if (line.empty()) __builtin_trap();  // the framer promises non-empty lines
    ++lines;
    try {
      auto ev = railyard::kube::parse_watch_line(line, "GET /api/v1/pods?watch=1");
      if (ev && ev->type != railyard::kube::WatchEvent::Type::Bookmark && !ev->object.is_object()) __builtin_trap();
    } catch (const railyard::Error&) {
      // ApiError (ERROR events, incl. Gone) and malformed lines: the informer relists or re-watches.
    }
    return true;
  };
  for (size_t at = 0; at < stream.size(); at += chunk) {
    if (!framer.feed(stream.substr(at, chunk), on_line)) __builtin_trap();
  }
  // Whatever is left is an incomplete last line: never more than the bytes after the last newline.
  if (framer.pending().size() > stream.size()) __builtin_trap();
  return 0;
}
