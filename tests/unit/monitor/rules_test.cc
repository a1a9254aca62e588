// The health rules on synthetic series: each fires when it should and not when it should not, debounces, fires
// once per generation and again in the next one.
#include "monitor/rules.h"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string_view>
#include <vector>

using namespace railyard;
using namespace railyard::monitor;

namespace {

const JobKey kJob{"ns", "job"};

// A healthy rank at `step`, last step at `ts`, step time `dur`.
RankObs rank(int r, double step, double ts, double dur = 0.5, const std::string& node = "") {
  RankObs o;
  o.rank = r;
  o.node = node.empty() ? "node-" + std::to_string(r) : node;
  o.step = step;
  o.last_step_ts = ts;
  // The step time as every source serves it, a histogram (common/metrics/names.h): one observation of `dur`
  // (a first sight reads _sum/_count as the mean so far; a later unchanged count keeps it).
  if (dur > 0) {
    o.duration_sum = dur;
    o.duration_count = 1;
  }
  o.loss = 3.0;
  o.loss_present = true;
  return o;
}

Policy fast_policy() {
  Policy p;
  p.stall_factor = 3;
  p.stall_floor_s = 10;
  p.unreachable_s = 5;
  p.straggler_window_s = 6;
  return p;
}

// One evaluation a second (t = 0, 1, ...) of steps 1 to 39 of ranks 0, 1 and 2, `obs(r, i, t)` rank r's observation
// at step i, until a verdict; none may come by step `quiet_through`.
std::optional<Verdict> first_verdict(const std::function<RankObs(int r, int i, double t)>& obs, int quiet_through) {
  Evaluator ev;
  const Policy p = fast_policy();
  double t = 0;
  std::optional<Verdict> v;
  for (int i = 1; i < 40 && !v; ++i, t += 1) {
    std::map<int, RankObs> m;
    for (int r = 0; r < 3; ++r) m[r] = obs(r, i, t);
    v = ev.evaluate(kJob, 0, m, p, t);
    if (i <= quiet_through) CHECK_FALSE(v);
  }
  return v;
}

}  // namespace

TEST_CASE("stall: fires after max(k x step time, floor), not before, blaming the unreachable rank") {
  Evaluator ev;
  Policy p = fast_policy();
  p.unreachable_s = 30;  // the default: a hang is named a stall before the down rank counts as unreachable
  double t = 1000;
  // Two ranks making progress, one step every 0.5 s, evaluated every second.
  for (int i = 0; i < 20; ++i, t += 1)
    CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, i * 2, t)}, {1, rank(1, i * 2, t)}}, p, t));
  // Step 38 was the last one (at t-1). Rank 1 freezes: its target goes down, rank 0 waits in a collective.
  double frozen_at = t - 1;
  std::optional<Verdict> v;
  for (; t < frozen_at + 30 && !v; t += 1) {
    RankObs r1 = rank(1, 38, frozen_at);
    r1.reachable = false;
    v = ev.evaluate(kJob, 0, {{0, rank(0, 38, frozen_at)}, {1, r1}}, p, t);
    if (!v) CHECK(t - frozen_at <= 10.0);
  }
  REQUIRE(v);
  CHECK(v->rule == "stall");
  CHECK(v->reason == "Hang");
  CHECK(v->rank == 1);
  CHECK(v->node == "node-1");
  CHECK(v->node_suspect);
  CHECK(v->at - frozen_at > 10.0);
  CHECK(v->at - frozen_at <= 11.0);
  CHECK(v->evidence.find("no step progress") != std::string::npos);
  CHECK(v->evidence.find("rank 1 unreachable") != std::string::npos);
  CHECK(v->onset == doctest::Approx(frozen_at));
}

TEST_CASE("stall: a slow job's threshold scales with its step time and is capped by hangTimeoutSeconds") {
  Evaluator ev;
  Policy p = fast_policy();
  p.hang_timeout_s = 100;
  double t = 0;
  CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, 1, t, 20)}}, p, t));
  // 3 x 20 s = 60 s: quiet at 50 s, fires after 60 s.
  CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, 1, 0, 20)}}, p, 50));
  auto v = ev.evaluate(kJob, 0, {{0, rank(0, 1, 0, 20)}}, p, 61);
  REQUIRE(v);
  CHECK(v->rank == -1);  // a single rank stopped at the same step as everyone: no one to blame
  CHECK_FALSE(v->node_suspect);

  Evaluator ev2;
  CHECK_FALSE(ev2.evaluate(kJob, 0, {{0, rank(0, 1, 0, 60)}}, p, 0));
  CHECK_FALSE(ev2.evaluate(kJob, 0, {{0, rank(0, 1, 0, 60)}}, p, 99));  // 3 x 60 = 180 > cap 100
  CHECK(ev2.evaluate(kJob, 0, {{0, rank(0, 1, 0, 60)}}, p, 101));
}

