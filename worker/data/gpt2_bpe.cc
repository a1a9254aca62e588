#include "worker/data/gpt2_bpe.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/error.h"
#include "common/pod_env.h"
#include "worker/data/gpt2_pretokenizer.h"

namespace railyard::worker {

namespace {

constexpr const char* kFetchHint = "scripts/fetch_gpt2_vocab.sh (in the Railyard repository)";

std::string read_vocab_file(const std::string& dir, const std::string& name) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError("GPT-2 vocabulary: " + path + " is missing: run " + kFetchHint + " " + dir +
                      " to fetch it, or pass --vocab-dir DIR where encoder.json and vocab.bpe are");
  }
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw ConfigError("GPT-2 vocabulary: cannot read " + path);
  return text;
}

// The inverse of GPT-2's bytes_to_unicode: the files spell byte b as itself when it is a printable Latin-1
// character ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) and the others, in byte order, as U+0100, U+0101, ...
class ByteAlphabet {
 public:
  ByteAlphabet() {
    std::fill(std::begin(byte_of_), std::end(byte_of_), -1);
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_of_[printable ? b : 256 + shifted++] = b;
    }
  }

  // The raw bytes a vocabulary string stands for; false when it holds a character outside the alphabet.
  bool to_bytes(std::string_view spelled, std::string& out) const {
    out.clear();
    for (size_t i = 0; i < spelled.size();) {
      const Utf8Char c = utf8_char_at(spelled, i);
      if (c.code >= std::size(byte_of_) || byte_of_[c.code] < 0 || (c.length == 1 && c.code >= 0x80)) return false;
      out.push_back(static_cast<char>(byte_of_[c.code]));
      i += c.length;
    }
    return true;
  }

 private:
  int byte_of_[256 + 68];  // 68 bytes are not printable
};

}  // namespace

std::string default_gpt2_vocab_dir() {
  if (const char* env = std::getenv(pod_env::kGpt2Dir); env != nullptr && *env != '\0') return env;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : ".") + "/.cache/railyard/gpt2";
}

