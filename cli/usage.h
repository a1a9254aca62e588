// The `railyard` CLI's usage texts: one entry per subcommand that main.cc dispatches (data ..., model ...), from
// which both the overview (`railyard --help`) and each command's own help (`railyard data prepare --help`) are
// printed, so the two cannot disagree. plan, report and ckpt own their longer help beside their flag parsing.
#pragma once

#include <optional>
#include <string>

#include "cli/cli.h"

namespace railyard::cli {

// True when an argument is --help or -h: every command and subcommand answers it with its usage and exit 0, as
// kubectl and git do, wherever it appears on the line.
bool asks_for_help(const Args& args);

// The help that `railyard ARGS... --help` prints: the usage of the subcommand args[0] args[1] when that is one of
// the table's, else of the group args[0] (its subcommands); nullopt when args[0] is not a group of the table.
std::optional<std::string> table_help(const Args& args);

// The overview of the table's subcommands, as `railyard --help` lists them.
std::string table_overview();

}  // namespace railyard::cli
