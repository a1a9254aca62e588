// The byte-level tokenizer: token = byte value (vocab 256), no merges, no special tokens. Every byte string
// round-trips exactly, which makes it the default for `railyard data prepare` and for tests. Shards made by other
// tokenizers (e.g. llm.c's GPT-2 BPE) load just the same; only decoding for display needs this tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace railyard::worker {

inline constexpr int kByteVocabSize = 256;

std::vector<uint16_t> byte_encode(std::string_view text);

// Exact inverse of byte_encode. Throws railyard::ConfigError naming the index of a token >= 256.
std::string byte_decode(const uint16_t* tokens, size_t n);
std::string byte_decode(const int32_t* tokens, size_t n);

// For showing decoded text on a terminal or in a log: keeps printable ASCII, newline, tab and well-formed UTF-8
// sequences, and escapes every other byte as \xNN (control bytes, which could move the cursor or ring the bell, and
// bytes that are not valid UTF-8, such as an untrained model's samples), so the result is always valid UTF-8 (and
// fits in JSON).
std::string escape_for_terminal(std::string_view bytes);

}  // namespace railyard::worker
