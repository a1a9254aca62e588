#include "cli/text_codec.h"

#include "cli/cli.h"
#include "worker/data/gpt2_bpe.h"
#include "worker/data/tokenizer.h"

namespace railyard::cli {

namespace {

class ByteCodec : public TextCodec {
 public:
  std::vector<int32_t> encode(std::string_view text) override {
    std::vector<int32_t> out;
    for (unsigned char b : text) out.push_back(b);
    return out;
  }
  std::vector<int32_t> start_tokens() override { return {'\n'}; }
  std::string display(const std::vector<int32_t>& tokens) override {
    std::string bytes;
    for (int32_t t : tokens) {
      if (t < worker::kByteVocabSize) {
        bytes += static_cast<char>(t);
      } else {  // a model with a larger vocabulary than the bytes it was trained on
        bytes += "<|" + std::to_string(t) + "|>";
      }
    }
    return worker::escape_for_terminal(bytes);
  }
};

class Gpt2Codec : public TextCodec {
 public:
  explicit Gpt2Codec(const std::string& dir) : vocab_(worker::Gpt2Vocab::load(dir)), tok_(vocab_) {}
  std::vector<int32_t> encode(std::string_view text) override {
    const std::vector<uint16_t> t = tok_.encode(text);
    return std::vector<int32_t>(t.begin(), t.end());
  }
  std::vector<int32_t> start_tokens() override { return {worker::kGpt2EndOfText}; }
  std::string display(const std::vector<int32_t>& tokens) override {
    std::string out;
    std::vector<int32_t> run;  // ordinary tokens between special ones, decoded together (a character may span tokens)
    auto flush = [&] {
      out += worker::escape_for_terminal(tok_.decode(run.data(), run.size()));
      run.clear();
    };
    for (int32_t t : tokens) {
      if (t == worker::kGpt2EndOfText) {
        flush();
        out += "<|endoftext|>";
      } else {
        run.push_back(t);
      }
    }
    flush();
    return out;
  }

 private:
  worker::Gpt2Vocab vocab_;
  worker::Gpt2Tokenizer tok_;
};

}  // namespace

std::unique_ptr<TextCodec> make_text_codec(const std::string& name, int vocab_size, const std::string& vocab_dir) {
  std::string pick = name;
  if (pick == "auto") {
    if (vocab_size == worker::kByteVocabSize) {
      pick = "bytes";
    } else if (vocab_size == worker::kGpt2VocabSize) {
      pick = "gpt2";
    } else {
      throw UsageError{"--tokenizer auto: the model's vocabulary of " + std::to_string(vocab_size) +
                       " is neither bytes (256) nor GPT-2's (50257): give --tokenizer bytes or gpt2"};
    }
  }
  if (pick == "bytes") return std::make_unique<ByteCodec>();
  if (pick == "gpt2") {
    if (vocab_size < worker::kGpt2VocabSize) {
      throw UsageError{"--tokenizer gpt2: the model's vocabulary of " + std::to_string(vocab_size) +
                       " is smaller than GPT-2's 50257"};
    }
    return std::make_unique<Gpt2Codec>(vocab_dir.empty() ? worker::default_gpt2_vocab_dir() : vocab_dir);
  }
  throw UsageError{"--tokenizer '" + name + "' is not one of auto, bytes, gpt2"};
}

}  // namespace railyard::cli