TEST_CASE("stall: progress keeps it quiet; the same verdict never fires twice per generation, again in the next") {
  Evaluator ev;
  Policy p = fast_policy();
  for (int i = 0; i < 60; ++i) CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, i, i)}}, p, i));
  auto v = ev.evaluate(kJob, 0, {{0, rank(0, 59, 59)}}, p, 75);
  REQUIRE(v);
  CHECK(v->generation == 0);
  CHECK(ev.fired(kJob, 0));
  for (double t = 76; t < 200; t += 1) CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, 59, 59)}}, p, t));
  // Generation 1: fresh state, fires again when it hangs again.
  CHECK_FALSE(ev.fired(kJob, 1));
  CHECK_FALSE(ev.evaluate(kJob, 1, {{0, rank(0, 60, 200)}}, p, 200));
  CHECK_FALSE(ev.evaluate(kJob, 1, {{0, rank(0, 61, 201)}}, p, 201));
  auto v2 = ev.evaluate(kJob, 1, {{0, rank(0, 61, 201)}}, p, 212);
  REQUIRE(v2);
  CHECK(v2->generation == 1);
}

TEST_CASE("mark_fired (annotation read back after a monitor restart) suppresses the generation") {
  Evaluator ev;
  Policy p = fast_policy();
  ev.mark_fired(kJob, 4);
  CHECK(ev.fired(kJob, 4));
  for (double t = 0; t < 100; t += 1) CHECK_FALSE(ev.evaluate(kJob, 4, {{0, rank(0, 1, 0)}}, p, t));
  CHECK(ev.evaluate(kJob, 5, {{0, rank(0, 1, 0)}}, p, 100) == std::nullopt);
  CHECK(ev.evaluate(kJob, 5, {{0, rank(0, 1, 0)}}, p, 111));
}

TEST_CASE("series of another generation are ignored") {
  Evaluator ev;
  Policy p = fast_policy();
  RankObs old = rank(0, 5, 0);
  old.generation = "0";
  old.loss = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(ev.evaluate(kJob, 1, {{0, old}}, p, 0));
  CHECK_FALSE(ev.evaluate(kJob, 1, {{0, old}}, p, 50));
}

// A program's rank that reports no steps: only its output clock (the agent's series).
RankObs quiet_rank(int r, double last_output) {
  RankObs o;
  o.rank = r;
  o.node = "node-" + std::to_string(r);
  o.last_output_ts = last_output;
  return o;
}

TEST_CASE("silence: a program without steps is hung after hangTimeoutSeconds with no output from any rank") {
  Evaluator ev;
  Policy p = fast_policy();
  p.hang_timeout_s = 20;
  double t = 1000;
  // Rank 0 prints every 5 s, rank 1 never (it started at 1000): the job is alive as long as one rank writes.
  double out0 = 1000;
  for (; t < 1060; t += 1) {
    if (static_cast<int>(t) % 5 == 0) out0 = t;
    CHECK_FALSE(ev.evaluate(kJob, 3, {{0, quiet_rank(0, out0)}, {1, quiet_rank(1, 1000)}}, p, t));
  }
  // Both quiet from 1055 on (rank 0's last line): the verdict comes after 20 s, not before.
  std::optional<Verdict> v;
  for (; t < 1100 && !v; t += 1) {
    v = ev.evaluate(kJob, 3, {{0, quiet_rank(0, out0)}, {1, quiet_rank(1, 1000)}}, p, t);
    if (!v) CHECK(t - out0 <= 20.0);
  }
  REQUIRE(v);
  CHECK(v->rule == "silence");
  CHECK(v->reason == "Hang");
  CHECK(v->rank == -1);  // no rank to blame: every one is alive and quiet
  CHECK(v->generation == 3);
  CHECK(v->onset == out0);
  CHECK(v->at - out0 <= 21.0);
  CHECK(v->evidence.find("no output from any rank") != std::string::npos);
  CHECK_FALSE(ev.evaluate(kJob, 3, {{0, quiet_rank(0, out0)}}, p, t + 50));  // once per generation
}

