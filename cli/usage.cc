#include "cli/usage.h"

#include <string_view>
#include <vector>

namespace railyard::cli {

namespace {

struct CommandUsage {
  std::string_view group;     // "data"
  std::string_view sub;       // "prepare"
  std::string_view synopsis;  // flags, after "railyard data prepare"
  std::string_view details;   // what it does, defaults; lines indented by the printer
};

// Keep in step with the flag parsing in data_commands.cc and model_commands.cc (tests/unit/worker_data/cli_test.cc
// runs every entry's --help and checks that each flag it names is accepted).
const std::vector<CommandUsage>& table() {
  static const std::vector<CommandUsage> t = {
      {"data", "prepare",
       "--input FILE|URL... --output DIR [--val-fraction F] [--shard-tokens N] [--force|--reuse]\n"
       "[--tokenizer bytes|gpt2] [--vocab-dir DIR]",
       "tokenize text files into llm.c .bin shards:\n"
       "DIR/train_000000.bin..., DIR/val_000000.bin..., DIR/prepare.json\n"
       "--tokenizer bytes (default): token = byte, vocab 256, files concatenated;\n"
       "--tokenizer gpt2: GPT-2 BPE, vocab 50257, each file one document led by <|endoftext|>;\n"
       "its encoder.json and vocab.bpe come from --vocab-dir (default $RAILYARD_GPT2_DIR, else\n"
       "~/.cache/railyard/gpt2), filled by scripts/fetch_gpt2_vocab.sh\n"
       "(defaults: --val-fraction 0.1 = the last 10% of the tokens, --shard-tokens 100000000;\n"
       "--force replaces shards already in DIR; --reuse keeps them when DIR/prepare.json records\n"
       "the same inputs by SHA-256 and the same options, and replaces them otherwise);\n"
       "an http:// or https:// input is fetched first (HTTPS verified against the system CAs);\n"
       "an input that is an llm.c token shard is taken token for token (each below the vocab);\n"
       "a directory input stands for the files under it, in path order"},
      {"data", "inspect", "FILE [--tokens N] [--vocab V]",
       "validate a shard and show its header and first N tokens (default 64), decoded when\n"
       "they are bytes; --vocab (default 65536) refuses tokens >= V"},
      {"data", "sample",
       "DIR|PATTERN [--batch B] [--seq T] [--rank R] [--world W] [--seed S] [--steps N] [--skip K]\n"
       "[--vocab V] [--no-shuffle]",
       "print the batches the training loader yields (decoded as JSON strings when they are\n"
       "bytes; defaults B 2, T 64, rank 0 of 1, seed 1, 1 step, vocab 256) and its final state"},
      {"data", "serve", "DIR [--port P] [--address A]",
       "serve DIR's files read-only over HTTP until stopped (default port 8080 on 0.0.0.0):\n"
       "a corpus for jobs' spec.initializer on a cluster that reaches no outside server"},
      {"model", "inspect", "FILE", "show an llm.c GPT-2 checkpoint's header, parameter count and tensor layout"},
      {"model", "export", "(--model FILE | --checkpoint DIR [--step N]) --output PATH [--format hf|llmc]",
       "write a model (an llm.c file, or a checkpoint of any parallel layout) for other tools:\n"
       "--format hf (default): PATH/model.safetensors + PATH/config.json, Hugging Face GPT-2;\n"
       "--format llmc: the llm.c GPT-2 file PATH"},
      {"model", "fetch", "SOURCE --output FILE",
       "an llm.c GPT-2 model file from an http(s) URL (or a file) into FILE, checked first (header\n"
       "and size); FILE of the same content (SHA-256) is left as it is"},
  };
  return t;
}

constexpr std::string_view kFooter =
    "\nExit codes: 0 ok, 1 the operation failed (message on stderr), 2 bad command line.\nSee docs/data.md.\n";

// Every line after the first indented by `indent` spaces.
std::string indented(std::string_view text, size_t indent) {
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '\n') out.append(indent, ' ');
  }
  return out;
}

// "  data prepare --input ...\n                       tokenize ...\n"
std::string entry(const CommandUsage& u) {
  constexpr size_t kColumn = 23;
  return "  " + std::string(u.group) + " " + std::string(u.sub) + " " + indented(u.synopsis, kColumn) + "\n" +
         std::string(kColumn, ' ') + indented(u.details, kColumn) + "\n";
}

}  // namespace

bool asks_for_help(const Args& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

std::optional<std::string> table_help(const Args& args) {
  if (args.empty()) return std::nullopt;
  std::string group_lines, subs;
  for (const CommandUsage& u : table()) {
    if (u.group != args[0]) continue;
    if (args.size() > 1 && u.sub == args[1]) {
      return "usage: railyard " + std::string(u.group) + " " + std::string(u.sub) + " " + indented(u.synopsis, 4) +
             "\n\n  " + indented(u.details, 2) + "\n" + std::string(kFooter);
    }
    group_lines += entry(u);
    if (!subs.empty()) subs += '|';
    subs += u.sub;
  }
  if (group_lines.empty()) return std::nullopt;
  return "usage: railyard " + args[0] + " " + subs + " [args]\n\n" + group_lines + "\n'railyard " + args[0] +
         " SUBCOMMAND --help' shows one subcommand.\n" + std::string(kFooter);
}

std::string table_overview() {
  std::string out;
  for (const CommandUsage& u : table()) out += entry(u);
  return out;
}

}  // namespace railyard::cli
