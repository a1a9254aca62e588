// The agent's own hang detection (docs/rendezvous.md "Hangs the agent finds"): from what it sees of each local rank at
// every poll (its process state and CPU time in /proc, its progress record and when that was written), it finds a
// rank that is stopped, or that stopped stepping and sleeps, seconds before a scrape-and-evaluate loop could. A
// verdict becomes the rank's exit report with reason "hung" (common/rendezvous_protocol.h), which the operator turns
// into a restart as it does a crash. Pure logic (time is passed in): tests/unit/rendezvous/hang_watch_test.cc.
//
// How it tells a hang from what only looks like one:
//   - a validation pass, training samples or a synchronous checkpoint: the trainer marks them ("paused" in its
//     progress record); no stall is counted while a rank is paused, nor until it completes a step after the pause
//     (its peers' pauses may end later: it waits for them in the first collective);
//   - a slow first step (restore, warm-up, the first collective): no stall is counted before the rank has completed
//     steps in this generation whose times say what "typical" is;
//   - a slow step of a busy machine: a stall needs the rank's processes to have used (almost) no CPU meanwhile; a rank
//     that computes, however slowly, is not hung here (the monitor's rules still watch it);
//   - a program that marks no pauses (spec.program) gets only the stopped rule: its evaluation passes are unknown here.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace railyard::worker {

struct HangPolicy {
  // A rank whose process stays stopped (state T/t: SIGSTOP, SIGTSTP, a debugger) and uses no CPU this long is hung.
  // RAILYARD_HANG_STOPPED_SECONDS; 0 turns the rule off.
  double stopped_s = 1;
  // The stall threshold: max(stall_factor x typical step, stall_floor_s). RAILYARD_HANG_STALL_SECONDS sets the floor;
  // 0 turns the rule off. With the agent's 0.5 s poll a hang is found within max(3 s, 3 x the step time).
  double stall_floor_s = 2;
  double stall_factor = 2.5;
  // A stall also needs the rank's processes to have used less than kIdleCpuShare of this window's time in CPU.
  double idle_s = 1;
};

// A CPU-time share below which a process counts as idle (a blocked process's helper threads use a clock tick now and
// then; a computing one uses ~1.0).
inline constexpr double kIdleCpuShare = 0.05;
// The step intervals a typical step is the median of.
inline constexpr size_t kStepWindow = 16;

// One poll's view of one local rank.
struct RankSight {
  double now = 0;
  bool running = false;
  std::optional<bool> stopped;        // nullopt: /proc unreadable
  std::optional<double> cpu_seconds;  // the rank's process (tree): utime + stime, cumulative
  std::optional<int64_t> step;        // the progress record's step; nullopt: no record yet in this generation
  std::optional<bool> paused;         // the record's "paused"; nullopt: the rank does not mark its pauses
  double written = 0;                 // when the record was last written (its mtime, unix seconds)
};

struct HangVerdict {
  std::string rule;     // "stopped" or "stall"
  std::string message;  // the evidence, for the exit report and so the job's status
  double onset = 0;     // when the condition began (unix seconds)
};

class HangWatch {
 public:
  explicit HangWatch(HangPolicy p = {}) : p_(p) {}
  // A new generation: everything seen of the previous one's processes is forgotten.
  void start_generation() { ranks_.clear(); }
  // One poll of one local rank; a verdict at most once per rank and generation.
  std::optional<HangVerdict> observe(int local_rank, const RankSight& s);
  // The typical step of a local rank as the watch sees it (NaN while unknown): for tests and the log.
  double typical_step(int local_rank) const;

 private:
  struct Rank {
    bool fired = false;
    double stopped_since = -1;
    double stopped_cpu = -1;                    // the CPU time when it was first seen stopped
    std::deque<std::pair<double, double>> cpu;  // (time, cpu seconds), the last ~30 s
    int64_t last_step = -1;
    double last_written = 0;     // the record's mtime when last seen
    double step_written = 0;     // when the last step's record was written
    bool pause_between = false;  // a pause mark since the last step record: the next interval is not a step time
    bool paused = false;
    bool marks_pauses = false;
    double progress_at = 0;  // the last step record or pause mark
    std::deque<double> intervals;
  };
  std::optional<HangVerdict> stopped_rule(Rank& r, const RankSight& s);
  std::optional<HangVerdict> stall_rule(Rank& r, const RankSight& s);
  static double idle_for(const Rank& r, double now);
  static double median(std::deque<double> v);

  HangPolicy p_;
  std::vector<Rank> ranks_;
};

}  // namespace railyard::worker
