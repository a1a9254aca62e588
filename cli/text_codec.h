// Text in and out of a model for `railyard generate`: the tokenizer the training data used, picked from the model's
// vocabulary (256: bytes, 50257: GPT-2's BPE) or named by --tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace railyard::cli {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(std::string_view text) = 0;
  // Where generation starts without a prompt: GPT-2's <|endoftext|> (llm.c's samples start there), a newline for
  // bytes.
  virtual std::vector<int32_t> start_tokens() = 0;
  // The tokens as text for a terminal: control bytes other than newline and tab escaped, special tokens named.
  virtual std::string display(const std::vector<int32_t>& tokens) = 0;
};

// name: "auto", "bytes" or "gpt2"; vocab_size: the model's; vocab_dir: GPT-2's files ("" = the default place).
// Throws UsageError for an unknown name, or "auto" with a vocabulary that is neither 256 nor 50257; ConfigError
// (from the vocabulary loader) when GPT-2's files are missing.
std::unique_ptr<TextCodec> make_text_codec(const std::string& name, int vocab_size, const std::string& vocab_dir);

}  // namespace railyard::cli
