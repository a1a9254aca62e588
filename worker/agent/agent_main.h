// Entry point of `railyard-worker agent [-- COMMAND ARGS...]`; argv[0] is the subcommand name (or the program).
#pragma once

namespace railyard::worker {

int agent_main(int argc, char** argv);

}  // namespace railyard::worker