TEST_CASE("silence: steps, not output, count once a rank reports them; no output series keeps the old rule") {
  Evaluator ev;
  Policy p = fast_policy();
  p.hang_timeout_s = 300;
  double t = 1000;
  // Steps stop at 1010 while the program keeps printing: the stall rule fires (threshold max(3 x 0.5, 10) s).
  std::optional<Verdict> v;
  for (; t < 1060 && !v; t += 1) {
    RankObs r = rank(0, t < 1010 ? (t - 1000) * 2 : 20, std::min(t, 1010.0));
    r.last_output_ts = t;
    v = ev.evaluate(kJob, 1, {{0, r}}, p, t);
  }
  REQUIRE(v);
  CHECK(v->rule == "stall");
  CHECK(t - 1010 <= 13);
  // A job with neither steps nor output series (a trainer before its first step): hangTimeoutSeconds from first
  // sight, as before.
  Evaluator ev2;
  RankObs none;
  none.rank = 0;
  CHECK_FALSE(ev2.evaluate(kJob, 1, {{0, none}}, p, 2000));
  CHECK_FALSE(ev2.evaluate(kJob, 1, {{0, none}}, p, 2299));
  auto w = ev2.evaluate(kJob, 1, {{0, none}}, p, 2301);
  REQUIRE(w);
  CHECK(w->rule == "stall");
}

TEST_CASE("unreachable: a rank down longer than the threshold and for N evaluations, but not a blip") {
  Evaluator ev;
  Policy p = fast_policy();
  p.stall_floor_s = 1000;  // keep the stall rule out of the way
  p.hang_timeout_s = 1000;
  double t = 0;
  for (int i = 0; i < 5; ++i, t += 1) CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, i, t)}, {1, rank(1, i, t)}}, p, t));
  // A single failed scrape, then back: nothing.
  RankObs down = rank(1, 5, t);
  down.reachable = false;
  CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, 5, t)}, {1, down}}, p, t));
  t += 1;
  CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, 6, t)}, {1, rank(1, 6, t)}}, p, t));
  // Now rank 1's series vanish entirely (pod gone) while rank 0 keeps stepping.
  std::optional<Verdict> v;
  double since = t + 1;
  for (int i = 7; i < 30 && !v; ++i) {
    t += 1;
    v = ev.evaluate(kJob, 0, {{0, rank(0, i, t)}}, p, t);
  }
  REQUIRE(v);
  CHECK(v->rule == "unreachable");
  CHECK(v->rank == 1);
  CHECK(v->node == "node-1");
  CHECK(v->at - since >= 5);
  CHECK(v->at - since <= 6);
  CHECK(v->evidence.find("series missing") != std::string::npos);
}

TEST_CASE("straggler: above factor x median of the others for the window; a short slowdown is not") {
  Evaluator ev;
  Policy p = fast_policy();
  double t = 0;
  // Each evaluation sees one more step per rank: the histograms' _sum grows by that step's time, _count by one.
  std::map<int, std::pair<double, double>> hist;  // rank -> (sum, count)
  auto world = [&](double slow_dur, int step) {
    std::map<int, RankObs> m;
    for (const auto& [r, dur] : std::map<int, double>{{0, 0.5}, {1, 0.5}, {2, slow_dur}, {3, 0.6}}) {
      RankObs o = rank(r, step, t, 0);
      auto& [sum, count] = hist[r];
      sum += dur;
      count += 1;
      o.duration_sum = sum;
      o.duration_count = count;
      m[r] = o;
    }
    return m;
  };
  for (int i = 0; i < 5; ++i, t += 1) CHECK_FALSE(ev.evaluate(kJob, 0, world(0.55, i), p, t));
  // 3 s of 1.9x: below the factor 2.0 -> nothing, however long.
  for (int i = 5; i < 20; ++i, t += 1) CHECK_FALSE(ev.evaluate(kJob, 0, world(0.95, i), p, t));
  // 4 s of 3x: shorter than the 6 s window -> nothing.
  for (int i = 20; i < 24; ++i, t += 1) CHECK_FALSE(ev.evaluate(kJob, 0, world(1.5, i), p, t));
  CHECK_FALSE(ev.evaluate(kJob, 0, world(0.5, 24), p, t));
  t += 1;
  std::optional<Verdict> v;
  double start = t;
  for (int i = 25; i < 60 && !v; ++i, t += 1) v = ev.evaluate(kJob, 0, world(1.5, i), p, t);
  REQUIRE(v);
  CHECK(v->rule == "straggler");
  CHECK(v->rank == 2);
  CHECK(v->node_suspect);
  CHECK(v->at - start >= 6);
  CHECK(v->at - start <= 7);
}

TEST_CASE("straggler: step time from the histogram's _sum/_count deltas") {
  const std::optional<Verdict> v = first_verdict(
      [](int r, int i, double t) {
        RankObs o = rank(r, i, t, 0);
        // Ranks 0,1: 0.5 s per step always. Rank 2: 0.5 s for 10 steps, then 2 s per step.
        o.duration_count = i;
        o.duration_sum = r < 2 ? 0.5 * i : (i <= 10 ? 0.5 * i : 5 + 2.0 * (i - 10));
        return o;
      },
      /*quiet_through=*/10);
  REQUIRE(v);
  CHECK(v->rule == "straggler");
  CHECK(v->rank == 2);
  CHECK(v->evidence.find("2.000s") != std::string::npos);
}

