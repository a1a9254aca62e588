// torchrun (torch.distributed.run) as the launcher inside a program's container (docs/programs.md "torchrun in the
// container"): how its command line is recognised and read, which of its flags Railyard sets itself, and the PET_*
// variables through which the agent hands torchrun the world Railyard's rendezvous formed. Shared by the operator
// (spec.program.launcher: detection and the flag check), the agent (the variables) and `railyard convert` (the
// command's parts), which may not depend on each other.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace railyard::torchrun {

// spec.program.launcher, and the pod variable that carries the operator's resolved choice to the agent ("torchrun"
// or "perRank"; unset, from an operator that predates it: perRank).
inline constexpr const char* kLauncherEnv = "RAILYARD_LAUNCHER";
inline constexpr const char* kLauncherAuto = "auto";
inline constexpr const char* kLauncherTorchrun = "torchrun";
inline constexpr const char* kLauncherPerRank = "perRank";

// What the agent sets on torchrun's process: torch.distributed.run takes the default of each flag --x-y from PET_X_Y.
// Static rendezvous at pod 0's agent-chosen port, the generation's pod count and this pod's index, and no restarts of
// its own (Railyard restarts the generation). A flag on the command line would win over these, which is why the
// operator refuses the conflicting ones (check_options).
inline constexpr const char* kNnodesEnv = "PET_NNODES";
inline constexpr const char* kNprocPerNodeEnv = "PET_NPROC_PER_NODE";
inline constexpr const char* kNodeRankEnv = "PET_NODE_RANK";
inline constexpr const char* kMasterAddrEnv = "PET_MASTER_ADDR";
inline constexpr const char* kMasterPortEnv = "PET_MASTER_PORT";
inline constexpr const char* kMaxRestartsEnv = "PET_MAX_RESTARTS";
inline constexpr const char* kRdzvBackendEnv = "PET_RDZV_BACKEND";  // "static"
inline constexpr const char* kRdzvIdEnv = "PET_RDZV_ID";            // the run id: torchrun's TORCHELASTIC_RUN_ID
inline constexpr std::array<const char*, 8> kAgentSetEnv = {kNnodesEnv,      kNprocPerNodeEnv, kNodeRankEnv,
                                                            kMasterAddrEnv,  kMasterPortEnv,   kMaxRestartsEnv,
                                                            kRdzvBackendEnv, kRdzvIdEnv};

// Where a rank reports progress (docs/programs.md "Progress, status and the monitor"): in both launch modes each
// local rank writes $RAILYARD_PROGRESS_DIR/progress-$LOCAL_RANK.json. Per rank, the agent also sets
// RAILYARD_PROGRESS_FILE to that path; under torchrun it cannot (torchrun gives all its ranks one environment), so it
// leaves RAILYARD_PROGRESS_FILE unset rather than let every rank write one file.
inline constexpr const char* kProgressDirEnv = "RAILYARD_PROGRESS_DIR";
inline constexpr const char* kProgressFileEnv = "RAILYARD_PROGRESS_FILE";
inline std::string progress_file_name(int local_rank) { return "progress-" + std::to_string(local_rank) + ".json"; }

// One option of torchrun's own (before the script).
struct Option {
  size_t index = 0;   // argv index of the option
  size_t count = 1;   // argv elements it takes: 2 when its value is the next one
  std::string dest;   // canonical name, underscores: "nproc_per_node" (either spelling, abbreviations resolved)
  std::string value;  // its value ("" for a flag)
  std::string text;   // as written: "--nproc-per-node 4"
};

// torchrun's command line, read as its argparse reads it.
struct Command {
  size_t first_option = 1;         // 1 after `torchrun`, 3 after `python -m torch.distributed.run`
  std::string interpreter;         // what runs the script: "python" after torchrun, else argv[0]
  bool deprecated_launch = false;  // `python -m torch.distributed.launch` (not a launcher auto-detection picks)
  std::vector<Option> options;     // torchrun's own, in order
  size_t script = 0;               // argv index of the script (or module, or binary); argv.size() when none
  bool no_python = false, module = false;
};

// argv as torchrun's command line, or nullopt when it does not start torchrun: its first word is `torchrun` (in any
// directory), or a `python*` interpreter followed by `-m torch.distributed.run` (or `.launch`: deprecated_launch).
// A shell that starts torchrun, `env torchrun`, python flags before -m: not recognised (too easy to get wrong; the
// launcher field says it instead).
std::optional<Command> parse_command(const std::vector<std::string>& argv);

// spec.program.launcher auto: whether argv is torchrun or `python* -m torch.distributed.run`.
bool is_torchrun(const std::vector<std::string>& argv);

// A flag of the user's torchrun that contradicts what the agent sets through PET_* (a flag wins over its variable):
// the node count, node rank, master, rendezvous settings and --standalone; --max-restarts other than 0; and
// --nproc-per-node other than procs_per_node. Kept: everything else (--log-dir, --redirects, --monitor-interval, -m,
// --no-python, ...).
struct Conflict {
  size_t index = 0;     // argv index of the option
  std::string problem;  // what is wrong, naming the option as written
  std::string fix;
};
std::optional<Conflict> check_options(const Command& command, int procs_per_node);

}  // namespace railyard::torchrun
