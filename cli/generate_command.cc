// railyard generate: text from a trained model. The prompt is encoded with the tokenizer the data used (bytes for a
// vocabulary of 256, GPT-2's BPE for 50257, or --tokenizer), then tokens are drawn one at a time (model/gpt_decode.h:
// a key/value cache, or with --no-cache a full forward over the sequence per token, which must give the same tokens).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "common/error.h"
#include "cli/cli.h"
#include "cli/model_source.h"
#include "cli/text_codec.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"
#include "worker/model/gpt_decode.h"

namespace railyard::cli {

namespace {

constexpr const char* kGenerateUsage =
    R"(usage: railyard generate (--model FILE | --checkpoint DIR [--step N]) [--prompt TEXT] [--tokens N]
                         [--temperature X] [--top-k K] [--top-p P] [--seed S] [--tokenizer auto|bytes|gpt2]
                         [--vocab-dir DIR] [--ids] [--no-cache] [--threads N]
Continues a prompt with a trained model and prints the prompt and the continuation.
  --model FILE        an llm.c GPT-2 model file (railyard-worker train --export, llm.c)
  --checkpoint DIR    a checkpoint directory (any parallel layout): its newest complete checkpoint, or --step N
  --prompt TEXT       the text to continue (default: GPT-2's <|endoftext|> with its tokenizer, a newline with bytes)
  --tokens N          new tokens to draw (default 64; prompt + new tokens fit in the model's maxT)
  --temperature X     0 = greedy (the most likely token each time); default 1.0
  --top-k K           draw only among the K most likely tokens (default 0 = all)
  --top-p P           draw only among the most likely tokens whose probability adds up to P (default 1.0 = all)
  --seed S            the draws' seed (default 1337): the same seed, model and prompt give the same text
  --tokenizer T       auto (default: bytes for a vocabulary of 256, gpt2 for 50257), bytes or gpt2
  --vocab-dir DIR     GPT-2's encoder.json and vocab.bpe (default $RAILYARD_GPT2_DIR, else ~/.cache/railyard/gpt2;
                      scripts/fetch_gpt2_vocab.sh puts them there)
  --ids               also print the new tokens' ids ("ids: 12 7 ...")
  --no-cache          recompute the whole sequence for every token instead of using the key/value cache (slower;
                      the same tokens: a check of the cache)
  --threads N         compute threads (default: the CPUs this process may use)
Exit codes: 0 ok, 1 the operation failed (message on stderr), 2 bad command line.
)";

// The logits predicting the token after everything appended so far.
class NextTokenLogits {
 public:
  virtual ~NextTokenLogits() = default;
  virtual const float* append(int32_t token) = 0;
};

class CachedDecoder : public NextTokenLogits {
 public:
  CachedDecoder(const worker::GptConfig& c, const float* params, worker::ThreadPool& pool) : d_(c, params, pool) {}
  const float* append(int32_t token) override { return d_.append(token); }

 private:
  worker::GptDecoder d_;
};

// Gpt's training forward (B = 1, T = maxT) over the whole sequence for every token: causal attention makes the
// logits at position n - 1 depend on tokens 0..n-1 only, so the unused positions after them are filled with zeros.
class FullForwardDecoder : public NextTokenLogits {
 public:
  FullForwardDecoder(const worker::GptConfig& c, const float* params, worker::ThreadPool& pool)
      : model_(c, 1, c.max_seq_len, pool), tokens_(static_cast<size_t>(c.max_seq_len), 0), targets_(tokens_.size(), 0) {
    model_.copy_params_from_host(params);
  }
  const float* append(int32_t token) override {
    if (n_ >= tokens_.size()) throw ConfigError("generation reached the model's maxT");
    tokens_[n_++] = token;
    model_.forward(tokens_.data(), targets_.data(), worker::Gpt<float>::Mode::kEval);
    return model_.logits() + (n_ - 1) * static_cast<size_t>(model_.config().padded_vocab_size);
  }