TEST_CASE("straggler: in a synchronous job the compute time per step tells the straggler from those who wait") {
  // Data parallel in lock step: every rank's step takes 1.0 s of wall time. Ranks 0 and 1 compute 0.2 s of it and
  // wait for rank 2, which computes 0.9 s from step 6 on. Wall time alone names nobody; the compute counters name
  // rank 2.
  const std::optional<Verdict> v = first_verdict(
      [](int r, int i, double t) {
        RankObs o = rank(r, i, t, 1.0);
        o.steps_total = i;
        o.compute_total = (r == 2 && i > 5 ? 0.9 : 0.2) * i;
        return o;
      },
      /*quiet_through=*/6);
  REQUIRE(v);
  CHECK(v->rule == "straggler");
  CHECK(v->rank == 2);
  CHECK(v->node_suspect);
  CHECK(v->evidence.find("compute time per step") != std::string::npos);

  // Without the compute counters the same job shows no straggler (equal wall times): the rule falls back to them.
  Evaluator plain;
  const Policy p = fast_policy();
  double t = 0;
  for (int i = 1; i < 40; ++i, t += 1)
    CHECK_FALSE(
        plain.evaluate(kJob, 0, {{0, rank(0, i, t, 1.0)}, {1, rank(1, i, t, 1.0)}, {2, rank(2, i, t, 1.0)}}, p, t));
}

TEST_CASE("straggler: compute time per step is a rate over a few seconds, not one noisy evaluation") {
  // Rank 1 computes 0.9 s and 0.3 s per step in turn (a slow node whose stalls land in some steps only): one
  // evaluation alone is sometimes below 2 x rank 0's 0.2 s, which would restart the window every other second; over
  // the horizon it is 0.6 s, 3x.
  double c1 = 0;
  const std::optional<Verdict> v = first_verdict(
      [&](int r, int i, double t) {
        RankObs o = rank(r, i, t, 1.0);
        o.steps_total = i;
        if (r == 1) c1 += i % 2 ? 0.9 : 0.3;
        o.compute_total = r == 1 ? c1 : 0.2 * i;
        return o;
      },
      /*quiet_through=*/0);
  REQUIRE(v);
  CHECK(v->rule == "straggler");
  CHECK(v->rank == 1);
  CHECK(v->at <= 12);  // the 6 s window plus the first samples of the horizon
}

TEST_CASE("nonfinite: a NaN or Inf loss, or a non-zero counter, fires at once") {
  Policy p = fast_policy();
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Evaluator ev;
    CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, 1, 0)}, {1, rank(1, 1, 0)}}, p, 0));
    RankObs r1 = rank(1, 2, 1);
    r1.loss = bad;
    auto v = ev.evaluate(kJob, 0, {{0, rank(0, 2, 1)}, {1, r1}}, p, 1);
    REQUIRE(v);
    CHECK(v->rule == "nonfinite");
    CHECK(v->reason == "NonFiniteLoss");
    CHECK(v->rank == 1);
    CHECK_FALSE(v->node_suspect);
  }
  Evaluator ev;
  RankObs r0 = rank(0, 3, 0);
  r0.nonfinite_total = 0;
  CHECK_FALSE(ev.evaluate(kJob, 0, {{0, r0}}, p, 0));
  r0.nonfinite_total = 2;
  auto v = ev.evaluate(kJob, 0, {{0, r0}}, p, 1);
  REQUIRE(v);
  CHECK(v->evidence.find("railyard_worker_nonfinite_total=2") != std::string::npos);
  // A rank without a loss series at all is not a NaN.
  Evaluator ev2;
  RankObs no_loss = rank(0, 1, 0);
  no_loss.loss_present = false;
  no_loss.loss = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(ev2.evaluate(kJob, 0, {{0, no_loss}}, p, 0));
}

TEST_CASE("loss spike: z-score and ratio over the window, on consecutive steps; noise and a single blip do not fire") {
  Evaluator ev;
  Policy p = fast_policy();
  double t = 0;
  auto at = [&](int step, double loss) {
    RankObs o = rank(0, step, t);
    o.loss = loss;
    t += 1;
    return ev.evaluate(kJob, 0, {{0, o}}, p, t - 1);
  };
  int s = 0;
  for (; s < 30; ++s) CHECK_FALSE(at(s, 3.0 - 0.01 * s + 0.05 * ((s % 3) - 1)));  // noisy, slowly decreasing
  CHECK_FALSE(at(s++, 9.0));                                                      // one blip
  CHECK_FALSE(at(s++, 2.7));
  CHECK_FALSE(at(s++, 9.0));  // first of a run
  auto v = at(s++, 9.5);
  REQUIRE(v);
  CHECK(v->rule == "loss_spike");
  CHECK(v->reason == "LossSpike");
  CHECK(v->evidence.find("consecutive") != std::string::npos);
}

