// railyard eval: loss and perplexity of a trained model on token shards, computed as the trainer's validation
// computes it (Trainer::validate: the loader unshuffled from the first shard, --steps batches of B x T, the mean of
// the batches' mean losses), so a model exported or checkpointed after training prints the trainer's last val_loss.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "common/error.h"
#include "cli/cli.h"
#include "cli/model_source.h"
#include "worker/data/data_loader.h"
#include "worker/kernels/cpu/kernels.h"
#include "worker/kernels/cpu/thread_pool.h"
#include "worker/model/gpt.h"

namespace railyard::cli {

namespace {

constexpr const char* kEvalUsage =
    R"(usage: railyard eval (--model FILE | --checkpoint DIR [--step N]) --data DIR|PATTERN
                     [--batch B] [--seq T] [--steps N] [--threads N]
The mean cross-entropy loss (nats per token) and perplexity exp(loss) of a model on token shards, the numbers the
trainer's validation prints as val_loss: the shards are read in order from the first token, --steps batches of
B sequences of T tokens, and the loss is the mean of the batches' mean losses.
  --model FILE        an llm.c GPT-2 model file (railyard-worker train --export, llm.c, its train_gpt2.py)
  --checkpoint DIR    a checkpoint directory (railyard-worker train --ckpt-dir, a TrainingJob's
                      spec.checkpoint.path): its newest complete checkpoint, or --step N; any parallel layout
  --data PATH         shards: a directory (its val_*.bin) or a glob, e.g. /data/val_*.bin
  --batch B           sequences per batch (default 4, the trainer's --batch)
  --seq T             tokens per sequence (default 64, the trainer's --seq; at most the model's maxT)
  --steps N           batches (default 10, the trainer's --val-steps)
  --threads N         compute threads (default: the CPUs this process may use); the last digits of the loss can
                      differ between thread counts, as the trainer's own do
Exit codes: 0 ok, 1 the operation failed (message on stderr), 2 bad command line.
)";

}  // namespace

int run_eval(const Args& args) {
  ModelSource from;
  std::string data;
  unsigned long long B = 4, T = 64, steps = 10, threads = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::cout << kEvalUsage;
      return kExitOk;
    }
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size() || (args[i + 1].size() > 1 && args[i + 1][0] == '-'))
        throw UsageError{"eval: " + a + " needs a value"};
      return args[++i];
    };
    auto positive = [&](const char* flag) {
      const unsigned long long v = parse_count(flag, value());
      if (v == 0 || v > 1'000'000'000ULL) throw UsageError{std::string("eval: ") + flag + " must be in 1..1e9"};
      return v;
    };
    if (from.take(args, i, "eval")) continue;
    if (a == "--data") {
      data = value();
    } else if (a == "--batch") {
      B = positive("--batch");
    } else if (a == "--seq") {
      T = positive("--seq");
    } else if (a == "--steps") {
      steps = positive("--steps");
    } else if (a == "--threads") {
      threads = positive("--threads");
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError{"eval: unknown flag '" + a + "' (railyard eval --help)"};
    } else {
      throw UsageError{"eval: unexpected argument '" + a + "' (railyard eval --help)"};
    }
  }
  from.check("eval");
  if (data.empty()) throw UsageError{"eval: --data DIR|PATTERN is required"};
  const LoadedModel m = from.load();
  const worker::GptConfig& cfg = m.config;
  if (T > static_cast<unsigned long long>(cfg.max_seq_len)) {
    throw UsageError{"eval: --seq " + std::to_string(T) + " exceeds the model's maxT " +
                     std::to_string(cfg.max_seq_len)};
  }
  const int nthreads = threads > 0 ? static_cast<int>(threads) : worker::default_num_threads();
  worker::ThreadPool pool(nthreads);
  worker::cpu::set_gemm_threading(worker::cpu::GemmThreading::kPool, nthreads);
  worker::Gpt<float> model(cfg, static_cast<int>(B), static_cast<int>(T), pool);
  model.copy_params_from_host(m.params.data());
  // As the trainer's validation loader: rank 0 of 1, unshuffled (the seed is then unused).
  worker::DataLoader loader(worker::shard_glob(data, "val_*.bin"), static_cast<int>(B), static_cast<int>(T), 0, 1, 0,
                            cfg.vocab_size, false);
  std::vector<int32_t> inputs(B * T), targets(B * T);
  double sum = 0;
  for (unsigned long long s = 0; s < steps; ++s) {
    loader.next_batch(inputs.data(), targets.data());
    sum += model.forward(inputs.data(), targets.data(), worker::Gpt<float>::Mode::kEval);
  }
  const double loss = sum / static_cast<double>(steps);
  std::printf("model:      %s, %s\n", m.source.c_str(), worker::describe(cfg).c_str());
  std::printf("data:       %s, %llu batches of %llu x %llu tokens\n", data.c_str(), steps, B, T);
  std::printf("val_loss:   %.6f\n", loss);
  std::printf("perplexity: %.4f\n", std::exp(loss));
  return std::isfinite(loss) ? kExitOk : kExitFailed;
}

}  // namespace railyard::cli
