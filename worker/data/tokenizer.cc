#include "worker/data/tokenizer.h"

#include "common/error.h"
#include "worker/data/gpt2_pretokenizer.h"

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
    // A well-formed multi-byte character stays; utf8_char_at (the GPT-2 pre-tokenizer's decoder) reports an invalid
    // or truncated sequence as one byte.
    if (const Utf8Char ch = c >= 0x80 ? utf8_char_at(bytes, i) : Utf8Char{}; ch.length > 1) {
      out.append(bytes.substr(i, ch.length));
      i += ch.length - 1;
      continue;
    }
    out += "\\x";
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace railyard::worker
