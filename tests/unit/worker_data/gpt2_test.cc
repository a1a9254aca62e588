// GPT-2 BPE (worker/data/gpt2_bpe.h): token-for-token equality with the JavaScript encoder of the npm package
// gpt-3-encoder (an independent implementation, run under node) on a few MB of generated text, hand-checked pieces
// and tokens, decode(encode(x)) == x for any bytes, streaming == whole, and `railyard data prepare --tokenizer gpt2`
// end to end.
//
// Needs the vocabulary that scripts/fetch_gpt2_vocab.sh puts in $RAILYARD_GPT2_DIR or ~/.cache/railyard/gpt2 (the
// test command fetches it). Without it the binary exits 77 (a CTest skip) and says so, unless
// RAILYARD_REQUIRE_GPT2_VOCAB=1 (set by scripts/test.sh, i.e. in CI), where a missing vocabulary fails.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_data/test_util.h"
#include "worker/data/gpt2_bpe.h"
#include "worker/data/gpt2_pretokenizer.h"
#include "worker/data/prepare.h"
#include "worker/data/shard.h"

namespace fs = std::filesystem;
using namespace railyard;
using namespace railyard::worker;
using railyard::test::run_command;
using railyard::test::TempDir;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The vocabulary directory, after making sure the files are there (skip or fail as the header says).
const std::string& vocab_dir() {
  static const std::string dir = [] {
    const std::string d = default_gpt2_vocab_dir();
    std::string missing;
    for (const char* f : {"encoder.json", "vocab.bpe", "Encoder.js"}) {
      if (!fs::exists(fs::path(d) / f)) missing += std::string(missing.empty() ? "" : ", ") + f;
    }
    if (!missing.empty()) {
      const char* req = std::getenv("RAILYARD_REQUIRE_GPT2_VOCAB");
      const std::string why = "worker_data_gpt2_tests: the GPT-2 vocabulary is not in " + d + " (missing " + missing +
                              "): run scripts/fetch_gpt2_vocab.sh";
      if (req != nullptr && std::string(req) != "" && std::string(req) != "0") {
        const std::string failure = why + " (RAILYARD_REQUIRE_GPT2_VOCAB is set, so this is a failure, not a skip)";
        FAIL(failure);
      }
      std::fprintf(stderr, "%s: SKIPPED\n", why.c_str());
      std::exit(77);
    }
    return d;
  }();
  return dir;
}

