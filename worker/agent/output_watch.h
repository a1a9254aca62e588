// Copies the ranks' stdout and stderr to the agent's own, noting when each local rank last wrote: the only sign of
// life of a program that reports no progress (the monitor's silence rule, docs/monitor.md). The ranks' output stays
// the pod's log, byte for byte and stream for stream; it passes through a pipe and one thread that does nothing else.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace railyard::worker {

class OutputWatch {
 public:
  explicit OutputWatch(int local_ranks);
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

 private:
  struct Source {
    int fd;
    int local_rank;
    int to;  // 1 or 2
  };
  void loop();
  std::vector<std::atomic<double>> last_;
  std::mutex mu_;
  std::vector<Source> sources_;  // guarded by mu_
  int wake_[2] = {-1, -1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace railyard::worker
