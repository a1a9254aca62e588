#include "common/log_tail.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

using namespace std::string_literals;
using railyard::LogTail;
using railyard::sanitize_message;

TEST_CASE("the tail keeps the last lines, within its line and byte bounds") {
  LogTail t(3, 64);
  CHECK(t.text().empty());
  t.append("one\ntwo\nthree\nfour\n");
  CHECK(t.text() == "two\nthree\nfour");
  // Blank lines do not push the cause out.
  t.append("\n\n   \n");
  CHECK(t.text() == "two\nthree\nfour");
  // The byte bound drops the oldest lines first.
  t.append(std::string(58, 'x') + "\n");
  CHECK(t.text() == "four\n" + std::string(58, 'x'));
  CHECK(t.text().size() <= 64);
  t.clear();
  CHECK(t.text().empty());
}

TEST_CASE("a line split across writes is joined; an unfinished last line is shown") {
  LogTail t(2, 128);
  t.append("err");
  t.append("or: no such ");
  CHECK(t.text() == "error: no such");
  t.append("file\nexit");
  CHECK(t.text() == "error: no such file\nexit");
  // The unfinished line counts against the line bound.
  t.append("ing\nlast words");
  CHECK(t.text() == "exiting\nlast words");
}

TEST_CASE("a line longer than the byte bound keeps its end, cut at a character boundary") {
  LogTail t(10, 16);
  // 117 bytes: keeping the last 16 would start inside the 2-byte character, so the cut moves past it.
  t.append(std::string(100, 'a') + "\xC3\xA9" + "0123456789tail!" + "\n");
  CHECK(t.text() == "0123456789tail!");
  CHECK_NOTHROW((void)nlohmann::json(t.text()).dump());
  // An endless line (no newline ever) stays bounded in memory and in text.
  LogTail endless(10, 32);
  for (int i = 0; i < 1000; ++i) endless.append("0123456789");
  CHECK(endless.text().size() <= 32);
  CHECK(endless.text().ends_with("0123456789"));
}

TEST_CASE("a UTF-8 character split across writes survives; broken bytes become '?'") {
  LogTail t;
  t.append("caf\xC3");
  t.append("\xA9 \xE2\x9C");
  t.append("\x93 done\n");
  CHECK(t.text() == "caf\xC3\xA9 \xE2\x9C\x93 done");
  LogTail bad;
  bad.append("a\xFF\xC3(b\xED\xA0\x80z\xC0\xAF\n");  // invalid byte, truncated, surrogate, overlong
  const std::string s = bad.text();
  CHECK(s ==
        "a?"
        "?(b?"
        "?"
        "?z?"
        "?");  // split: "??(" would read as a trigraph
  CHECK_NOTHROW((void)nlohmann::json(s).dump());
}

TEST_CASE("control characters are stripped, tabs become spaces, CRLF reads as a newline") {
  LogTail t;
  t.append("\x1b[31mred\x1b[0m\tvalue\r\nnul\x00here\x7f\xC2\x85\n"s);
  CHECK(t.text() == "red value\nnulhere");
  // A lone ESC (no sequence) goes alone.
  CHECK(sanitize_message("a\x1b"
                         "]b\x1b"
                         "c",
                         64) == "a]bc");
}

TEST_CASE("sanitize_message bounds, trims and marks the cut") {
  CHECK(sanitize_message("  hello \n", 100) == "hello");
  CHECK(sanitize_message("abcdefghij", 8) == "abcde...");
  CHECK(sanitize_message("abcdefghij", 8, true) == "...fghij");
  CHECK(sanitize_message("abcdefghij", 2) == "ab");
  // Never splits a character: 4 x 2-byte characters cut to 7 bytes keeps 2 characters and the marker.
  CHECK(sanitize_message("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 7) == "\xC3\xA9\xC3\xA9...");
  CHECK(sanitize_message("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 6, true) == "...\xC3\xA9");
  CHECK(sanitize_message("\x01\x02\x03", 10).empty());
  const std::string json_breaker = "\"}\\\x00\x1f\xff"s;
  CHECK_NOTHROW((void)nlohmann::json(sanitize_message(json_breaker, 64)).dump());
}