TEST_CASE("checkpoint too old, only when the job checkpoints") {
  Policy p = fast_policy();
  p.checkpoint_interval_steps = 10;
  p.checkpoint_age_floor_s = 60;  // max(3 x 10 x 0.5 s, 60 s) = 60 s
  p.stall_floor_s = 1e9;
  p.hang_timeout_s = 1e9;
  Evaluator ev;
  std::optional<Verdict> v;
  double t = 0;
  for (int i = 0; i < 200 && !v; ++i, t += 1) {
    RankObs o = rank(0, i * 2, t);
    o.checkpoint_ts = 5;  // one checkpoint at t=5, then never again
    v = ev.evaluate(kJob, 0, {{0, o}}, p, t);
    if (t <= 65) CHECK_FALSE(v);
  }
  REQUIRE(v);
  CHECK(v->rule == "checkpoint_age");
  CHECK_FALSE(v->restart);  // a warning: a restart would restore that old checkpoint
  CHECK(t - 1 <= 67);
  // Once per episode, and the generation's restart verdicts still fire: the job then freezes, and the stall fires.
  CHECK_FALSE(ev.fired(kJob, 0));
  RankObs o = rank(0, 400, t);
  o.checkpoint_ts = 5;
  CHECK_FALSE(ev.evaluate(kJob, 0, {{0, o}}, p, t + 1));
  p.stall_floor_s = 10;
  p.hang_timeout_s = 300;
  std::optional<Verdict> stall;
  for (double u = t + 2; u < t + 40 && !stall; u += 1) stall = ev.evaluate(kJob, 0, {{0, o}}, p, u);
  REQUIRE(stall);
  CHECK(stall->rule == "stall");
  CHECK(stall->restart);
  Policy off = p;
  off.checkpoint_interval_steps = 0;
  Evaluator ev2;
  for (int i = 0; i < 200; ++i) CHECK_FALSE(ev2.evaluate(kJob, 0, {{0, rank(0, i, i)}}, off, i));
}

TEST_CASE("stall: a paused rank (validation, samples, a synchronous checkpoint) waits hangTimeoutSeconds") {
  Evaluator ev;
  Policy p = fast_policy();  // threshold max(3 x 0.5 s, 10 s) = 10 s while stepping
  p.hang_timeout_s = 60;
  double t = 1000;
  for (int i = 0; i < 10; ++i, t += 1)
    CHECK_FALSE(ev.evaluate(kJob, 0, {{0, rank(0, i * 2, t)}, {1, rank(1, i * 2, t)}}, p, t));
  // Rank 0 validates for 40 s after step 18; rank 1 waits for it in the next collective (not paused itself).
  const double last = t - 1;
  RankObs r0 = rank(0, 18, last), r1 = rank(1, 18, last);
  r0.paused = true;
  for (; t < last + 40; t += 1) CHECK_FALSE(ev.evaluate(kJob, 0, {{0, r0}, {1, r1}}, p, t));
  // The pass ends at last + 40 and the next step takes a while: the end of the pause counts as progress.
  r0.paused = false;
  r0.pause_end_ts = last + 40;
  for (; t < last + 48; t += 1) CHECK_FALSE(ev.evaluate(kJob, 0, {{0, r0}, {1, r1}}, p, t));
  // A pause that never ends is a hang after hangTimeoutSeconds.
  r0.paused = true;
  std::optional<Verdict> v;
  for (; t < last + 200 && !v; t += 1) v = ev.evaluate(kJob, 0, {{0, r0}, {1, r1}}, p, t);
  REQUIRE(v);
  CHECK(v->rule == "stall");
  CHECK(t - 1 - (last + 40) > 60);  // measured from the pause's end
  CHECK(t - 1 - (last + 40) <= 62);
  CHECK(v->evidence.find("rank 0 is paused") != std::string::npos);
}