Gpt2Vocab Gpt2Vocab::load(const std::string& dir) {
  // Read both before parsing either, so that a missing vocab.bpe is reported before time goes into the JSON.
  const std::string encoder_text = read_vocab_file(dir, "encoder.json");
  const std::string merges_text = read_vocab_file(dir, "vocab.bpe");
  const std::string encoder_path = (std::filesystem::path(dir) / "encoder.json").string();
  const std::string merges_path = (std::filesystem::path(dir) / "vocab.bpe").string();

  const ByteAlphabet alphabet;
  Gpt2Vocab v;
  v.bytes_.assign(kGpt2VocabSize, std::string());
  std::vector<bool> seen(kGpt2VocabSize, false);
  std::unordered_map<std::string, uint16_t> id_of;
  id_of.reserve(kGpt2VocabSize);
  nlohmann::json encoder;
  try {
    encoder = nlohmann::json::parse(encoder_text);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("GPT-2 vocabulary: " + encoder_path + " is not valid JSON: " + e.what());
  }
  if (!encoder.is_object() || encoder.size() != kGpt2VocabSize) {
    throw ConfigError("GPT-2 vocabulary: " + encoder_path + " must be an object of " + std::to_string(kGpt2VocabSize) +
                      " tokens");
  }
  std::string bytes;
  for (const auto& [spelled, value] : encoder.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kGpt2VocabSize ||
        seen[value.get<size_t>()]) {
      throw ConfigError("GPT-2 vocabulary: " + encoder_path + ": token " + nlohmann::json(spelled).dump() +
                        " has a bad or repeated id " + value.dump());
    }
    const auto id = value.get<uint16_t>();
    if (!alphabet.to_bytes(spelled, bytes)) {
      throw ConfigError("GPT-2 vocabulary: " + encoder_path + ": token " + std::to_string(id) +
                        " is not spelled in GPT-2's byte alphabet");
    }
    seen[id] = true;
    v.bytes_[id] = bytes;
    id_of.emplace(bytes, id);
  }
  if (v.bytes_[kGpt2EndOfText] != "<|endoftext|>") {
    throw ConfigError("GPT-2 vocabulary: " + encoder_path + ": token 50256 must be <|endoftext|>");
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(std::string(1, static_cast<char>(b)));
    if (it == id_of.end()) {
      throw ConfigError("GPT-2 vocabulary: " + encoder_path + " has no token for byte " + std::to_string(b));
    }
    v.byte_token_[b] = it->second;
  }

  // vocab.bpe: a "#version" line, then one merge "LEFT RIGHT" per line in rank order.
  size_t line_no = 0;
  size_t pos = 0;
  std::string left, right;
  while (pos < merges_text.size()) {
    size_t eol = merges_text.find('\n', pos);
    if (eol == std::string::npos) eol = merges_text.size();
    const std::string_view line(merges_text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    const auto bad = [&](const std::string& why) {
      return ConfigError("GPT-2 vocabulary: " + merges_path + " line " + std::to_string(line_no) + ": " + why);
    };
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos) {
      throw bad("expected two tokens separated by one space");
    }
    if (!alphabet.to_bytes(line.substr(0, sp), left) || !alphabet.to_bytes(line.substr(sp + 1), right)) {
      throw bad("not spelled in GPT-2's byte alphabet");
    }
    const auto l = id_of.find(left), r = id_of.find(right), m = id_of.find(left + right);
    if (l == id_of.end() || r == id_of.end() || m == id_of.end())
      throw bad("a token of this merge is not in encoder.json");
    const auto rank = static_cast<uint32_t>(v.merges_.size());
    if (!v.merges_.insert({MergeTable::key(l->second, r->second), rank, m->second})) {
      throw bad("repeats an earlier merge");
    }
  }
  if (v.merges_.size() == 0) throw ConfigError("GPT-2 vocabulary: " + merges_path + " holds no merges");
  return v;
}

void BpeMerger::encode_piece(std::string_view piece, std::vector<uint16_t>& out) {
  if (piece.size() == 1) {
    out.push_back(vocab_.byte_token(static_cast<unsigned char>(piece[0])));
    return;
  }
  if (piece.size() > PieceCache::kMaxPieceBytes) {
    merge(piece, out);
    return;
  }
  const uint64_t hash = PieceCache::hash(piece);
  if (cache_.find(piece, hash, out)) return;
  const size_t before = out.size();
  merge(piece, out);
  cache_.insert(piece, hash, out.data() + before, out.size() - before);
}

bool MergeTable::insert(const Entry& e) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Entry> old = std::move(slots_);
    const size_t n = old.empty() ? 1024 : old.size() * 2;
    slots_.assign(n, Entry{kEmpty, 0, 0});
    shift_ = 64 - std::countr_zero(n);
    for (const Entry& o : old) {
      if (o.key == kEmpty) continue;
      size_t i = slot(o.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & (n - 1);
      slots_[i] = o;
    }
  }
  size_t i = slot(e.key);
  for (; slots_[i].key != kEmpty; i = (i + 1) & (slots_.size() - 1)) {
    if (slots_[i].key == e.key) return false;
  }
  slots_[i] = e;
  ++size_;
  return true;
}

bool PieceCache::find(std::string_view piece, uint64_t hash, std::vector<uint16_t>& out) const {
  if (slots_.empty()) return false;
  const uint32_t tag = tag_of(hash);
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.tag == 0) return false;
    if (s.tag == tag && s.piece_length == piece.size() &&
        std::memcmp(pieces_.data() + s.piece_offset, piece.data(), piece.size()) == 0) {
      const uint16_t* t = tokens_.data() + s.tokens_offset;
      out.insert(out.end(), t, t + s.tokens_length);
      return true;
    }
  }
}

