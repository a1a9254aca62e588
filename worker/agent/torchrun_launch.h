// The agent's side of torchrun mode (spec.program.launcher torchrun, docs/programs.md "torchrun in the container"):
// one process per pod, the user's torchrun, which starts the local ranks itself. What the agent cannot be told by
// torchrun it reads from the outside: which of torchrun's descendants is which local rank (their LOCAL_RANK, for the
// stopped-rank series), which rank failed and how (torchrun's failure summary on its stderr, for the exit report),
// and what is left of the tree after torchrun is gone (torch >= 2 starts each rank in a session of its own, so a
// signal to torchrun's process group does not reach them; the agent is their subreaper and ends them).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace railyard::worker {

// The root cause torchrun prints when a rank fails ("Root Cause (first observed failure):" ... "rank : 3 (local_rank:
// 1)", "exitcode : -9 (pid: 123)"): the local rank and how it ended, as an exit report carries it (a negative
// exitcode is a signal: exit_code -1, signal N). nullopt when the text holds no such summary.
struct TorchrunFailure {
  int local_rank = 0;
  int exit_code = 0;
  int signal = 0;
};
std::optional<TorchrunFailure> parse_torchrun_failure(const std::string& text);

// The line torchrun logs the moment it sees a rank fail, long before it exits (it first waits up to 300 s in its exit
// barrier for the other pods' torchruns): "failed (exitcode: -9) local_rank: 1 (pid: 413) of binary: ...".
inline constexpr const char* kTorchrunFailedMarker = "failed (exitcode: ";
std::optional<TorchrunFailure> parse_torchrun_failed_line(const std::string& line);

// The process table as the agent needs it: pid -> parent.
struct ProcessEntry {
  pid_t pid = 0;
  pid_t ppid = 0;
};
std::vector<ProcessEntry> list_processes();

// Every descendant of root (children, their children, ...), from a process table.
std::vector<pid_t> descendants(const std::vector<ProcessEntry>& table, pid_t root);

// The value of LOCAL_RANK in process pid's initial environment (/proc/<pid>/environ), -1 when unset or unreadable.
int local_rank_of(pid_t pid);

// The rank processes torchrun (root) started, by local rank (-1 where none is found): of root's descendants with
// LOCAL_RANK l, the topmost (a rank's own children, DataLoader workers, inherit its LOCAL_RANK). The agent gives
// torchrun no LOCAL_RANK, so torchrun itself never counts.
std::vector<pid_t> find_rank_processes(pid_t root, int local_ranks);

}  // namespace railyard::worker
