// GPT-2's pre-tokenizer: splits UTF-8 text into the pieces that byte-level BPE then encodes one by one. It is the
// regular expression of GPT-2 (and of tiktoken's r50k_base, which llm.c's data scripts use)
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written as a direct scanner: each alternative only ever needs one code point of lookahead, so a regex engine
// would add a dependency and time and nothing else.
//
// Classes: \p{L} and \p{N} are the Unicode general categories, \s is the White_Space property (as in tiktoken;
// JavaScript's \s differs in two code points: it has U+FEFF and lacks U+0085). The table is generated from node's
// Unicode database by scripts/gen_unicode_classes.js, so the build needs no ICU.
//
// Invalid UTF-8: each byte that does not start a complete, shortest-form sequence of a scalar value is one
// "character" of its own, neither letter, number nor space (like punctuation), and goes to byte-level BPE as that
// byte. Any byte string is therefore encoded, and decode(encode(x)) == x holds for every x.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace railyard::worker {

enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };

// The class of a Unicode scalar value (kOther for anything outside 0..0x10FFFF).
CharClass unicode_class(char32_t c);

// One decoded character of the input: its code point (or the invalid byte), length in bytes and class.
struct Utf8Char {
  char32_t code = 0;
  uint8_t length = 1;
  CharClass cls = CharClass::kOther;
};

// Decodes the character at text[pos] (pos < text.size()); an invalid or truncated sequence yields one byte of kOther.
Utf8Char utf8_char_at(std::string_view text, size_t pos);

class Gpt2PreTokenizer {
 public:
  // The end of the piece that starts at pos (pos < text.size()), as if the text ended at text.size().
  static size_t piece_end(std::string_view text, size_t pos);

  // Calls emit(std::string_view piece) for each piece of text, in order. With final=false the text is a prefix of a
  // longer stream: it stops before the first piece whose extent more text could change (it ends within two code
  // points of the end) and returns where that piece starts, i.e. how many bytes were consumed; the caller keeps the
  // rest and calls again with more text appended. With final=true it consumes everything.
  template <typename Emit>
  static size_t split(std::string_view text, bool final, Emit&& emit) {
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t end = piece_end(text, pos);
      if (!final && end + kLookaheadBytes > text.size()) return pos;
      emit(text.substr(pos, end - pos));
      pos = end;
    }
    return pos;
  }

 private:
  // A piece's end is decided by at most the two code points after it (4 bytes each).
  static constexpr size_t kLookaheadBytes = 8;
};

}  // namespace railyard::worker
