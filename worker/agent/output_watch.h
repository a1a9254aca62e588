// Copies the ranks' stdout and stderr to the agent's own, noting when each local rank last wrote: the only sign of
// life of a program that reports no progress (the monitor's silence rule, docs/monitor.md), and keeping the tail of
// each rank's streams: a failed rank's last words, which the exit report carries to the job's status (the pod and its
// log may be gone when someone looks). The ranks' output stays the pod's log, byte for byte and stream for stream; it
// passes through a pipe and one thread that does nothing else.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/log_tail.h"

namespace railyard::worker {

class OutputWatch {
 public:
  // tail_lines, tail_bytes: how much of each rank's streams last_words keeps (a torchrun process keeps more: its
  // failure summary, which names the failed rank, is about ten lines).
  explicit OutputWatch(int local_ranks, size_t tail_lines = LogTail::kDefaultLines,
                       size_t tail_bytes = LogTail::kDefaultBytes);
  ~OutputWatch();  // copies what is still buffered in the pipes, then stops
  OutputWatch(const OutputWatch&) = delete;
  OutputWatch& operator=(const OutputWatch&) = delete;

  struct ChildEnds {
    int out = -1, err = -1;  // write ends: dup2 them onto 1 and 2 in the child, close them in the parent
  };
  // Pipes for local rank l's next process; the read ends are watched from now on. Throws Error when pipe() fails.
  ChildEnds open(int local_rank);
  // When local rank l last wrote (unix seconds), 0 when never.
  double last_output(int local_rank) const;
  // The last lines local rank l's current process wrote to stderr (to stdout when it wrote nothing there), sanitized
  // and bounded (LogTail). Waits up to `wait` for the process's pipes to close first, so that what it wrote just
  // before it exited is in; a child that keeps them open only costs the wait.
  std::string last_words(int local_rank, std::chrono::milliseconds wait);
  // Lines of the current process of local rank l that contain `marker` (set_marker), since the last call: how the
  // agent hears at once what a process announces before it ends (torchrun's "failed (exitcode: ...)" line, written
  // up to its exit barrier's 300 s before it exits). At most 16 kept, each cut to 1 KiB.
  void set_marker(std::string marker);
  std::vector<std::string> take_marked(int local_rank);

 private:
  struct Source {
    int fd;
    int local_rank;
    int to;      // 1 or 2
    int serial;  // which process of the rank (open()'s count): only the current one's output is its tail
  };
  struct Tail {
    LogTail out, err;
    int serial = 0;
    int open = 0;                          // the current process's pipes not at EOF yet
    std::string partial_out, partial_err;  // the unfinished last line of each, while a marker is set
    std::vector<std::string> marked;       // lines with the marker, not taken yet
  };
  void loop();
  void tail(const Source& s, const char* data, size_t n, bool eof);
  std::vector<std::atomic<double>> last_;
  std::mutex tail_mu_;
  std::condition_variable tail_cv_;
  std::vector<Tail> tails_;  // guarded by tail_mu_
  std::string marker_;       // guarded by tail_mu_
  std::mutex mu_;
  std::vector<Source> sources_;  // guarded by mu_
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace railyard::worker