const Gpt2Vocab& vocab() {
  static const Gpt2Vocab v = Gpt2Vocab::load(vocab_dir());
  return v;
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  Gpt2PreTokenizer::split(text, true, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

void append_utf8(std::string& s, char32_t c) {
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Documents of varied text: English words with case and contractions ('s 't 're 've 'm 'll 'd, upper case too),
// digits, punctuation, runs of spaces, tabs, newlines and CRLF, accented Latin (precomposed and combining), Greek,
// Cyrillic, CJK, kana, Hangul, Arabic, Devanagari, emoji (with ZWJ and variation selectors), other Unicode spaces,
// numbers of other scripts, and long runs. Code points come from long-assigned blocks only, so an older node's
// Unicode database classifies them alike. U+0085 and U+FEFF, where JavaScript's \s and tiktoken's differ, are
// left out (checked by hand below).
class TextGenerator {
 public:
  explicit TextGenerator(uint64_t seed) : rng_(seed) {}

  std::string document(size_t approx_bytes) {
    std::string s;
    while (s.size() < approx_bytes) add_item(s);
    return s;
  }

 private:
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  char32_t in(char32_t lo, char32_t hi) { return std::uniform_int_distribution<char32_t>(lo, hi)(rng_); }

  void add_item(std::string& s) {
    static const std::vector<std::string> kWords = {"the",
                                                    "of",
                                                    "and",
                                                    "to",
                                                    "in",
                                                    "is",
                                                    "that",
                                                    "it",
                                                    "was",
                                                    "for",
                                                    "on",
                                                    "are",
                                                    "with",
                                                    "as",
                                                    "I",
                                                    "his",
                                                    "they",
                                                    "be",
                                                    "at",
                                                    "one",
                                                    "have",
                                                    "this",
                                                    "from",
                                                    "or",
                                                    "had",
                                                    "by",
                                                    "word",
                                                    "but",
                                                    "what",
                                                    "some",
                                                    "we",
                                                    "can",
                                                    "out",
                                                    "other",
                                                    "were",
                                                    "all",
                                                    "there",
                                                    "when",
                                                    "up",
                                                    "use",
                                                    "your",
                                                    "how",
                                                    "said",
                                                    "an",
                                                    "each",
                                                    "tokenizer",
                                                    "Kubernetes",
                                                    "gradient",
                                                    "Railyard",
                                                    "llm",
                                                    "GPT",
                                                    "BPE",
                                                    "hello",
                                                    "World",
                                                    "HTTP",
                                                    "JSON",
                                                    "encyclopaedia",
                                                    "antidisestablishmentarianism",
                                                    "pneumonoultramicroscopicsilicovolcanoconiosis",
                                                    "x",
                                                    "a"};
    static const std::vector<std::string> kContractions = {"'s", "'t",  "'re", "'ve", "'m",  "'ll", "'d", "'S",
                                                           "'T", "'RE", "'VE", "'M",  "'LL", "'D",  "'",  "'x"};
    static const std::vector<std::string> kPunct = {".", ",", "!", "?",  "...", ";", ":", "--", "-", "(", ")",  "[",
                                                    "]", "{", "}", "\"", "'",   "`", "#", "$",  "%", "&", "*",  "+",
                                                    "=", "<", ">", "/",  "\\",  "|", "~", "^",  "_", "@", "!?", "?!"};
    static const std::vector<std::string> kSpaces = {" ",    " ",    " ",        " ",       "  ",  "   ",
                                                     "\t",   "\n",   "\n\n",     "\r\n",    " \n", "\n ",
                                                     "\t\t", " \t ", "        ", "\n\n\n  "};
    const size_t kind = pick(100);
    if (kind < 40) {
      std::string w = kWords[pick(kWords.size())];
      if (pick(5) == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      if (pick(15) == 0) {
        for (char& c : w) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      }
      s += w;
    } else if (kind < 50) {
      s += kContractions[pick(kContractions.size())];
    } else if (kind < 58) {
      const size_t digits = 1 + pick(pick(4) == 0 ? 12 : 4);
      for (size_t i = 0; i < digits; ++i) s += static_cast<char>('0' + pick(10));
      if (pick(4) == 0) s += pick(2) ? "." : ",";
    } else if (kind < 68) {
      s += kPunct[pick(kPunct.size())];
    } else if (kind < 85) {
      s += kSpaces[pick(kSpaces.size())];
    } else if (kind < 98) {
      add_unicode(s);
    } else {
      add_long_run(s);
    }
  }

  void add_unicode(std::string& s) {
    const size_t n = 1 + pick(6);
    switch (pick(16)) {
      case 0:  // accented Latin, precomposed
        for (size_t i = 0; i < n; ++i) append_utf8(s, in(0xC0, 0x17F));
        break;
      case 1:  // Latin letters with combining marks (Mn: neither letter nor number)
        for (size_t i = 0; i < n; ++i) {
          append_utf8(s, in('a', 'z'));
          if (pick(2) == 0) append_utf8(s, in(0x300, 0x36F));
        }
        break;
      case 2:  // Greek
        for (size_t i = 0; i < n; ++i) append_utf8(s, in(0x3B1, 0x3C9));
        break;
      case 3:  // Cyrillic
        for (size_t i = 0; i < n; ++i) append_utf8(s, in(0x410, 0x44F));
        break;
      case 4:  // CJK ideographs
        for (size_t i = 0; i < n; ++i) append_utf8(s, in(0x4E00, 0x9FA5));
        break;
      case 5:  // hiragana, katakana, CJK punctuation
        for (size_t i = 0; i < n; ++i) append_utf8(s, pick(4) == 0 ? in(0x3001, 0x3003) : in(0x3041, 0x30FA));
        break;
      case 6:  // Hangul syllables
        for (size_t i = 0; i < n; ++i) append_utf8(s, in(0xAC00, 0xD7A3));
        break;
      case 7:  // Arabic letters and Arabic-Indic digits
        for (size_t i = 0; i < n; ++i) append_utf8(s, pick(3) == 0 ? in(0x660, 0x669) : in(0x628, 0x64A));
        break;
      case 8:  // Devanagari: letters with vowel signs (Mc/Mn) and digits
        for (size_t i = 0; i < n; ++i) append_utf8(s, pick(3) == 0 ? in(0x93E, 0x94C) : in(0x915, 0x939));
        if (pick(3) == 0) append_utf8(s, in(0x966, 0x96F));
        break;
      case 9:  // emoji, sometimes joined (ZWJ) or with a variation selector
        for (size_t i = 0; i < n; ++i) {
          append_utf8(s, pick(2) ? in(0x1F600, 0x1F64F) : in(0x1F300, 0x1F5FF));
          if (pick(4) == 0) append_utf8(s, pick(2) ? 0x200D : 0xFE0F);
        }
        break;
      case 10: {  // other spaces: NBSP, ideographic, em, thin, line separator; and zero-width space (not \s)
        static const char32_t kUnicodeSpaces[] = {0xA0, 0x3000, 0x2003, 0x2009, 0x2028, 0x202F, 0x200B, 0x1680};
        for (size_t i = 0; i < n; ++i) append_utf8(s, kUnicodeSpaces[pick(std::size(kUnicodeSpaces))]);
        break;
      }
      case 11: {  // numbers that are not ASCII digits: fullwidth (Nd), superscripts and fractions (No), roman (Nl)
        static const char32_t kNumbers[] = {0xFF10, 0xFF15, 0xB2, 0xB3, 0xB9, 0xBD, 0xBC, 0x2160, 0x216B, 0x2460};
        for (size_t i = 0; i < n; ++i) append_utf8(s, kNumbers[pick(std::size(kNumbers))]);
        break;
      }
      case 12:  // symbols and punctuation: arrows, math, currency, dashes, quotes
        for (size_t i = 0; i < n; ++i) {
          static const char32_t kSymbols[] = {0x2190, 0x2192, 0x221E, 0x2211, 0x20AC, 0xA3, 0x2014, 0x201C,
                                              0x201D, 0x2018, 0x2019, 0xB7,   0xA7,   0xA9, 0x2026, 0xBF};
          append_utf8(s, kSymbols[pick(std::size(kSymbols))]);
        }
        break;
      case 13:  // letters outside the BMP (mathematical alphanumerics: letters and digits)
        for (size_t i = 0; i < n; ++i) append_utf8(s, pick(3) == 0 ? in(0x1D7CE, 0x1D7FF) : in(0x1D400, 0x1D433));
        break;
      case 14:  // fullwidth Latin, Thai
        for (size_t i = 0; i < n; ++i) append_utf8(s, pick(2) ? in(0xFF21, 0xFF3A) : in(0xE01, 0xE2E));
        break;
      default:  // a word with an accent inside, as real text has it
        s += pick(2) ? "caf\xC3\xA9" : "na\xC3\xAFve";
        break;
    }
  }

  void add_long_run(std::string& s) {
    const size_t n = 20 + pick(180);
    switch (pick(5)) {
      case 0:
        s.append(n, ' ');
        break;
      case 1:
        s.append(n, 'a' + static_cast<char>(pick(26)));
        break;
      case 2:
        for (size_t i = 0; i < n; ++i) s += static_cast<char>('0' + pick(10));
        break;
      case 3:
        s.append(n / 4, '\n');
        break;
      default:
        for (size_t i = 0; i < n / 3; ++i) append_utf8(s, 0x4E00 + static_cast<char32_t>(pick(3)));
        break;
    }
  }

  std::mt19937_64 rng_;
};

// Runs the npm package's encode() under node on every document; returns one token list per document.
std::vector<std::vector<uint16_t>> js_encode(const TempDir& dir, const std::vector<std::string>& docs,
                                             double* seconds) {
  const std::string in = dir.file("docs.json"), out = dir.file("tokens.json"), script = dir.file("encode.js");
  const std::string docs_json = nlohmann::json(docs).dump();
  test::write_bytes(in, docs_json.data(), docs_json.size());
  // Times encode() alone (not node's start-up or the JSON), for the throughput comparison.
  const std::string js =
      "const fs = require('fs');\n"
      "const {encode} = require(" +
      nlohmann::json((fs::path(vocab_dir()) / "Encoder.js").string()).dump() +
      ");\n"
      "const docs = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));\n"
      "const t0 = process.hrtime.bigint();\n"
      "const out = docs.map(d => encode(d));\n"
      "const t1 = process.hrtime.bigint();\n"
      "fs.writeFileSync(process.argv[3], JSON.stringify(out));\n"
      "console.log('seconds ' + Number(t1 - t0) / 1e9);\n";
  test::write_bytes(script, js.data(), js.size());
  const auto r = run_command("node " + script + " " + in + " " + out);
  REQUIRE_MESSAGE(r.code == 0, "node failed: " << r.output);
  if (seconds != nullptr) *seconds = std::stod(r.output.substr(r.output.find("seconds ") + 8));
  return nlohmann::json::parse(test::slurp(out)).get<std::vector<std::vector<uint16_t>>>();
}

// The first piece where two token lists of one document part ways, for the failure message.
std::string first_difference(const Gpt2Tokenizer& tok, const std::vector<uint16_t>& ours,
                             const std::vector<uint16_t>& theirs) {
  size_t i = 0;
  while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i]) ++i;
  const size_t from = i >= 3 ? i - 3 : 0;
  auto show = [&](const std::vector<uint16_t>& t) {
    std::string s;
    for (size_t k = from; k < std::min(t.size(), i + 4); ++k) s += std::to_string(t[k]) + " ";
    const size_t end = std::min(t.size(), i + 4);
    return s + nlohmann::json(tok.decode(t.data() + from, end - from))
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  return "token " + std::to_string(i) + ": ours " + show(ours) + " | js " + show(theirs);
}

}  // namespace

TEST_CASE("GPT-2 pre-tokenizer: the regex's pieces, checked by hand") {
  using V = std::vector<std::string>;
  CHECK(pieces("I'm  here\t\n you'RE 123abc") == V{"I", "'m", " ", " here", "\t\n", " you", "'", "RE", " 123", "abc"});
  CHECK(pieces("Hello, world!") == V{"Hello", ",", " world", "!"});
  CHECK(pieces("they'll've'd 's") == V{"they", "'ll", "'ve", "'d", " '", "s"});
  CHECK(pieces("a   \nb") == V{"a", "   ", "\n", "b"});
  CHECK(pieces("x  ") == V{"x", "  "});
  CHECK(pieces(" ") == V{" "});
  CHECK(pieces("3.14 km²") == V{"3", ".", "14", " km", "\xC2\xB2"});  // ² is a number (No), not a letter
  CHECK(pieces("caf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC!") == V{"caf\xC3\xA9", " \xE6\x9D\xB1\xE4\xBA\xAC", "!"});
  // e + U+0301 (combining acute: a mark, so punctuation-like) splits the word.
  CHECK(pieces("e\xCC\x81t\xC3\xA9") == V{"e", "\xCC\x81", "t\xC3\xA9"});
  // U+0085 is White_Space (tiktoken's \s; JavaScript's \s lacks it): " " and U+0085 are one run, less its last.
  CHECK(pieces("x \xC2\x85y") == V{"x", " ", "\xC2\x85", "y"});
  // Invalid UTF-8: each bad byte is one punctuation-like character.
  CHECK(pieces("ab\xFF\xFE"
               "cd \xC3") == V{"ab", "\xFF\xFE", "cd", " \xC3"});
  CHECK(pieces("\xED\xA0\x80z") == V{"\xED\xA0\x80", "z"});  // an encoded surrogate is invalid
  CHECK(pieces("\xC0\xAFz") == V{"\xC0\xAF", "z"});          // so is an overlong '/'
  CHECK(unicode_class(U'a') == CharClass::kLetter);
  CHECK(unicode_class(0x4E00) == CharClass::kLetter);
  CHECK(unicode_class(0x1D7CE) == CharClass::kNumber);
  CHECK(unicode_class(0x3000) == CharClass::kSpace);
  CHECK(unicode_class(0xFEFF) == CharClass::kOther);
  CHECK(unicode_class(0x1F600) == CharClass::kOther);
  // The scanner's ASCII shortcut agrees with the generated table.
  for (int c = 0; c < 0x80; ++c) {
    CAPTURE(c);
    CHECK(utf8_char_at(std::string(1, static_cast<char>(c)), 0).cls == unicode_class(static_cast<char32_t>(c)));
  }
}

TEST_CASE("GPT-2 tokens checked by hand, and the vocabulary's shape") {
  Gpt2Tokenizer tok(vocab());
  CHECK(vocab().num_merges() == 50000);
  CHECK(tok.encode("Hello world") == std::vector<uint16_t>{15496, 995});
  CHECK(tok.encode("hello world") == std::vector<uint16_t>{31373, 995});
  CHECK(tok.encode(" the") == std::vector<uint16_t>{262});
  // Special tokens are ordinary text (as tiktoken's encode_ordinary).
  CHECK(tok.encode("<|endoftext|>").size() > 1);
  const uint16_t eot = kGpt2EndOfText;
  CHECK(tok.decode(&eot, 1) == "<|endoftext|>");
  const std::vector<int32_t> bad = {15496, 50257};
  CHECK_THROWS_WITH_AS(tok.decode(bad.data(), bad.size()), doctest::Contains("token 50257 at index 1"), ConfigError);
}

TEST_CASE("GPT-2 vocabulary: a missing file is named with the script that fetches it") {
  TempDir dir;
  try {
    Gpt2Vocab::load(dir.path().string());
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    CHECK(contains(e.what(), dir.file("encoder.json") + " is missing"));
    CHECK(contains(e.what(), "scripts/fetch_gpt2_vocab.sh"));
  }
  fs::copy_file(fs::path(vocab_dir()) / "encoder.json", dir.file("encoder.json"));
  CHECK_THROWS_WITH_AS(Gpt2Vocab::load(dir.path().string()), doctest::Contains("vocab.bpe is missing"), ConfigError);
}

TEST_CASE("GPT-2 decode(encode(x)) == x for any bytes, and streaming in parts equals encoding the whole") {
  Gpt2Tokenizer tok(vocab());
  std::mt19937_64 rng(7);
  TextGenerator gen(11);
  for (int round = 0; round < 200; ++round) {
    std::string text = gen.document(300);
    // Sprinkle raw bytes in: invalid UTF-8, cut sequences, NULs.
    for (int k = 0; k < 5; ++k) {
      text.insert(text.begin() + static_cast<std::ptrdiff_t>(rng() % (text.size() + 1)), static_cast<char>(rng()));
    }
    const std::vector<uint16_t> whole = tok.encode(text);
    for (uint16_t t : whole) REQUIRE(t < kGpt2VocabSize);
    REQUIRE(tok.decode(whole.data(), whole.size()) == text);

    // Feed it in random parts as prepare does (keeping what encode_prefix did not consume).
    std::vector<uint16_t> streamed;
    std::string carry;
    for (size_t pos = 0; pos < text.size();) {
      const size_t n = std::min<size_t>(1 + rng() % 40, text.size() - pos);
      carry.append(text, pos, n);
      pos += n;
      carry.erase(0, tok.encode_prefix(carry, false, streamed));
    }
    tok.encode_prefix(carry, true, streamed);
    REQUIRE(streamed == whole);
  }
  // Long runs take the same path as short ones (and stay fast: the merge is O(n log n)).
  const std::string spaces(200000, ' ');
  const auto t = tok.encode(spaces);
  CHECK(tok.decode(t.data(), t.size()) == spaces);
}

TEST_CASE("GPT-2 encoder equals gpt-3-encoder's JavaScript encoder token for token on a few MB of varied text") {
  Gpt2Tokenizer tok(vocab());
  TextGenerator gen(2024);
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < 3'000'000) {
    docs.push_back(gen.document(300 + docs.size() % 5 * 200));
    bytes += docs.back().size();
  }
  TempDir dir;
  double js_seconds = 0;
  const auto theirs = js_encode(dir, docs, &js_seconds);
  REQUIRE(theirs.size() == docs.size());

  std::vector<std::vector<uint16_t>> ours(docs.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < docs.size(); ++i) tok.encode(docs[i], ours[i]);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  size_t tokens = 0, differing = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    tokens += ours[i].size();
    if (ours[i] != theirs[i]) {
      if (++differing <= 5) {
        CAPTURE(i);
        FAIL_CHECK("document " << i << " differs at " << first_difference(tok, ours[i], theirs[i]));
      }
    }
  }
  CHECK(differing == 0);
  MESSAGE(docs.size() << " documents, " << bytes << " bytes, " << tokens << " tokens; encode: " << bytes / seconds / 1e6
                      << " MB/s here, " << bytes / js_seconds / 1e6 << " MB/s gpt-3-encoder under node");
}

TEST_CASE("prepare --tokenizer gpt2: documents led by <|endoftext|>, split by tokens, llm.c shards") {
  TempDir dir;
  const std::vector<std::string> inputs = {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/MPL-2.0"};
  PrepareOptions o;
  o.inputs = inputs;
  o.output_dir = dir.file("out");
  o.tokenizer = "gpt2";
  o.vocab_dir = vocab_dir();
  o.shard_tokens = 5000;
  const PrepareResult r = prepare_dataset(o);
  CHECK(r.vocab_size == kGpt2VocabSize);

  Gpt2Tokenizer tok(vocab());
  std::vector<uint16_t> expected;
  for (const auto& f : inputs) {
    expected.push_back(kGpt2EndOfText);
    tok.encode(test::slurp(f), expected);
  }
  CHECK(r.total_tokens == expected.size());
  CHECK(r.val_tokens == static_cast<uint64_t>(std::floor(expected.size() * 0.1)));
  CHECK(r.train_tokens + r.val_tokens == r.total_tokens);
  std::vector<uint16_t> got;
  for (const auto* list : {&r.train_shards, &r.val_shards}) {
    for (const auto& p : *list) {
      MappedShard s(p, kGpt2VocabSize);  // validates every token < 50257
      CHECK(s.num_tokens() <= 5000);
      got.insert(got.end(), s.tokens(), s.tokens() + s.num_tokens());
    }
  }
  CHECK(got == expected);
  CHECK(got.front() == kGpt2EndOfText);
  const auto m = nlohmann::json::parse(test::slurp(r.manifest));
  CHECK(m["tokenizer"] == "gpt2");
  CHECK(m["vocab_size"] == kGpt2VocabSize);
  CHECK(m["eot_token"] == kGpt2EndOfText);
  CHECK(m["inputs"][1]["tokens"].get<uint64_t>() + m["inputs"][0]["tokens"].get<uint64_t>() == expected.size());
}

TEST_CASE("railyard data prepare --tokenizer gpt2 end to end: shard header, vocabulary, first document") {
  const std::string bin = railyard::test::bin_path("railyard");
  TempDir dir;
  const std::string out = dir.file("data");
  const std::string input = "/usr/share/common-licenses/Apache-2.0";
  auto r = run_command(bin + " data prepare --tokenizer gpt2 --vocab-dir " + vocab_dir() + " --input " + input +
                       " --output " + out + " --val-fraction 0.2");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "tokenizer: gpt2 (vocab 50257)"));
  CHECK(contains(r.output, "led by <|endoftext|> (50256)"));
  CHECK(contains(r.output, "tokens [0, "));

  // The header as llm.c reads it: magic, version 1, the token count; the tokens after it all < 50257.
  const std::string shard = test::slurp(out + "/train_000000.bin");
  REQUIRE(shard.size() > 1024);
  int32_t header[3];
  std::memcpy(header, shard.data(), sizeof(header));
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(static_cast<size_t>(header[2]) * 2 + 1024 == shard.size());
  std::vector<uint16_t> tokens(static_cast<size_t>(header[2]));
  std::memcpy(tokens.data(), shard.data() + 1024, tokens.size() * 2);
  CHECK(tokens[0] == kGpt2EndOfText);
  for (uint16_t t : tokens) REQUIRE(t < kGpt2VocabSize);
  Gpt2Tokenizer tok(vocab());
  const std::string text = test::slurp(input);
  CHECK(tok.decode(tokens.data() + 1, tokens.size() - 1) ==
        text.substr(0, tok.decode(tokens.data() + 1, tokens.size() - 1).size()));
  const auto m = nlohmann::json::parse(test::slurp(out + "/prepare.json"));
  CHECK(m["vocab_size"] == 50257);

  r = run_command(bin + " data inspect " + out + "/val_000000.bin --vocab 50257");
  CHECK(r.code == 0);
  CHECK(contains(r.output, "magic:    20240520"));
}

