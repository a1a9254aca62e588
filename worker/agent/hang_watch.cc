#include "worker/agent/hang_watch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace railyard::worker {
namespace {

// What the watch keeps of a rank's CPU time: enough for any idle window it asks about.
constexpr double kCpuHistoryS = 30;

std::string secs(double v, int decimals = 1) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", decimals, v);
  return b;
}

}  // namespace

double HangWatch::median(std::deque<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double HangWatch::typical_step(int local_rank) const {
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= ranks_.size())
    return std::numeric_limits<double>::quiet_NaN();
  return median(ranks_[local_rank].intervals);
}

// How long the rank has used less than kIdleCpuShare of the time in CPU, up to now: the longest window ending now
// over which its CPU time grew that little (CPU time only grows, so the oldest sample that qualifies gives it). One
// clock tick (10 ms) of slack: a blocked process's helper threads wake now and then.
double HangWatch::idle_for(const Rank& r, double now) {
  if (r.cpu.empty()) return 0;
  const double cpu_now = r.cpu.back().second;
  for (const auto& [t, c] : r.cpu)
    if (t < now && cpu_now - c <= kIdleCpuShare * (now - t) + 0.011) return now - t;
  return 0;
}

std::optional<HangVerdict> HangWatch::observe(int local_rank, const RankSight& s) {
  if (local_rank < 0 || local_rank > 4095) return std::nullopt;
  if (static_cast<size_t>(local_rank) >= ranks_.size()) ranks_.resize(local_rank + 1);
  Rank& r = ranks_[local_rank];
  if (!s.running) {  // an exit is reported as such; a rank that is gone cannot hang
    r.stopped_since = -1;
    return std::nullopt;
  }
  if (s.cpu_seconds) {
    r.cpu.emplace_back(s.now, *s.cpu_seconds);
    while (!r.cpu.empty() && r.cpu.front().first < s.now - kCpuHistoryS) r.cpu.pop_front();
  }
  // Progress: every new write of the record is progress (a step, or a pause mark); a new step gives a step time
  // unless a pause came between.
  if (s.step) {
    if (s.paused) r.marks_pauses = true;
    if (s.written > r.last_written) {
      if (*s.step != r.last_step) {
        if (r.last_step >= 0 && *s.step > r.last_step && !r.pause_between && r.step_written > 0 &&
            s.written > r.step_written) {
          r.intervals.push_back((s.written - r.step_written) / static_cast<double>(*s.step - r.last_step));
          if (r.intervals.size() > kStepWindow) r.intervals.pop_front();
        }
        r.last_step = *s.step;
        r.step_written = s.written;
        r.pause_between = false;
      } else {
        r.pause_between = true;  // the same step written again: a pause mark
      }
      r.last_written = s.written;
      r.progress_at = std::max(r.progress_at, std::min(s.written, s.now));
    }
    r.paused = s.paused.value_or(false);
    if (r.paused) r.pause_between = true;
  }
  if (r.fired) return std::nullopt;
  std::optional<HangVerdict> v = stopped_rule(r, s);
  if (!v) v = stall_rule(r, s);
  if (v) r.fired = true;
  return v;
}

// Stopped: state T/t at every poll for stopped_s, and no CPU used since it was first seen so (a process stopped and
// continued between polls, as a debugger or a duty-cycling test does, used some).
std::optional<HangVerdict> HangWatch::stopped_rule(Rank& r, const RankSight& s) {
  if (!s.stopped.value_or(false)) {
    r.stopped_since = -1;
    return std::nullopt;
  }
  const double cpu = s.cpu_seconds.value_or(0);
  if (r.stopped_since < 0 || (s.cpu_seconds && cpu > r.stopped_cpu + 0.011)) {
    r.stopped_since = s.now;
    r.stopped_cpu = cpu;
  }
  if (!(p_.stopped_s > 0) || s.now - r.stopped_since < p_.stopped_s) return std::nullopt;
  return HangVerdict{"stopped",
                     "process stopped (state T: SIGSTOP, SIGTSTP or a debugger) for " + secs(s.now - r.stopped_since) +
                         "s (threshold " + secs(p_.stopped_s) + "s), seen by its agent",
                     r.stopped_since};
}

// Stall: a rank that marks its pauses, is not in one and has stepped since its last one, has step times to go by, and
// has neither stepped nor used CPU for the threshold. Not between a pause's end and the next step: the ranks' pauses
// end at different times (one rank's save or validation takes longer), and the ranks done first wait idle for the
// others in the first collective after it.
std::optional<HangVerdict> HangWatch::stall_rule(Rank& r, const RankSight& s) {
  if (!(p_.stall_floor_s > 0) || !r.marks_pauses || r.paused || r.pause_between || r.intervals.size() < 2)
    return std::nullopt;
  const double typical = median(r.intervals);
  const double threshold = std::max(p_.stall_factor * typical, p_.stall_floor_s);
  const double quiet = s.now - r.progress_at;
  if (quiet < threshold) return std::nullopt;
  const double idle = idle_for(r, s.now);
  if (idle < p_.idle_s) return std::nullopt;
  return HangVerdict{"stall",
                     "no step for " + secs(quiet) + "s after step " + std::to_string(r.last_step) + " (threshold " +
                         secs(threshold) + "s = max(" + secs(p_.stall_factor) + " x typical step " + secs(typical, 3) +
                         "s, " + secs(p_.stall_floor_s) + "s)) and no CPU used for " + secs(idle) +
                         "s: blocked, or waiting for a peer that is; seen by its agent",
                     r.progress_at};
}

}  // namespace railyard::worker
