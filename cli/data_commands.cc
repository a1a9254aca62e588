// railyard data prepare | inspect
#include <httplib.h>
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli.h"
#include "cli/data_fetch.h"
#include "common/error.h"
#include "worker/data/data_loader.h"
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

// Removes the directory URL inputs were fetched into, whatever happens.
struct FetchDir {
  std::string path;
  ~FetchDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

int prepare(const Args& a) {
  worker::PrepareOptions o;
  bool reuse = false;
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
    } else if (a[i] == "--reuse") {
      reuse = true;
    } else if (a[i] == "--tokenizer") {
      o.tokenizer = flag_value(a, i);
      if (o.tokenizer != "bytes" && o.tokenizer != "gpt2") {
        throw UsageError{"--tokenizer '" + o.tokenizer + "' is not known (bytes, gpt2)"};
      }
    } else if (a[i] == "--vocab-dir") {
      o.vocab_dir = flag_value(a, i);
    } else if (is_flag(a[i])) {
      throw UsageError{"data prepare: unknown flag '" + a[i] + "'"};
    } else {
      throw UsageError{"data prepare: unexpected argument '" + a[i] + "' (input files go after --input)"};
    }
  }
  if (o.inputs.empty()) throw UsageError{"data prepare: --input FILE... is required"};
  if (o.output_dir.empty()) throw UsageError{"data prepare: --output DIR is required"};
  if (!o.vocab_dir.empty() && o.tokenizer != "gpt2") throw UsageError{"--vocab-dir needs --tokenizer gpt2"};
  // URL inputs are fetched into the output directory first (a hidden directory, removed afterwards); every input's
  // content digest goes into prepare.json, and with --reuse shards made from the same content are kept as they are.
  o.inputs = expand_directories(o.inputs);
  FetchDir fetched;
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    o.sources.push_back(o.inputs[i]);
    if (!is_url(o.inputs[i])) continue;
    if (fetched.path.empty()) {
      fetched.path = (std::filesystem::path(o.output_dir) / ".railyard-fetch").string();
      std::error_code ec;
      std::filesystem::create_directories(fetched.path, ec);
      if (ec) throw ConfigError("data prepare: cannot create " + fetched.path + ": " + ec.message());
    }
    const std::string file = fetched.path + "/input-" + std::to_string(i);
    std::cout << "fetching " << o.inputs[i] << std::endl;
    fetch_url(o.inputs[i], file);
    o.inputs[i] = file;
  }
  for (const std::string& in : o.inputs) o.sha256.push_back(sha256_file(in));
  if (reuse) {
    if (prepared_already(o)) {
      std::cout << "up to date: " << o.output_dir << "/prepare.json records the same " << o.inputs.size()
                << " input(s) (by SHA-256) and options; shards kept\n";
      return kExitOk;
    }
    o.force = true;  // other content or options: the shards there are replaced
  }
  const worker::PrepareResult r = worker::prepare_dataset(o);
  // Byte tokens are input bytes; GPT-2 tokens are counted in the token stream (documents led by <|endoftext|>).
  const char* range = r.tokenizer == "gpt2" ? "tokens" : "input bytes";
  std::cout << "tokenizer: " << r.tokenizer << " (vocab " << r.vocab_size << "), " << r.total_tokens << " tokens from "
            << o.inputs.size() << " file(s)"
            << (r.tokenizer == "gpt2" ? ", one document each, led by <|endoftext|> (50256)" : "") << "\n"
            << "train: " << r.train_tokens << " tokens in " << r.train_shards.size() << " shard(s), " << range
            << " [0, " << r.train_tokens << ")\n"
            << "val:   " << r.val_tokens << " tokens in " << r.val_shards.size() << " shard(s), " << range << " ["
            << r.train_tokens << ", " << r.total_tokens << ")\n"
            << "wrote " << o.output_dir << " (manifest " << r.manifest << ")\n";
  return kExitOk;
}