TEST_CASE("policy from the TrainingJob spec overrides the defaults, read as the operator reads it") {
  // A whole valid job (common/job_spec.h's parse_job accepts it), with failurePolicy and checkpoint set.
  const auto program_job = [](const nlohmann::json& extra) {
    nlohmann::json job = nlohmann::json::parse(R"({"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"replicas": 2, "image": "worker:1", "program": {"command": ["python3", "train.py"]}}})");
    job["spec"].merge_patch(extra);
    return job;
  };
  Policy p = policy_for_job(program_job(nlohmann::json::parse(R"({"failurePolicy": {"hangTimeoutSeconds": 42,
      "stragglerFactor": 1.5, "excludeFailedNodes": false}, "checkpoint": {"path": "/ckpt", "intervalSteps": 7}})")),
                            Policy{});
  CHECK(p.hang_timeout_s == 42);
  CHECK(p.straggler_factor == 1.5);
  CHECK_FALSE(p.exclude_failed_nodes);
  CHECK(p.checkpoint_interval_steps == 7);
  // spec.checkpoint without intervalSteps: the CRD's default interval.
  CHECK(policy_for_job(program_job({{"checkpoint", {{"path", "/ckpt"}}}}), Policy{}).checkpoint_interval_steps == 100);
  // Nothing given: the defaults, and no checkpoint rule.
  Policy d = policy_for_job(program_job(nlohmann::json::object()), Policy{});
  CHECK(d.hang_timeout_s == 300);
  CHECK(d.checkpoint_interval_steps == 0);
  // A spec the operator refuses (here: a hang timeout of 0, below the CRD's minimum) keeps every default: its job is
  // Invalid and runs no pods.
  Policy bad = policy_for_job(program_job(nlohmann::json::parse(R"({"failurePolicy": {"hangTimeoutSeconds": 0,
      "stragglerFactor": 3}})")),
                              Policy{});
  CHECK(bad.hang_timeout_s == 300);
  CHECK(bad.straggler_factor == 2.0);
}

TEST_CASE("group_samples: by namespace/job/rank; foreign series skipped") {
  std::vector<Sample> s = {
      {"railyard_worker_step", {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "1"}, {"node", "n1"}}, 7},
      {"railyard_worker_loss", {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "1"}}, 2.5},
      {"railyard_worker_last_output_timestamp_seconds",
       {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "1"}},
       1234.5},
      {"up", {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "0"}}, 0},
      {"railyard_worker_step", {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "x"}}, 1},
      {"railyard_worker_step", {{"trainingjob", "j"}, {"rank", "2"}}, 1},
      {"process_cpu_seconds_total", {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "3"}}, 1},
      {"railyard_worker_paused", {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "1"}}, 1},
      {"railyard_worker_pause_end_timestamp_seconds", {{"namespace", "a"}, {"trainingjob", "j"}, {"rank", "1"}}, 99},
      // `job` is Prometheus' scrape-job label, not the TrainingJob: a series named only by it is not a worker's.
      {"railyard_worker_step", {{"namespace", "a"}, {"job", "railyard-workers"}, {"rank", "4"}}, 1},
  };
  auto g = group_samples(s);
  REQUIRE(g.size() == 1);
  auto& ranks = g[{"a", "j"}];
  CHECK(ranks.size() == 3);  // 0, 1 and 3 (3 carries no worker series: all NaN)
  CHECK(ranks[1].step == 7);
  CHECK(ranks[1].loss == 2.5);
  CHECK(ranks[1].loss_present);
  CHECK(ranks[1].node == "n1");
  CHECK(ranks[1].last_output_ts == 1234.5);
  CHECK(ranks[1].paused);
  CHECK(ranks[1].pause_end_ts == 99);
  CHECK_FALSE(ranks[0].paused);
  CHECK(std::isnan(ranks[0].last_output_ts));
  CHECK_FALSE(ranks[0].reachable);
  CHECK(ranks[1].reachable);
}

TEST_CASE("restart-request annotation: format, parse back, hand-written values") {
  Verdict v;
  v.rule = "stall";
  v.reason = "Hang";
  v.rank = 3;
  v.node = "gpu-2";
  v.evidence = "no step progress for 12.0s \"quoted\"";
  v.generation = 5;
  v.onset = 1795316400.4;  // 2026-11-22T03:00:00Z
  auto req = request_from_verdict(v, "2026-11-22T03:00:00Z");
  std::string s = format_restart_request(req);
  auto j = nlohmann::json::parse(s);
  CHECK(j["reason"] == "Hang");
  CHECK(j["rank"] == 3);
  CHECK(j["node"] == "gpu-2");
  CHECK(j["generation"] == 5);
  CHECK(j["detector"] == "monitor");
  CHECK(j["time"] == "2026-11-22T03:00:00Z");
  CHECK(j["evidence"] == v.evidence);
  CHECK(j["onset"] == "2026-11-22T03:00:00Z");
  auto back = parse_restart_request(s);
  REQUIRE(back);
  CHECK(back->generation == 5);
  CHECK(back->rank == 3);
  CHECK(back->evidence == v.evidence);
  CHECK(back->onset == "2026-11-22T03:00:00Z");
  CHECK_FALSE(parse_restart_request("now"));
  // Hand-written objects parse, but name no generation: the monitor does not take them for its own request.
  REQUIRE(parse_restart_request("{\"reason\":\"x\"}"));
  CHECK_FALSE(parse_restart_request("{\"reason\":\"x\"}")->generation);
  CHECK_FALSE(parse_restart_request("{\"generation\":\"1\"}")->generation);
}

