#include "worker/data/gpt2_pretokenizer.h"

#include <algorithm>
#include <array>
#include <vector>

namespace railyard::worker {

namespace {

struct ClassRange {
  char32_t first;
  char32_t last;
  CharClass cls;
};

constexpr CharClass kLetter = CharClass::kLetter;
constexpr CharClass kNumber = CharClass::kNumber;
constexpr CharClass kSpace = CharClass::kSpace;

// clang-format off
constexpr ClassRange kRanges[] = {
#include "worker/data/unicode_classes.inc"
};
// clang-format on

// The Basic Multilingual Plane as a flat table (64 KiB, built once): nearly all text is there, and a load is
// cheaper than a binary search over the ranges. Code points above it take the search.
class BmpClasses {
 public:
  BmpClasses() : table_(0x10000, CharClass::kOther) {
    for (const auto& r : kRanges) {
      if (r.first > 0xFFFF) break;
      for (char32_t c = r.first; c <= std::min<char32_t>(r.last, 0xFFFF); ++c) table_[c] = r.cls;
    }
  }
  CharClass operator[](char32_t c) const { return table_[c]; }

 private:
  std::vector<CharClass> table_;
};

const BmpClasses& bmp_classes() {
  static const BmpClasses table;
  return table;
}

// ASCII is most of most text: its classes as a constant (checked against the generated table by the tests), so the
// common case needs neither a lookup nor a guarded static.
constexpr std::array<CharClass, 128> kAsciiClasses = [] {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      t[c] = CharClass::kLetter;
    } else if (c >= '0' && c <= '9') {
      t[c] = CharClass::kNumber;
    } else if ((c >= '\t' && c <= '\r') || c == ' ') {
      t[c] = CharClass::kSpace;
    }
  }
  return t;
}();

Utf8Char decode_non_ascii(std::string_view text, size_t pos);

inline Utf8Char char_at(std::string_view text, size_t pos) {
  const auto b = static_cast<unsigned char>(text[pos]);
  if (b < 0x80) return {b, 1, kAsciiClasses[b]};
  return decode_non_ascii(text, pos);
}

}  // namespace

CharClass unicode_class(char32_t c) {
  if (c <= 0xFFFF) return bmp_classes()[c];
  const auto* end = std::end(kRanges);
  const auto* it =
      std::upper_bound(std::begin(kRanges), end, c, [](char32_t v, const ClassRange& r) { return v < r.first; });
  if (it == std::begin(kRanges)) return CharClass::kOther;
  --it;
  return c <= it->last ? it->cls : CharClass::kOther;
}

Utf8Char utf8_char_at(std::string_view text, size_t pos) { return char_at(text, pos); }

namespace {

Utf8Char decode_non_ascii(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t left = text.size() - pos;
  const unsigned char b0 = s[0];
  const Utf8Char invalid{b0, 1, CharClass::kOther};
  size_t len = 0;
  char32_t code = 0;
  char32_t min = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, code = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, code = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, code = b0 & 0x07, min = 0x10000;
  } else {
    return invalid;  // a continuation byte, an overlong lead (C0, C1) or beyond U+10FFFF (F5..FF)
  }
  if (left < len) return invalid;
  for (size_t i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return invalid;
    code = (code << 6) | (s[i] & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not scalar values.
  if (code < min || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return invalid;
  return {code, static_cast<uint8_t>(len), unicode_class(code)};
}

}  // namespace

size_t Gpt2PreTokenizer::piece_end(std::string_view text, size_t pos) {
  const size_t n = text.size();
  // 's 't 're 've 'm 'll 'd (lower case only, as in GPT-2): tried first at every position.
  if (text[pos] == '\'' && pos + 1 < n) {
    const char a = text[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (pos + 2 < n) {
      const char b = text[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
    }
  }
  const Utf8Char first = char_at(text, pos);
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional U+0020 and a run of one class. A space followed by a
  // non-space starts the run of the next character's class.
  CharClass run = first.cls;
  size_t end = pos + first.length;
  if (first.code == U' ' && end < n) {
    const Utf8Char next = char_at(text, end);
    if (next.cls != CharClass::kSpace) {
      run = next.cls;
      end += next.length;
    }
  }
  if (run != CharClass::kSpace) {
    while (end < n) {
      const Utf8Char c = char_at(text, end);
      if (c.cls != run) break;
      end += c.length;
    }
    return end;
  }
  // `\s+(?!\S)|\s+`: the white-space run, less its last character when a non-space follows and the run has more
  // than one, so that the last space can join the next word.
  size_t last = pos;
  while (end < n) {
    const Utf8Char c = char_at(text, end);
    if (c.cls != CharClass::kSpace) return last > pos ? last : end;
    last = end;
    end += c.length;
  }
  return end;
}

}  // namespace railyard::worker
