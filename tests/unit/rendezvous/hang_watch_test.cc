// The agent's hang watch (worker/agent/hang_watch.h) on synthetic polls: what it finds, how fast, and what it must not
// take for a hang (a pause, a slow first step, a busy slow step, a duty-cycled process, a program without marks).
#include "worker/agent/hang_watch.h"

#include <doctest/doctest.h>

#include <cmath>
#include <optional>

namespace railyard::worker {
namespace {

constexpr double kPoll = 0.5;

// One rank as the agent sees it: a trainer stepping every `step_s`, using one CPU while it computes.
struct FakeRank {
  double t = 1000;  // unix seconds
  double cpu = 0;
  int64_t step = 0;
  double written = 0;
  bool paused = false;
  bool marks = true;  // writes "paused" in its records (the built-in trainer with metrics)
  bool stopped = false;

  RankSight sight() const {
    RankSight s;
    s.now = t;
    s.running = true;
    s.stopped = stopped;
    s.cpu_seconds = cpu;
    if (step > 0) {
      s.step = step;
      s.written = written;
      if (marks) s.paused = paused;
    }
    return s;
  }
};

// Advances the rank by one poll: `steps` steps written during it (the last at the poll's end), `busy` share of CPU.
void advance(FakeRank& r, int steps, double busy) {
  r.t += kPoll;
  r.cpu += busy * kPoll;
  if (steps > 0) {
    r.step += steps;
    r.written = r.t - 0.01;
  }
}

// Polls until a verdict or `seconds` pass; returns when (relative to the start) and the verdict.
std::optional<std::pair<double, HangVerdict>> poll_for(HangWatch& w, FakeRank& r, double seconds, int steps,
                                                       double busy) {
  const double t0 = r.t;
  while (r.t - t0 < seconds) {
    advance(r, steps, busy);
    if (auto v = w.observe(0, r.sight())) return std::make_pair(r.t - t0, *v);
  }
  return std::nullopt;
}

void train(HangWatch& w, FakeRank& r, double seconds, int steps_per_poll = 5) {
  auto v = poll_for(w, r, seconds, steps_per_poll, 1.0);
  REQUIRE_FALSE(v.has_value());
}

}  // namespace

TEST_CASE("a stopped trainer is found within stopped_s plus a poll; a duty-cycled one never") {
  HangWatch w;
  w.start_generation();
  FakeRank r;
  train(w, r, 3);
  CHECK(w.typical_step(0) == doctest::Approx(0.1));
  r.stopped = true;
  const double stopped_at = r.t;
  auto v = poll_for(w, r, 10, 0, 0);
  REQUIRE(v);
  CHECK(v->second.rule == "stopped");
  CHECK(v->first <= 1.0 + kPoll + 1e-9);
  CHECK(v->second.onset == doctest::Approx(stopped_at + kPoll));
  CHECK(v->second.message.find("state T") != std::string::npos);
  // Once per generation.
  CHECK_FALSE(poll_for(w, r, 5, 0, 0));
  // A new generation starts afresh.
  w.start_generation();
  CHECK(poll_for(w, r, 3, 0, 0));

  // Stopped at every poll but running in between (SIGSTOP/SIGCONT duty cycle, a debugger stepping): it used CPU
  // since it was first seen stopped, so the window starts again.
  HangWatch d;
  d.start_generation();
  FakeRank q;
  q.stopped = true;
  for (int i = 0; i < 20; ++i) {
    advance(q, 1, 0.2);
    CHECK_FALSE(d.observe(0, q.sight()));
  }
}

TEST_CASE("a blocked trainer (no step, no CPU) is found within max(3 s, 3 x step); a computing one is not") {
  for (double step_s : {0.1, 0.5, 1.0, 2.0}) {
    CAPTURE(step_s);
    HangWatch w;
    w.start_generation();
    FakeRank r;
    // Steps of step_s: a step every 1/step_s polls' worth, written when it ends.
    double next = r.t + step_s;
    for (int i = 0; i < 40; ++i) {
      r.t += kPoll;
      r.cpu += kPoll;
      while (next <= r.t) {
        ++r.step;
        r.written = next;
        next += step_s;
      }
      REQUIRE_FALSE(w.observe(0, r.sight()));
    }
    CHECK(w.typical_step(0) == doctest::Approx(step_s).epsilon(0.05));
    const double last = r.written;
    auto v = poll_for(w, r, 30, 0, 0.0);
    REQUIRE(v);
    CHECK(v->second.rule == "stall");
    CHECK(v->second.onset == doctest::Approx(last));
    const double found_after = r.t - last;
    CHECK(found_after <= std::max(3.0, 3 * step_s) + 1e-9);
    CHECK(found_after >= std::max(2.0, 2.5 * step_s) - 1e-9);  // never before the threshold
  }
  // The same silence while the process computes (a slow step on a busy machine): not this watch's to call.
  HangWatch w;
  w.start_generation();
  FakeRank r;
  train(w, r, 3);
  CHECK_FALSE(poll_for(w, r, 20, 0, 0.6));
}

TEST_CASE("pauses, the first steps and programs without marks are not stalls") {
  SUBCASE("a long validation pass or synchronous checkpoint, idle or not, and the steps after it") {
    HangWatch w;
    w.start_generation();
    FakeRank r;
    train(w, r, 3);
    r.paused = true;
    r.written = r.t;  // the pause mark rewrites the record
    CHECK_FALSE(poll_for(w, r, 20, 0, 0.0));
    r.paused = false;
    r.written = r.t;  // its end: progress
    CHECK_FALSE(w.observe(0, r.sight()));
    // Idle after its own pause ended, before a step: a peer's pause may last longer (it waits in the first collective).
    CHECK_FALSE(poll_for(w, r, 10, 0, 0.0));
    train(w, r, 1.5, 1);  // the first steps after it are measured from its end, and not as step times
    CHECK(w.typical_step(0) == doctest::Approx(0.1));
    // A hang right after still counts.
    CHECK(poll_for(w, r, 5, 0, 0.0));
  }
  SUBCASE("a slow first step: no step times yet") {
    HangWatch w;
    w.start_generation();
    FakeRank r;
    advance(r, 1, 1.0);  // step 1 written
    CHECK_FALSE(w.observe(0, r.sight()));
    CHECK_FALSE(poll_for(w, r, 60, 0, 0.0));  // 60 s waiting for step 2 (restore, a first collective): not this
    CHECK(std::isnan(w.typical_step(0)));
  }
  SUBCASE("a rank that does not mark its pauses (a program) gets the stopped rule only") {
    HangWatch w;
    w.start_generation();
    FakeRank r;
    r.marks = false;
    train(w, r, 3);
    CHECK_FALSE(poll_for(w, r, 30, 0, 0.0));
    r.stopped = true;
    auto v = poll_for(w, r, 5, 0, 0.0);
    REQUIRE(v);
    CHECK(v->second.rule == "stopped");
  }
  SUBCASE("rules off") {
    HangPolicy off;
    off.stopped_s = 0;
    off.stall_floor_s = 0;
    HangWatch w(off);
    w.start_generation();
    FakeRank r;
    train(w, r, 3);
    r.stopped = true;
    CHECK_FALSE(poll_for(w, r, 30, 0, 0.0));
  }
  SUBCASE("an exited rank, and hostile local ranks") {
    HangWatch w;
    w.start_generation();
    RankSight gone;
    gone.now = 1;
    gone.running = false;
    gone.stopped = true;
    CHECK_FALSE(w.observe(0, gone));
    CHECK_FALSE(w.observe(-1, gone));
    CHECK_FALSE(w.observe(1 << 30, gone));
    CHECK(std::isnan(w.typical_step(7)));
  }
}

}  // namespace railyard::worker