 private:
  worker::Gpt<float> model_;
  std::vector<int32_t> tokens_, targets_;
  size_t n_ = 0;
};

}  // namespace

int run_generate(const Args& args) {
  ModelSource from;
  std::string prompt, tokenizer = "auto", vocab_dir;
  bool have_prompt = false, print_ids = false, no_cache = false;
  unsigned long long new_tokens = 64, seed = 1337, threads = 0;
  worker::SamplingOptions opt;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kGenerateUsage;
      return kExitOk;
    }
    if (from.take(args, i, "generate")) continue;
    // --prompt takes any text, including text that starts with '-'.
    auto value = [&](bool any = false) -> const std::string& {
      if (i + 1 >= args.size() || (!any && args[i + 1].size() > 1 && args[i + 1][0] == '-'))
        throw UsageError{"generate: " + a + " needs a value"};
      return args[++i];
    };
    if (a == "--prompt") {
      prompt = value(true);
      have_prompt = true;
    } else if (a == "--tokens") {
      new_tokens = parse_count("--tokens", value());
    } else if (a == "--temperature") {
      opt.temperature = parse_fraction("--temperature", value());
      if (!(opt.temperature >= 0 && opt.temperature <= 100)) throw UsageError{"--temperature must be in [0, 100]"};
    } else if (a == "--top-k") {
      opt.top_k = static_cast<int>(std::min(parse_count("--top-k", value()), 1ULL << 30));
    } else if (a == "--top-p") {
      opt.top_p = parse_fraction("--top-p", value());
      if (!(opt.top_p > 0 && opt.top_p <= 1)) throw UsageError{"--top-p must be in (0, 1]"};
    } else if (a == "--seed") {
      seed = parse_count("--seed", value());
    } else if (a == "--tokenizer") {
      tokenizer = value();
    } else if (a == "--vocab-dir") {
      vocab_dir = value();
    } else if (a == "--threads") {
      threads = parse_count("--threads", value());
      if (threads == 0 || threads > 4096) throw UsageError{"--threads must be in 1..4096"};
    } else if (a == "--ids") {
      print_ids = true;
    } else if (a == "--no-cache") {
      no_cache = true;
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError{"generate: unknown flag '" + a + "' (railyard generate --help)"};
    } else {
      throw UsageError{"generate: unexpected argument '" + a + "' (railyard generate --help)"};
    }
  }
  from.check("generate");
  const LoadedModel m = from.load();
  const std::unique_ptr<TextCodec> codec = make_text_codec(tokenizer, m.config.vocab_size, vocab_dir);
  std::vector<int32_t> context = have_prompt ? codec->encode(prompt) : codec->start_tokens();
  if (context.empty()) throw UsageError{"generate: --prompt is empty (leave it out to start from the default)"};
  if (context.size() + new_tokens > static_cast<size_t>(m.config.max_seq_len)) {
    throw UsageError{"generate: the prompt's " + std::to_string(context.size()) + " tokens and --tokens " +
                     std::to_string(new_tokens) + " exceed the model's maxT " + std::to_string(m.config.max_seq_len)};
  }

  const int nthreads = threads > 0 ? static_cast<int>(threads) : worker::default_num_threads();
  worker::ThreadPool pool(nthreads);
  worker::cpu::set_gemm_threading(worker::cpu::GemmThreading::kPool, nthreads);
  std::unique_ptr<NextTokenLogits> next;
  if (no_cache) {
    next = std::make_unique<FullForwardDecoder>(m.config, m.params.data(), pool);
  } else {
    next = std::make_unique<CachedDecoder>(m.config, m.params.data(), pool);
  }
  worker::SampleRng rng(seed);
  const auto t0 = std::chrono::steady_clock::now();
  const float* logits = nullptr;
  for (int32_t t : context) logits = next->append(t);
  std::vector<int32_t> out;
  for (unsigned long long k = 0; k < new_tokens; ++k) {
    const int32_t t = worker::sample_token(logits, m.config.vocab_size, opt, rng);
    out.push_back(t);
    if (k + 1 < new_tokens) logits = next->append(t);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << codec->display(context) << codec->display(out) << "\n";
  if (print_ids) {
    std::cout << "ids:";
    for (int32_t t : out) std::cout << " " << t;
    std::cout << "\n";
  }
  std::fprintf(stderr, "generated %zu tokens after a %zu-token prompt in %.3f s (%s; %s, %s)\n", out.size(),
               context.size(), secs, no_cache ? "no cache" : "key/value cache", m.source.c_str(),
               worker::describe(m.config).c_str());
  return kExitOk;
}

}  // namespace railyard::cli
