#include "worker/data/tokenizer.h"

#include "common/error.h"

namespace railyard::worker {

std::vector<uint16_t> byte_encode(std::string_view text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

namespace {
template <typename Tok>
std::string decode(const Tok* tokens, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= kByteVocabSize) {
      throw ConfigError("byte tokenizer: token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                        " is not a byte (vocab 256): these tokens come from another tokenizer");
    }
    out[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return out;
}
}  // namespace

std::string byte_decode(const uint16_t* tokens, size_t n) { return decode(tokens, n); }
std::string byte_decode(const int32_t* tokens, size_t n) { return decode(tokens, n); }

namespace {

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF), or 0 when the byte there does not start one.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (i + n > s.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (at(i + k) < 0x80 || at(i + k) > 0xbf) return 0;
  return n;
}

}  // namespace

std::string escape_for_terminal(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f)) {
      out.push_back(bytes[i]);
      continue;
    }
    if (const size_t n = c >= 0x80 ? utf8_sequence(bytes, i) : 0; n > 0) {
      out.append(bytes.substr(i, n));
      i += n - 1;
      continue;
    }
    out += "\\x";
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace railyard::worker
