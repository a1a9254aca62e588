// railyard: the user CLI (data preparation and inspection, model inspection; plan and ckpt join here).
#include <charconv>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/cli.h"
#include "common/error.h"
#include "worker/cli/cli.h"

namespace railyard::cli {

namespace {

constexpr const char* kUsage = R"(usage: railyard <command> [args]

Commands:
  data prepare --input FILE... --output DIR [--val-fraction F] [--shard-tokens N] [--force]
                       tokenize text files byte-wise (vocab 256) into llm.c .bin shards:
                       DIR/train_000000.bin..., DIR/val_000000.bin..., DIR/prepare.json
                       (defaults: --val-fraction 0.1 = the last 10% of the bytes, --shard-tokens 100000000)
  data inspect FILE [--tokens N] [--vocab V]
                       validate a shard and show its header and first N tokens (default 64), decoded when
                       they are bytes; --vocab (default 65536) refuses tokens >= V
  data sample DIR|PATTERN [--batch B] [--seq T] [--rank R] [--world W] [--seed S] [--steps N] [--skip K]
                       [--vocab V] [--no-shuffle]
                       print the batches the training loader yields (decoded as JSON strings when they are
                       bytes; defaults B 2, T 64, rank 0 of 1, seed 1, 1 step, vocab 256) and its final state
  model inspect FILE   show an llm.c GPT-2 checkpoint's header, parameter count and tensor layout
  plan --model M --gpus N --gpu TYPE --global-batch B [--tokens T] [--topology FILE] [--top N] [--json]
                       rank parallel layouts by predicted step time (railyard plan --help; docs/planner.md)
  plan --calibrate [--output FILE]
                       measure this machine's CPU kernels into a planner calibration file
  report --log FILE [--log FILE...] [--status FILE] [--checkpoints DIR] [--output FILE.html]
                       write a self-contained HTML report of a training run (railyard report --help)
  ckpt ls|inspect|verify|reshard DIR ...
                       list, inspect, verify and reshard checkpoints (railyard ckpt --help)
  help, --help, -h     this text

Exit codes: 0 ok, 1 the operation failed (message on stderr), 2 bad command line.
See docs/data.md.
)";

}  // namespace

unsigned long long parse_count(const std::string& flag, const std::string& text) {
  unsigned long long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) {
    throw UsageError{flag + " '" + text + "' is not a non-negative integer"};
  }
  return v;
}

double parse_fraction(const std::string& flag, const std::string& text) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) {
    throw UsageError{flag + " '" + text + "' is not a number"};
  }
  return v;
}

int run(const Args& args) {
  if (args.empty()) throw UsageError{"no command given"};
  const std::string& cmd = args[0];
  const Args rest(args.begin() + 1, args.end());
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    std::cout << kUsage;
    return kExitOk;
  }
  if (cmd == "data") return run_data(rest);
  if (cmd == "model") return run_model(rest);
  if (cmd == "plan") return run_plan(rest);
  if (cmd == "report") return run_report(rest);
  if (cmd == "ckpt") {
    // The checkpoint library owns its command line; it expects argv[0] == "ckpt".
    std::vector<std::string> owned(args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : owned) argv.push_back(a.data());
    argv.push_back(nullptr);
    return ckpt::cli_main(static_cast<int>(owned.size()), argv.data());
  }
  if (!cmd.empty() && cmd[0] == '-') throw UsageError{"unknown flag '" + cmd + "'"};
  throw UsageError{"unknown command '" + cmd + "' (commands: data, model, plan, ckpt, report, help)"};
}

}  // namespace railyard::cli

int main(int argc, char** argv) {
  using namespace railyard;
  cli::Args args(argv + 1, argv + argc);
  try {
    return cli::run(args);
  } catch (const cli::UsageError& e) {
    std::cerr << "railyard: " << e.message << "\nRun 'railyard --help' for usage.\n";
    return cli::kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "railyard: error: " << e.what() << "\n";
    return cli::kExitFailed;
  }
}