TEST_CASE("stopped: a rank whose process stays stopped for stopped_s is a Hang of that rank, not of its node") {
  Evaluator ev;
  Policy p = fast_policy();
  p.stopped_s = 2;
  const double t0 = 1000;
  auto world = [&](double t, double stopped_since_1) {
    std::map<int, RankObs> m{{0, rank(0, 10, t - 5)}, {1, rank(1, 10, t - 5)}};
    m[0].stopped_since = 0;
    m[1].stopped_since = stopped_since_1;
    return m;
  };
  // A brief stop (a profiler's sample, a debugger stepping) that ends before stopped_s: nothing.
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0, t0), p, t0));
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0 + 1.5, t0), p, t0 + 1.5));
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0 + 2.5, 0), p, t0 + 2.5));
  // Stopped at t0 + 3 and still at t0 + 5: the verdict names rank 1, the onset is when it was first seen stopped.
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0 + 3, t0 + 3), p, t0 + 3));
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0 + 4.9, t0 + 3), p, t0 + 4.9));
  auto v = ev.evaluate(kJob, 0, world(t0 + 5, t0 + 3), p, t0 + 5);
  REQUIRE(v);
  CHECK(v->rule == "stopped");
  CHECK(v->reason == "Hang");
  CHECK(v->rank == 1);
  CHECK(v->node == "node-1");
  CHECK_FALSE(v->node_suspect);
  CHECK(v->onset == doctest::Approx(t0 + 3));
  CHECK(v->evidence.find("rank 1's process stopped") != std::string::npos);
  // Once per generation.
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0 + 6, t0 + 3), p, t0 + 6));

  // Off with stopped_s 0: the same world fires nothing before the stall threshold.
  Evaluator off;
  Policy p0 = fast_policy();
  p0.stopped_s = 0;
  CHECK_FALSE(off.evaluate(kJob, 0, world(t0, t0), p0, t0));
  CHECK_FALSE(off.evaluate(kJob, 0, world(t0 + 5, t0), p0, t0 + 5));
}

TEST_CASE("stopped: group_samples reads the agent's stopped-since series") {
  std::vector<Sample> samples;
  Sample s;
  s.name = "railyard_worker_process_stopped_since_timestamp_seconds";
  s.labels = {{"namespace", "ns"}, {"trainingjob", "job"}, {"rank", "1"}};
  s.value = 1234.5;
  samples.push_back(s);
  auto g = group_samples(samples);
  CHECK(g[kJob][1].stopped_since == 1234.5);
}

