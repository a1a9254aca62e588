// The `railyard` user CLI: a thin front over library code. Each command group parses its own arguments and
// returns the process exit code: 0 success, 1 the operation failed (bad input file, I/O), 2 usage error.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace railyard::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// Thrown for a bad command line; main prints it with a pointer to --help and exits 2.
struct UsageError {
  std::string message;
};

using Args = std::vector<std::string>;

// A command group's subcommands (name, what runs it), in the order its usage errors list them.
using Subcommands = std::vector<std::pair<std::string, int (*)(const Args&)>>;

// Runs the subcommand args[0] with the rest of args; without one, or for an unknown one, a UsageError that lists the
// group's subcommands.
inline int run_subcommand(const std::string& group, const Args& args, const Subcommands& subcommands) {
  std::string names;
  for (const auto& [name, run] : subcommands) names += (names.empty() ? "" : ", ") + name;
  if (args.empty()) throw UsageError{group + ": subcommand required (" + names + ")"};
  for (const auto& [name, run] : subcommands)
    if (args[0] == name) return run(Args(args.begin() + 1, args.end()));
  throw UsageError{group + ": unknown subcommand '" + args[0] + "' (" + names + ")"};
}

int run_data(const Args& args);      // railyard data ...
int run_model(const Args& args);     // railyard model ...
int run_plan(const Args& args);      // railyard plan ... (plan_command.cc)
int run_report(const Args& args);    // railyard report ... (report_command.cc)
int run_eval(const Args& args);      // railyard eval ... (eval_command.cc)
int run_generate(const Args& args);  // railyard generate ... (generate_command.cc)
int run_convert(const Args& args);   // railyard convert ... (convert_command.cc)

// `arg`, not a flag the caller knows, as the one positional argument of `command` (`what` names it in messages, e.g.
// "DIR"): an unknown flag or a second positional argument is a UsageError.
inline void take_one_positional(const std::string& command, const std::string& what, const std::string& arg,
                                std::string& into) {
  if (arg.size() > 1 && arg[0] == '-') throw UsageError{command + ": unknown flag '" + arg + "'"};
  if (!into.empty()) throw UsageError{command + ": one " + what + " expected, got '" + into + "' and '" + arg + "'"};
  into = arg;
}

// Strict numbers for flags: the whole text must parse; throws UsageError naming the flag.
unsigned long long parse_count(const std::string& flag, const std::string& text);
double parse_fraction(const std::string& flag, const std::string& text);

}  // namespace railyard::cli
