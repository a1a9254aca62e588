// `railyard data prepare`: text files (and token shards) -> train/val token shards.
//
// Tokenizers: "bytes" (the default: token = byte, vocab 256) and "gpt2" (GPT-2's byte-level BPE, vocab 50257,
// worker/data/gpt2_bpe.h). With "bytes" the inputs are concatenated in the order given (no separator: the byte
// vocabulary has no spare token). With "gpt2" each input file is one document and, as in llm.c's data scripts, every
// document starts with <|endoftext|> (50256). Of the N tokens, the first N - floor(N * val_fraction) become the
// train split and the rest the val split, each cut into shards of at most shard_tokens tokens: DIR/train_000000.bin
// ..., DIR/val_000000.bin ... plus DIR/prepare.json describing the run. Shards are staged in a hidden directory and
// renamed into place only when all are complete.
//
// An input that is already an llm.c token shard (magic and version in its first bytes: e.g. llm.c's FineWeb shards)
// is taken token for token, in its place among the inputs, and re-split with the rest; its tokens must be below the
// tokenizer's vocabulary (256 or 50257). Shards alone need no GPT-2 vocabulary files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace railyard::worker {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output_dir;
  double val_fraction = 0.1;
  uint64_t shard_tokens = 100'000'000;  // llm.c's shard size
  bool force = false;                   // replace existing shards in output_dir
  std::string tokenizer = "bytes";      // "bytes" or "gpt2"
  std::string vocab_dir;                // gpt2: encoder.json + vocab.bpe; empty = default_gpt2_vocab_dir()
  // Recorded in prepare.json per input when given (one per input): where it came from (a URL the caller fetched into
  // the input file) and its content's SHA-256, by which `railyard data prepare --reuse` knows shards it made before.
  std::vector<std::string> sources, sha256;
};

struct PrepareResult {
  std::string tokenizer;  // as in the options
  int vocab_size = 0;     // 256 or 50257
  uint64_t total_tokens = 0;
  uint64_t train_tokens = 0;  // bytes: also the byte offset in the concatenated input where val starts
  uint64_t val_tokens = 0;
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  std::string manifest;  // path of prepare.json
};

// Throws railyard::ConfigError naming the option or file at fault.
PrepareResult prepare_dataset(const PrepareOptions& options);

}  // namespace railyard::worker