void PieceCache::insert(std::string_view piece, uint64_t hash, const uint16_t* tokens, size_t n) {
  if (piece.size() > kMaxPieceBytes || n > kMaxPieceTokens) return;
  if (size_ >= kMaxPieces) {
    slots_.clear();
    pieces_.clear();
    tokens_.clear();
    size_ = 0;
  }
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].tag != 0) i = (i + 1) & mask;
  slots_[i] = {tag_of(hash), static_cast<uint32_t>(pieces_.size()), static_cast<uint32_t>(tokens_.size()),
               static_cast<uint8_t>(piece.size()), static_cast<uint8_t>(n)};
  pieces_.append(piece);
  tokens_.insert(tokens_.end(), tokens, tokens + n);
  ++size_;
}

// Doubles the table. The slots keep only a tag, so entries are re-placed by hashing their pieces again.
void PieceCache::grow() {
  std::vector<Slot> old = std::move(slots_);
  const size_t n = old.empty() ? 4096 : old.size() * 2;
  slots_.assign(n, Slot{});
  for (const Slot& o : old) {
    if (o.tag == 0) continue;
    size_t i = hash(std::string_view(pieces_.data() + o.piece_offset, o.piece_length)) & (n - 1);
    while (slots_[i].tag != 0) i = (i + 1) & (n - 1);
    slots_[i] = o;
  }
}

void BpeMerger::merge(std::string_view piece, std::vector<uint16_t>& out) {
  const auto n = static_cast<int32_t>(piece.size());
  nodes_.resize(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    nodes_[i] = {vocab_.byte_token(static_cast<unsigned char>(piece[i])), i - 1, i + 1 < n ? i + 1 : -1};
  }
  heap_.clear();
  const auto consider = [&](int32_t left) {
    const int32_t right = nodes_[left].next;
    if (right < 0) return;
    if (const Gpt2Vocab::Merge* m = vocab_.merge(nodes_[left].token, nodes_[right].token)) {
      heap_.push_back({m->rank, left, nodes_[left].token, nodes_[right].token});
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    const Candidate c = heap_.back();
    heap_.pop_back();
    // A candidate is stale when either side has merged since it was queued; the tokens tell.
    Node& l = nodes_[c.left];
    if (l.prev == -2 || l.token != c.left_token || l.next < 0 || nodes_[l.next].token != c.right_token) continue;
    Node& r = nodes_[l.next];
    l.token = vocab_.merge(c.left_token, c.right_token)->token;
    l.next = r.next;
    if (r.next >= 0) nodes_[r.next].prev = c.left;
    r.prev = -2;
    if (l.prev >= 0) consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = nodes_[i].next) out.push_back(nodes_[i].token);
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<uint16_t>& out) { encode_prefix(text, true, out); }

std::vector<uint16_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<uint16_t> out;
  out.reserve(text.size() / 3);
  encode(text, out);
  return out;
}

size_t Gpt2Tokenizer::encode_prefix(std::string_view text, bool final, std::vector<uint16_t>& out) {
  return Gpt2PreTokenizer::split(text, final, [&](std::string_view piece) { merger_.encode_piece(piece, out); });
}

namespace {
template <typename Tok>
std::string decode_tokens(const Gpt2Vocab& vocab, const Tok* tokens, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= kGpt2VocabSize) {
      throw ConfigError("GPT-2 tokenizer: token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                        " is not in the vocabulary (vocab 50257)");
    }
    out += vocab.bytes(static_cast<uint16_t>(tokens[i]));
  }
  return out;
}
}  // namespace

std::string Gpt2Tokenizer::decode(const uint16_t* tokens, size_t n) const { return decode_tokens(vocab_, tokens, n); }
std::string Gpt2Tokenizer::decode(const int32_t* tokens, size_t n) const { return decode_tokens(vocab_, tokens, n); }

}  // namespace railyard::worker
