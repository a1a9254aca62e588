// railyard: the user CLI (data preparation and inspection, model inspection; plan and ckpt join here).
#include <charconv>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/cli.h"
#include "cli/cli.h"
#include "cli/usage.h"
#include "common/error.h"

namespace railyard::cli {

namespace {

constexpr const char* kUsageHead = R"(usage: railyard <command> [args]

Commands:
)";

constexpr const char* kUsageTail =
    R"(  plan --model M --gpus N --gpu TYPE --global-batch B [--tokens T] [--topology FILE] [--top N] [--json]
                       rank parallel layouts by predicted step time (railyard plan --help; docs/planner.md)
  plan --calibrate [--output FILE]
                       measure this machine's CPU kernels into a planner calibration file
  eval (--model FILE | --checkpoint DIR [--step N]) --data DIR|PATTERN [--batch B] [--seq T] [--steps N]
                       loss and perplexity of a model on shards, as the trainer's validation (railyard eval --help)
  generate (--model FILE | --checkpoint DIR [--step N]) [--prompt TEXT] [--tokens N] [--temperature X]
                       [--top-k K] [--top-p P] [--seed S]
                       continue a prompt with a trained model (railyard generate --help)
  report --log FILE [--log FILE...] [--status FILE] [--checkpoints DIR] [--output FILE.html]
                       write a self-contained HTML report of a training run (railyard report --help)
  convert FILE... [--output FILE]
                       a Kubeflow PyTorchJob or TrainJob (with its runtime) as a TrainingJob (railyard convert --help)
  ckpt ls|inspect|verify|reshard DIR ...
                       list, inspect, verify and reshard checkpoints (railyard ckpt --help)
  help, --help, -h     this text

Every command and subcommand prints its own usage for --help or -h (railyard data prepare --help).
Exit codes: 0 ok, 1 the operation failed (message on stderr), 2 bad command line.
See docs/data.md.
)";

std::string usage() { return kUsageHead + table_overview() + kUsageTail; }

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
    std::cout << usage();
    return kExitOk;
  }
  // data and model answer --help from the usage table; plan, report and ckpt parse it themselves.
  if (asks_for_help(args)) {
    if (std::optional<std::string> help = table_help(args)) {
      std::cout << *help;
      return kExitOk;
    }
  }
  if (cmd == "data") return run_data(rest);
  if (cmd == "model") return run_model(rest);
  if (cmd == "plan") return run_plan(rest);
  if (cmd == "report") return run_report(rest);
  if (cmd == "eval") return run_eval(rest);
  if (cmd == "generate") return run_generate(rest);
  if (cmd == "convert") return run_convert(rest);
  if (cmd == "ckpt") {
    // The checkpoint library owns its command line; it expects argv[0] == "ckpt".
    std::vector<std::string> owned(args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : owned) argv.push_back(a.data());
    argv.push_back(nullptr);
    return ckpt::cli_main(static_cast<int>(owned.size()), argv.data());
  }
  if (!cmd.empty() && cmd[0] == '-') throw UsageError{"unknown flag '" + cmd + "'"};
  throw UsageError{"unknown command '" + cmd +
                   "' (commands: data, model, plan, eval, generate, convert, ckpt, report, help)"};
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