TEST_CASE(
    "railyard generate with GPT-2's tokenizer: the prompt round-trips, the cache draws what the full forward does") {
  const std::string bin = railyard::test::ctest_env("RAILYARD_BIN_DIR");
  TempDir dir;
  const std::string data = dir.file("data");
  auto r = run_command(bin + "/railyard data prepare --tokenizer gpt2 --vocab-dir " + vocab_dir() +
                       " --input /usr/share/common-licenses/Apache-2.0 --output " + data);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  // A small model over GPT-2's vocabulary (50257, padded to 50304), two steps: enough to have a model file.
  r = run_command(bin + "/railyard-worker train --model l=1,c=32,nh=2,t=64,v=50257 --steps 2 --batch 2 --seq 16" +
                  " --threads 1 --data " + data + " --export " + dir.file("m.bin"));
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string gen = bin + "/railyard generate --model " + dir.file("m.bin") + " --vocab-dir " + vocab_dir() +
                          " --threads 1 --ids --tokens 12 --temperature 0.8 --top-k 50 --seed 3";
  // The prompt's text comes back through GPT-2's encode and decode (accents, a CJK character, an emoji, spaces).
  const std::string prompt = "Hello w\xc3\xb6rld \xe6\x97\xa5 \xf0\x9f\x98\x80  it's";
  // stdout only (run_command adds 2>&1 after the command): generate reports its timing on stderr.
  const auto cached = run_command("{ " + gen + " --prompt \"" + prompt + "\" 2>/dev/null; }");
  REQUIRE_MESSAGE(cached.code == 0, cached.output);
  CHECK(cached.output.rfind(prompt, 0) == 0);
  const auto full = run_command("{ " + gen + " --prompt \"" + prompt + "\" --no-cache 2>/dev/null; }");
  REQUIRE_MESSAGE(full.code == 0, full.output);
  const auto ids = [](const std::string& out) { return out.substr(out.find("ids:")); };
  CHECK(ids(cached.output) == ids(full.output));
  for (const std::string& id : {std::string("50257"), std::string("50300")})
    CHECK_FALSE(contains(ids(cached.output), " " + id));  // never a padded row
  // No prompt: <|endoftext|>, as llm.c's samples start.
  r = run_command("{ " + gen + " 2>/dev/null; }");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(r.output.rfind("<|endoftext|>", 0) == 0);
  // A missing vocabulary names the file and the script that fetches it.
  r = run_command(bin + "/railyard generate --model " + dir.file("m.bin") + " --vocab-dir " + dir.file("none"));
  CHECK(r.code == 1);
  CHECK(contains(r.output, "fetch_gpt2_vocab.sh"));
}
