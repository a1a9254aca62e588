// railyard data prepare | inspect
#include <algorithm>
#include <iostream>

#include "worker/cli/cli.h"
#include "worker/data/prepare.h"
#include "worker/data/shard.h"
#include "worker/data/tokenizer.h"

namespace railyard::cli {

namespace {

bool is_flag(const std::string& s) { return s.size() > 1 && s[0] == '-'; }

const std::string& flag_value(const Args& a, size_t& i) {
  if (i + 1 >= a.size() || is_flag(a[i + 1])) throw UsageError{a[i] + " needs a value"};
  return a[++i];
}

int prepare(const Args& a) {
  worker::PrepareOptions o;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--input") {
      // --input takes every following non-flag argument, so shell globs work: --input texts/*.txt
      if (i + 1 >= a.size() || is_flag(a[i + 1])) throw UsageError{"--input needs at least one file"};
      while (i + 1 < a.size() && !is_flag(a[i + 1])) o.inputs.push_back(a[++i]);
    } else if (a[i] == "--output") {
      o.output_dir = flag_value(a, i);
    } else if (a[i] == "--val-fraction") {
      o.val_fraction = parse_fraction("--val-fraction", flag_value(a, i));
      if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) throw UsageError{"--val-fraction must be in [0, 1)"};
    } else if (a[i] == "--shard-tokens") {
      o.shard_tokens = parse_count("--shard-tokens", flag_value(a, i));
      if (o.shard_tokens == 0) throw UsageError{"--shard-tokens must be positive"};
    } else if (a[i] == "--force") {
      o.force = true;
    } else if (is_flag(a[i])) {
      throw UsageError{"data prepare: unknown flag '" + a[i] + "'"};
    } else {
      throw UsageError{"data prepare: unexpected argument '" + a[i] + "' (input files go after --input)"};
    }
  }
  if (o.inputs.empty()) throw UsageError{"data prepare: --input FILE... is required"};
  if (o.output_dir.empty()) throw UsageError{"data prepare: --output DIR is required"};
  const worker::PrepareResult r = worker::prepare_dataset(o);
  std::cout << "tokenizer: bytes (vocab 256), " << r.total_tokens << " tokens from " << o.inputs.size() << " file(s)\n"
            << "train: " << r.train_tokens << " tokens in " << r.train_shards.size() << " shard(s), input bytes [0, "
            << r.train_tokens << ")\n"
            << "val:   " << r.val_tokens << " tokens in " << r.val_shards.size() << " shard(s), input bytes ["
            << r.train_tokens << ", " << r.total_tokens << ")\n"
            << "wrote " << o.output_dir << " (manifest " << r.manifest << ")\n";
  return kExitOk;
}

int inspect(const Args& a) {
  std::string file;
  unsigned long long show = 64;
  int vocab = worker::kMaxShardVocab;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--tokens") {
      show = parse_count("--tokens", flag_value(a, i));
    } else if (a[i] == "--vocab") {
      const unsigned long long v = parse_count("--vocab", flag_value(a, i));
      if (v == 0 || v > static_cast<unsigned long long>(worker::kMaxShardVocab)) {
        throw UsageError{"--vocab must be in 1..65536"};
      }
      vocab = static_cast<int>(v);
    } else if (is_flag(a[i])) {
      throw UsageError{"data inspect: unknown flag '" + a[i] + "'"};
    } else if (file.empty()) {
      file = a[i];
    } else {
      throw UsageError{"data inspect: one FILE expected, got '" + file + "' and '" + a[i] + "'"};
    }
  }
  if (file.empty()) throw UsageError{"data inspect: FILE is required"};
  const worker::ShardHeader h = worker::read_shard_header(file);
  const worker::MappedShard shard(file, vocab);  // validates every token
  const uint16_t* t = shard.tokens();
  const size_t n = shard.num_tokens();
  const uint16_t max_token = n == 0 ? 0 : *std::max_element(t, t + n);
  const size_t k = std::min<size_t>(n, show);
  std::cout << "file:     " << file << "\n"
            << "magic:    " << h.magic << " (llm.c token shard)\n"
            << "version:  " << h.version << " (uint16 tokens)\n"
            << "tokens:   " << n << "\n"
            << "bytes:    " << h.file_bytes << "\n"
            << "max id:   " << max_token << (max_token < worker::kByteVocabSize ? " (fits the byte tokenizer)" : "")
            << "\n"
            << "first " << k << " ids:";
  for (size_t i = 0; i < k; ++i) std::cout << ' ' << t[i];
  std::cout << "\n";
  if (std::all_of(t, t + k, [](uint16_t x) { return x < worker::kByteVocabSize; })) {
    std::cout << "first " << k << " decoded (bytes):\n"
              << worker::escape_for_terminal(worker::byte_decode(t, k)) << "\n";
  } else {
    std::cout << "(not decoded: ids >= 256 come from another tokenizer)\n";
  }
  return kExitOk;
}

}  // namespace

int run_data(const Args& args) {
  if (args.empty()) throw UsageError{"data: subcommand required (prepare, inspect)"};
  const Args rest(args.begin() + 1, args.end());
  if (args[0] == "prepare") return prepare(rest);
  if (args[0] == "inspect") return inspect(rest);
  throw UsageError{"data: unknown subcommand '" + args[0] + "' (prepare, inspect)"};
}

}  // namespace railyard::cli