// Serves DIR's files read-only over HTTP until stopped: a corpus for jobs' initializers on a cluster that reaches no
// outside server (docs/storage.md "Initializer"; e2e_real_install serves one from a pod).
int serve(const Args& a) {
  std::string dir, address = "0.0.0.0";
  unsigned long long port = 8080;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--port") {
      port = parse_count("--port", flag_value(a, i));
      if (port == 0 || port > 65535) throw UsageError{"--port must be in 1..65535"};
    } else if (a[i] == "--address") {
      address = flag_value(a, i);
    } else {
      take_one_positional("data serve", "DIR", a[i], dir);
    }
  }
  if (dir.empty()) throw UsageError{"data serve: DIR is required"};
  httplib::Server server;
  if (!server.set_mount_point("/", dir)) throw ConfigError("data serve: " + dir + " is not a readable directory");
  server.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    std::cout << req.method << " " << req.path << " " << res.status << std::endl;
  });
  if (!server.bind_to_port(address, static_cast<int>(port)))
    throw ConfigError("data serve: cannot listen on " + address + ":" + std::to_string(port) + " (in use?)");
  std::cout << "serving " << dir << " on http://" << address << ":" << port << "/" << std::endl;
  // SIGTERM or SIGINT stops it (as PID 1 of a container nothing else would): a thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    server.stop();
  });
  server.listen_after_bind();
  pthread_kill(stopper.native_handle(), SIGTERM);  // stopped otherwise (it is not): let the waiter go
  stopper.join();
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
    } else {
      take_one_positional("data inspect", "FILE", a[i], file);
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

int sample(const Args& a) {
  std::string source;
  int B = 2, T = 64, rank = 0, world = 1, vocab = worker::kByteVocabSize;
  unsigned long long seed = 1, steps = 1, skip = 0;
  bool shuffle = true;
  auto small = [](const std::string& flag, unsigned long long v, unsigned long long lo) {
    if (v < lo || v > 1'000'000'000ULL) throw UsageError{flag + " " + std::to_string(v) + " is out of range"};
    return static_cast<int>(v);
  };
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--batch") {
      B = small("--batch", parse_count("--batch", flag_value(a, i)), 1);
    } else if (a[i] == "--seq") {
      T = small("--seq", parse_count("--seq", flag_value(a, i)), 1);
    } else if (a[i] == "--rank") {
      rank = small("--rank", parse_count("--rank", flag_value(a, i)), 0);
    } else if (a[i] == "--world") {
      world = small("--world", parse_count("--world", flag_value(a, i)), 1);
    } else if (a[i] == "--vocab") {
      vocab = small("--vocab", parse_count("--vocab", flag_value(a, i)), 1);
    } else if (a[i] == "--seed") {
      seed = parse_count("--seed", flag_value(a, i));
    } else if (a[i] == "--steps") {
      steps = parse_count("--steps", flag_value(a, i));
    } else if (a[i] == "--skip") {
      skip = parse_count("--skip", flag_value(a, i));
    } else if (a[i] == "--no-shuffle") {
      shuffle = false;
    } else {
      take_one_positional("data sample", "DIR or PATTERN", a[i], source);
    }
  }
  if (source.empty()) throw UsageError{"data sample: DIR or PATTERN is required"};
  worker::DataLoader loader(source, B, T, rank, world, seed, vocab, shuffle);
  std::cout << "source: " << source << ": " << loader.num_shards() << " shard(s), " << loader.num_tokens()
            << " tokens, " << loader.samples_per_epoch() << " samples of T+1=" << T + 1 << ", "
            << loader.steps_per_epoch() << " steps per epoch at B*world=" << B * world << "\n";
  const size_t n = static_cast<size_t>(B) * static_cast<size_t>(T);
  std::vector<int32_t> in(n), tg(n);
  for (unsigned long long i = 0; i < skip; ++i) loader.next_batch(in.data(), tg.data());
  for (unsigned long long s = 0; s < steps; ++s) {
    loader.next_batch(in.data(), tg.data());
    std::cout << "step " << skip + s << " (epoch " << loader.epoch() << "), rank " << rank << ":\n";
    for (int b = 0; b < B; ++b) {
      const int32_t* row = in.data() + static_cast<size_t>(b) * T;
      std::cout << "  [" << b << "] ";
      if (std::all_of(row, row + T, [](int32_t x) { return x < worker::kByteVocabSize; })) {
        std::cout << nlohmann::json(worker::byte_decode(row, static_cast<size_t>(T)))
                         .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      } else {
        for (int t = 0; t < T; ++t) std::cout << (t ? " " : "") << row[t];
      }
      std::cout << "\n";
    }
  }
  std::cout << "state: " << nlohmann::json(loader.state()).dump() << "\n";
  return kExitOk;
}

}  // namespace

int run_data(const Args& args) {
  return run_subcommand("data", args,
                        {{"prepare", prepare}, {"inspect", inspect}, {"sample", sample}, {"serve", serve}});
}

}  // namespace railyard::cli