TEST_CASE("idle: every rank using no CPU for idle_s, no step meanwhile, is a Hang naming the rank idle first") {
  Policy p = fast_policy();
  p.idle_s = 5;
  p.world_size = 2;
  p.hang_timeout_s = 300;
  p.stall_floor_s = 1000;  // the stall rule stays out of the way: this is the idle rule's case
  p.stall_factor = 1000;
  const double t0 = 1000;
  // Program ranks without a progress file: no step series; idle since (0 = computing).
  auto world = [&](double idle0, double idle1) {
    RankObs a, b;
    a.rank = 0, a.node = "node-0", a.cpu_idle_since = idle0;
    b.rank = 1, b.node = "node-1", b.cpu_idle_since = idle1;
    return std::map<int, RankObs>{{0, a}, {1, b}};
  };
  Evaluator ev;
  CHECK_FALSE(ev.evaluate(kJob, 0, world(0, 0), p, t0));  // both compute
  // Rank 1 stuck at t0 + 1; rank 0 computes on until its next collective at t0 + 3.
  CHECK_FALSE(ev.evaluate(kJob, 0, world(0, t0 + 1), p, t0 + 2));
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0 + 3, t0 + 1), p, t0 + 7.9));  // the last went idle 4.9 s ago
  auto v = ev.evaluate(kJob, 0, world(t0 + 3, t0 + 1), p, t0 + 8);
  REQUIRE(v);
  CHECK(v->rule == "idle");
  CHECK(v->reason == "Hang");
  CHECK(v->rank == 1);
  CHECK(v->node == "node-1");
  CHECK_FALSE(v->node_suspect);
  CHECK(v->onset == doctest::Approx(t0 + 3));
  CHECK(v->evidence.find("rank 1 went idle first, 2.0s before") != std::string::npos);
  CHECK_FALSE(ev.evaluate(kJob, 0, world(t0 + 3, t0 + 1), p, t0 + 9));  // once per generation

  // All idle within a second of each other (a shared wait: the whole job blocked on storage): no rank is named.
  Evaluator together;
  auto w = together.evaluate(kJob, 0, world(t0 + 1, t0 + 1.5), p, t0 + 7);
  REQUIRE(w);
  CHECK(w->rank == -1);
  CHECK(w->evidence.find("all went idle together") != std::string::npos);

  // Must not fire: one rank computing (a straggler, or the others waiting on it), a step reported in the window (a
  // GPU job whose CPU sleeps while the device works), a world not fully seen, the rule off.
  Evaluator busy;
  CHECK_FALSE(busy.evaluate(kJob, 0, world(t0 + 1, 0), p, t0 + 20));
  Evaluator stepping;
  auto ws = world(t0 + 1, t0 + 1);
  ws[0].last_step_ts = t0 + 18;
  ws[0].step = 40;
  CHECK_FALSE(stepping.evaluate(kJob, 0, ws, p, t0 + 20));
  Evaluator partial;
  Policy p3 = p;
  p3.world_size = 3;  // the third rank's pod is still starting: its peers wait for it in init_process_group
  CHECK_FALSE(partial.evaluate(kJob, 0, world(t0 + 1, t0 + 1), p3, t0 + 20));
  Evaluator off;
  Policy p0 = p;
  p0.idle_s = 0;
  CHECK_FALSE(off.evaluate(kJob, 0, world(t0 + 1, t0 + 1), p0, t0 + 20));
  Evaluator unknown;
  Policy pw = p;
  pw.world_size = 0;
  CHECK_FALSE(unknown.evaluate(kJob, 0, world(t0 + 1, t0 + 1), pw, t0 + 20));
}

TEST_CASE("idle: the world size comes from the job's status, the idle series from the agent") {
  nlohmann::json job = {{"spec", nlohmann::json::object()}, {"status", {{"world", {{"size", 4}}}}}};
  CHECK(policy_for_job(job, Policy{}).world_size == 4);
  job["status"]["world"]["size"] = "4";
  CHECK(policy_for_job(job, Policy{}).world_size == 0);
  std::vector<Sample> samples;
  Sample s;
  s.name = "railyard_worker_cpu_idle_since_timestamp_seconds";
  s.labels = {{"namespace", "ns"}, {"trainingjob", "job"}, {"rank", "1"}};
  s.value = 99.5;
  samples.push_back(s);
  CHECK(group_samples(samples)[kJob][1].cpu_idle_since == 99.5);
}

TEST_CASE("rules: evaluated in the documented priority") {
  // docs/monitor.md "The rules": the first rule that finds something gives the verdict.
  const std::vector<std::string_view> want = {"nonfinite",   "stopped",   "idle",       "silence",       "stall",
                                              "unreachable", "straggler", "loss_spike", "checkpoint_age"};
  CHECK(rule_names() == want);
}

TEST_CASE("rules: when two hold in one evaluation, the earlier rule in the table gives the verdict") {
  // Every verdict but checkpoint_age's (the last rule) restarts and ends the generation's evaluation, so that the
  // later rules are not run is seen only in which rule wins. Rank 2 becomes a straggler (0.5 s, then 2 s per step,
  // as in the test above); a NaN loss on rank 0 in the very evaluation the straggler rule fires in wins.
  Policy p = fast_policy();
  auto run = [&](int nan_at_step) {
    Evaluator ev;
    double t = 0;
    for (int i = 1; i < 40; ++i, t += 1) {
      std::map<int, RankObs> m;
      for (int r = 0; r < 3; ++r) {
        RankObs o = rank(r, i, t, 0);
        o.duration_count = i;
        o.duration_sum = r < 2 ? 0.5 * i : (i <= 10 ? 0.5 * i : 5 + 2.0 * (i - 10));
        if (r == 0 && i == nan_at_step) o.loss = std::numeric_limits<double>::quiet_NaN();
        m[r] = o;
      }
      if (auto v = ev.evaluate(kJob, 0, m, p, t)) return std::make_pair(i, *v);
    }
    return std::make_pair(-1, Verdict{});
  };
  const auto [straggler_step, straggler] = run(-1);
  REQUIRE(straggler_step > 0);
  CHECK(straggler.rule == "straggler");
  CHECK(straggler.rank == 2);
  const auto [step, v] = run(straggler_step);
  CHECK(step == straggler_step);
  CHECK(v.rule == "nonfinite");
  CHECK(v.rank == 0);
  CHECK(v.at == straggler.at);
}
