#include "monitor/rules.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <sstream>

#include "common/job_spec.h"
#include "common/metrics/job_labels.h"
#include "common/metrics/names.h"
namespace railyard::monitor {
namespace {

using nlohmann::json;

bool finite(double v) { return std::isfinite(v); }

std::string fmt(double v, int prec = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

double median(std::vector<double> v) {
  if (v.empty()) return nan_value();
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool parse_rank(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *out = std::stoi(s);
  return true;
}

}  // namespace

Policy policy_for_job(const json& job, const Policy& defaults) {
  Policy p = defaults;
  // The spec through the operator's own reader (common/job_spec.h): the same defaults and bounds. A spec it refuses is
  // the operator's to mark Invalid; its job runs no pods, and the defaults stand meanwhile.
  const api::ParsedJob parsed = api::parse_job(job);
  if (!parsed.violation) {
    const api::JobSpec& spec = parsed.spec;
    p.hang_timeout_s = static_cast<double>(spec.hang_timeout_seconds);
    p.straggler_factor = spec.straggler_factor;
    p.exclude_failed_nodes = spec.exclude_failed_nodes;
    // spec.checkpoint turns the checkpoint-age rule on, at the worker's save interval.
    if (spec.checkpoint)
      p.checkpoint_interval_steps = static_cast<int>(std::min<int64_t>(
          spec.checkpoint_interval_steps > 0 ? spec.checkpoint_interval_steps : api::kDefaultCheckpointIntervalSteps,
          int64_t{1} << 30));
  }
  // The world is status, which the operator writes: not part of the spec's reader.
  if (job.is_object() && job.contains("status") && job["status"].is_object() && job["status"].contains("world") &&
      job["status"]["world"].is_object()) {
    const json& w = job["status"]["world"];
    if (w.contains("size") && w["size"].is_number_integer() && w["size"].get<int64_t>() > 0 &&
        w["size"].get<int64_t>() <= 1000000)
      p.world_size = static_cast<int>(w["size"].get<int64_t>());
  }
  return p;
}

namespace {

// Where each series the rules read goes in RankObs; the monitor's query selects exactly these names.
struct SeriesReader {
  std::string name;
  void (*read)(const Sample& s, RankObs& r);
};

const std::vector<SeriesReader>& series_readers() {
  namespace n = metrics::names;
  static const std::vector<SeriesReader> readers = {
      {n::kUp.name, [](const Sample& s, RankObs& r) { r.reachable = s.value == 1; }},
      {n::kWorkerStep.name, [](const Sample& s, RankObs& r) { r.step = s.value; }},
      {n::kWorkerLastStepTimestamp.name, [](const Sample& s, RankObs& r) { r.last_step_ts = s.value; }},
      {metrics::sum_series(n::kWorkerStepDuration), [](const Sample& s, RankObs& r) { r.duration_sum = s.value; }},
      {metrics::count_series(n::kWorkerStepDuration), [](const Sample& s, RankObs& r) { r.duration_count = s.value; }},
      {n::kWorkerStepPhaseSecondsTotal.name,
       [](const Sample& s, RankObs& r) {
         if (s.label("phase") == "compute") r.compute_total = s.value;
       }},
      {n::kWorkerStepsTotal.name, [](const Sample& s, RankObs& r) { r.steps_total = s.value; }},
      {n::kWorkerLoss.name,
       [](const Sample& s, RankObs& r) {
         r.loss = s.value;
         r.loss_present = true;
       }},
      {n::kWorkerNonfiniteTotal.name, [](const Sample& s, RankObs& r) { r.nonfinite_total = s.value; }},
      {n::kCheckpointLastStep.name, [](const Sample& s, RankObs& r) { r.checkpoint_step = s.value; }},
      {n::kCheckpointLastTimestamp.name, [](const Sample& s, RankObs& r) { r.checkpoint_ts = s.value; }},
      {n::kWorkerLastOutputTimestamp.name, [](const Sample& s, RankObs& r) { r.last_output_ts = s.value; }},
      {n::kWorkerProcessStoppedSince.name, [](const Sample& s, RankObs& r) { r.stopped_since = s.value; }},
      {n::kWorkerCpuIdleSince.name, [](const Sample& s, RankObs& r) { r.cpu_idle_since = s.value; }},
      {n::kWorkerPaused.name, [](const Sample& s, RankObs& r) { r.paused = s.value > 0; }},
      {n::kWorkerPauseEndTimestamp.name, [](const Sample& s, RankObs& r) { r.pause_end_ts = s.value; }},
  };
  return readers;
}

}  // namespace

std::vector<std::string> read_series() {
  std::vector<std::string> out;
  for (const SeriesReader& r : series_readers()) out.push_back(r.name);
  return out;
}

std::map<JobKey, std::map<int, RankObs>> group_samples(const std::vector<Sample>& samples) {
  static const std::map<std::string, void (*)(const Sample&, RankObs&)> by_name = [] {
    std::map<std::string, void (*)(const Sample&, RankObs&)> m;
    for (const SeriesReader& r : series_readers()) m.emplace(r.name, r.read);
    return m;
  }();
  std::map<JobKey, std::map<int, RankObs>> out;
  for (const Sample& s : samples) {
    std::string ns = s.label(metrics::kNamespaceLabel), job = s.label(metrics::kTrainingJobLabel);
    int rank = -1;
    if (ns.empty() || job.empty() || !parse_rank(s.label("rank"), &rank)) continue;
    RankObs& r = out[{ns, job}][rank];
    r.rank = rank;
    if (r.node.empty()) r.node = s.label("node");
    if (r.generation.empty()) r.generation = s.label("generation");
    if (auto it = by_name.find(s.name); it != by_name.end()) it->second(s, r);
  }
  return out;
}

void Evaluator::mark_fired(const JobKey& job, int64_t generation) {
  JobState& st = jobs_[job];
  if (st.generation != generation) {
    st = JobState{};
    st.generation = generation;
  }
  st.fired = true;
}

bool Evaluator::fired(const JobKey& job, int64_t generation) const {
  auto it = jobs_.find(job);
  return it != jobs_.end() && it->second.generation == generation && it->second.fired;
}

void Evaluator::forget(const JobKey& job) { jobs_.erase(job); }

std::optional<Verdict> Evaluator::evaluate(const JobKey& job, int64_t generation, const std::map<int, RankObs>& all,
                                           const Policy& p, double now) {
  JobState& st = jobs_[job];
  if (st.generation != generation) {
    st = JobState{};
    st.generation = generation;
  }
  if (st.fired) return std::nullopt;
  // Series of another generation are leftovers of processes that are being replaced.
  std::map<int, RankObs> ranks;
  const std::string gen_s = std::to_string(generation);
  for (const auto& [r, o] : all)
    if (o.generation.empty() || o.generation == gen_s) ranks.emplace(r, o);
  if (ranks.empty() && st.ranks.empty()) return std::nullopt;  // nothing of this job seen yet
  if (st.first_seen < 0) {
    st.first_seen = now;
    st.progress_at = now;
  }

  // Per-rank bookkeeping: node, step time, reachability.
  std::vector<double> durations;
  for (const auto& [r, o] : ranks) {
    RankState& rs = st.ranks[r];
    if (!o.node.empty()) rs.node = o.node;
    if (finite(o.duration_sum) && finite(o.duration_count) && o.duration_count > 0) {
      if (finite(rs.prev_count) && o.duration_count > rs.prev_count)
        rs.duration = (o.duration_sum - rs.prev_sum) / (o.duration_count - rs.prev_count);
      else if (!finite(rs.prev_count) || o.duration_count < rs.prev_count)
        rs.duration = o.duration_sum / o.duration_count;  // first sight or a reset counter: mean since start
      rs.prev_sum = o.duration_sum;
      rs.prev_count = o.duration_count;
    }
    if (finite(o.compute_total) && finite(o.steps_total) && o.steps_total > 0) {
      auto& h = rs.compute_hist;
      if (!h.empty() && (o.steps_total < h.back()[2] || o.compute_total < h.back()[1])) h.clear();  // a new process
      h.push_back({now, o.compute_total, o.steps_total});
      // Keep one sample at or before the horizon's start, so the rate spans the whole horizon.
      while (h.size() > 2 && h[1][0] <= now - kComputeHorizonS) h.pop_front();
      if (h.size() == 1)
        rs.compute = o.compute_total / o.steps_total;  // first sight: mean since the process started
      else if (h.back()[2] > h.front()[2])
        rs.compute = (h.back()[1] - h.front()[1]) / (h.back()[2] - h.front()[2]);
    }
    if (finite(rs.duration) && rs.duration > 0 && o.reachable) durations.push_back(rs.duration);
  }
  // When no rank is reachable (a one-rank job whose only process hangs takes its /metrics endpoint with it), the
  // last known step times still say what "typical" is; without them the stall threshold would fall back to
  // hangTimeoutSeconds and the unreachable rule (30 s) would always win.
  if (durations.empty()) {
    for (const auto& [r, rs] : st.ranks)
      if (finite(rs.duration) && rs.duration > 0) durations.push_back(rs.duration);
  }
  auto node_of = [&](int r) { return r >= 0 && st.ranks.count(r) ? st.ranks[r].node : std::string(); };
  auto verdict = [&](const std::string& rule, const std::string& reason, int rank, const std::string& evidence,
                     double onset, bool suspect, bool restart = true) {
    if (restart) st.fired = true;
    Verdict v;
    v.rule = rule;
    v.reason = reason;
    v.rank = rank;
    v.node = node_of(rank);
    v.evidence = evidence;
    v.generation = generation;
    v.onset = onset;
    v.at = now;
    v.node_suspect = suspect;
    v.restart = restart;
    return v;
  };

  // Unreachable bookkeeping: a rank seen in this generation whose target is down or whose series vanished.
  std::vector<int> down;
  for (auto& [r, rs] : st.ranks) {
    auto it = ranks.find(r);
    bool is_down = it == ranks.end() || !it->second.reachable;
    if (is_down) {
      if (rs.down_since < 0) rs.down_since = now;
      ++rs.down_evals;
      down.push_back(r);
    } else {
      rs.down_since = -1;
      rs.down_evals = 0;
    }
  }

  // 1. Non-finite loss: certain, no debounce.
  for (const auto& [r, o] : ranks) {
    bool bad_loss = o.loss_present && !finite(o.loss);
    bool counted = finite(o.nonfinite_total) && o.nonfinite_total > 0;
    if (bad_loss || counted) {
      std::string ev = counted ? "railyard_worker_nonfinite_total=" + fmt(o.nonfinite_total, 0) : "";
      if (bad_loss)
        ev += std::string(ev.empty() ? "" : "; ") + "loss=" +
              (std::isnan(o.loss) ? "NaN"
               : o.loss > 0       ? "+Inf"
                                  : "-Inf");
      ev += " at step " + (finite(o.step) ? fmt(o.step, 0) : std::string("?"));
      return verdict("nonfinite", "NonFiniteLoss", r, ev, now, false);
    }
  }

  // 1b. Stopped: a rank's process stopped (SIGSTOP, SIGTSTP, a debugger: the agent reads its state from /proc) for
  // stopped_s. Nothing else stops a process, so the wait is short and the rank is named; not the node's fault.
  if (p.stopped_s > 0) {
    for (const auto& [r, o] : ranks) {
      if (!finite(o.stopped_since) || o.stopped_since <= 0) continue;
      const double since = std::min(o.stopped_since, now);
      if (now - since >= p.stopped_s) {
        const std::string ev = "rank " + std::to_string(r) + "'s process stopped (state T) for " + fmt(now - since, 1) +
                               "s (threshold " + fmt(p.stopped_s, 1) + "s)";
        return verdict("stopped", "Hang", r, ev, since, false);
      }
    }
  }

  // 1c. Idle: every rank of the world has used no CPU for idle_s (the agent reads each rank's CPU time from /proc)
  // and none reported a step meanwhile: a job blocked for good (a deadlock, a rank waiting on a peer that will never
  // send, a sleep), found in seconds without a progress file. The stuck rank goes idle first, its peers at their next
  // collective: it is named when it went idle at least a second before the others. Not the node's fault.
  if (p.idle_s > 0 && p.world_size > 0 && static_cast<int>(ranks.size()) == p.world_size) {
    bool all_idle = true;
    double first = std::numeric_limits<double>::infinity(), second = first, last = 0, latest_step = 0;
    int first_rank = -1;
    for (const auto& [r, o] : ranks) {
      if (!o.reachable || !finite(o.cpu_idle_since) || o.cpu_idle_since <= 0) {
        all_idle = false;
        break;
      }
      const double since = std::min(o.cpu_idle_since, now);
      if (since < first) {
        second = first;
        first = since;
        first_rank = r;
      } else if (since < second) {
        second = since;
      }
      last = std::max(last, since);
      for (double ts : {o.last_step_ts, o.pause_end_ts})
        if (finite(ts)) latest_step = std::max(latest_step, ts);
    }
    if (all_idle && now - last >= p.idle_s && now - latest_step >= p.idle_s) {
      const bool named = ranks.size() == 1 || second - first >= 1.0;
      std::string ev = "every rank of the world (" + std::to_string(ranks.size()) + ") has used no CPU for " +
                       fmt(now - last, 1) + "s (threshold " + fmt(p.idle_s, 1) + "s), no step meanwhile";
      ev += named ? "; rank " + std::to_string(first_rank) + " went idle first, " + fmt(second - first, 1) +
                        "s before the others"
                  : "; all went idle together";
      return verdict("idle", "Hang", named ? first_rank : -1, ev, last, false);
    }
  }

  // 2. Stall: no step progress anywhere in the job for longer than the threshold.
  // A pause (validation, samples, a synchronous checkpoint) completes no step: while a rank is in one the threshold is
  // hangTimeoutSeconds, and its end counts as progress, so the next step's time is measured from there.
  double max_step = nan_value(), latest_ts = nan_value();
  int paused_rank = -1;
  for (const auto& [r, o] : ranks) {
    if (finite(o.step)) max_step = finite(max_step) ? std::max(max_step, o.step) : o.step;
    if (!o.reachable) continue;
    for (double ts : {o.last_step_ts, o.pause_end_ts})
      if (finite(ts) && ts > 0) latest_ts = finite(latest_ts) ? std::max(latest_ts, ts) : ts;
    if (o.paused && paused_rank < 0) paused_rank = r;
  }
  if (finite(max_step) && (!finite(st.max_step) || max_step > st.max_step)) {
    if (finite(st.max_step)) st.progress_at = now;
    st.max_step = max_step;
  }
  double progress_at = st.progress_at;
  if (finite(latest_ts)) progress_at = std::max(progress_at, std::min(latest_ts, now));
  double typical = median(durations);
  double threshold = p.hang_timeout_s;
  std::string basis = "hangTimeoutSeconds (no step time known yet)";
  if (finite(typical)) {
    double t = std::max(p.stall_factor * typical, p.stall_floor_s);
    if (t < threshold) {
      threshold = t;
      basis = "max(" + fmt(p.stall_factor, 0) + " x typical step " + fmt(typical, 3) + "s, " + fmt(p.stall_floor_s, 0) +
              "s)";
    } else {
      basis = "hangTimeoutSeconds";
    }
  }
  if (paused_rank >= 0) {
    threshold = p.hang_timeout_s;
    basis = "hangTimeoutSeconds: rank " + std::to_string(paused_rank) +
            " is paused (validation, samples or a synchronous checkpoint)";
  }
  // 2a. Silence: a program that reports no steps (no rank has a step series in this generation) shows life only by
  // writing output; none from any rank for hangTimeoutSeconds is a hang. Only job-wide: a program may print on rank 0
  // alone.
  if (!finite(max_step)) {
    double latest_output = nan_value();
    for (const auto& [r, o] : ranks)
      if (finite(o.last_output_ts))
        latest_output = finite(latest_output) ? std::max(latest_output, o.last_output_ts) : o.last_output_ts;
    if (finite(latest_output)) {
      const double quiet_since = std::max(st.first_seen, std::min(latest_output, now));
      if (now - quiet_since > p.hang_timeout_s) {
        int blame = down.empty() ? -1 : down.front();
        std::string ev = "no step reported and no output from any rank for " + fmt(now - quiet_since, 1) +
                         "s (threshold hangTimeoutSeconds " + fmt(p.hang_timeout_s, 0) + "s)" +
                         (blame >= 0 ? "; rank " + std::to_string(blame) + " unreachable" : "");
        return verdict("silence", "Hang", blame, ev, quiet_since, blame >= 0);
      }
      progress_at = now;  // the stall rule below is for steps; this job has none to stall
    }
  }
  if (now - progress_at > threshold) {
    int blame = -1;
    std::string why;
    if (!down.empty()) {
      blame = down.front();
      why = "rank " + std::to_string(blame) +
            (ranks.count(blame) ? " unreachable (scrape target down)" : " series missing");
    } else {
      double lo = nan_value(), lo_ts = nan_value();
      for (const auto& [r, o] : ranks) {
        if (!finite(o.step)) continue;
        if (!finite(lo) || o.step < lo || (o.step == lo && finite(o.last_step_ts) && o.last_step_ts < lo_ts)) {
          lo = o.step;
          lo_ts = o.last_step_ts;
          blame = r;
        }
      }
      bool behind = finite(lo) && finite(max_step) && lo < max_step;
      if (behind) {
        why = "rank " + std::to_string(blame) + " is behind at step " + fmt(lo, 0);
      } else {
        blame = -1;
        why = "all ranks stopped at the same step";
      }
    }
    std::string ev = "no step progress for " + fmt(now - progress_at, 1) + "s (threshold " + fmt(threshold, 1) +
                     "s = " + basis + "); last step " + (finite(max_step) ? fmt(max_step, 0) : std::string("none")) +
                     "; " + why;
    return verdict("stall", "Hang", blame, ev, progress_at, blame >= 0);
  }

  // 3. Unreachable rank.
  for (int r : down) {
    const RankState& rs = st.ranks[r];
    if (now - rs.down_since >= p.unreachable_s && rs.down_evals >= p.debounce_evals) {
      std::string ev = "rank " + std::to_string(r) + (ranks.count(r) ? " scrape target down" : " series missing") +
                       " for " + fmt(now - rs.down_since, 1) + "s (threshold " + fmt(p.unreachable_s, 0) + "s, " +
                       std::to_string(rs.down_evals) + " evaluations)";
      return verdict("unreachable", "RankUnreachable", r, ev, rs.down_since, true);
    }
  }

  // 4. Straggler: a rank's step time above factor x the median of the other ranks, for a window. When every
  // reachable rank exports its compute time, that is compared instead: in a synchronous job the wall time per step is
  // the same on every rank (the others wait for the straggler in the gradient reduction).
  bool by_compute = true;
  int reachable_ranks = 0;
  for (const auto& [r, rs] : st.ranks)
    if (ranks.count(r) && ranks.at(r).reachable) {
      ++reachable_ranks;
      if (!(finite(rs.compute) && rs.compute > 0)) by_compute = false;
    }
  by_compute = by_compute && reachable_ranks >= 2;
  auto work = [&](const RankState& x) { return by_compute ? x.compute : x.duration; };
  for (auto& [r, rs] : st.ranks) {
    std::vector<double> others;
    for (const auto& [r2, rs2] : st.ranks)
      if (r2 != r && finite(work(rs2)) && work(rs2) > 0 && ranks.count(r2) && ranks.at(r2).reachable)
        others.push_back(work(rs2));
    double med = median(others);
    bool slow = ranks.count(r) && ranks.at(r).reachable && finite(work(rs)) && finite(med) &&
                work(rs) > p.straggler_factor * med;
    if (!slow) {
      rs.slow_since = -1;
      rs.slow_evals = 0;
      continue;
    }
    if (rs.slow_since < 0) rs.slow_since = now;
    ++rs.slow_evals;
    if (now - rs.slow_since >= p.straggler_window_s && rs.slow_evals >= p.debounce_evals) {
      std::string ev = "rank " + std::to_string(r) + (by_compute ? " compute time per step " : " step time ") +
                       fmt(work(rs), 3) + "s > " + fmt(p.straggler_factor, 2) + " x median of the other ranks " +
                       fmt(med, 3) + "s for " + fmt(now - rs.slow_since, 1) + "s";
      return verdict("straggler", "Straggler", r, ev, rs.slow_since, true);
    }
  }

  // 5. Loss spike: a new step's loss far above the rank's moving window (z-score and ratio), on consecutive steps.
  for (const auto& [r, o] : ranks) {
    RankState& rs = st.ranks[r];
    if (!finite(o.loss) || !finite(o.step) || (finite(rs.last_loss_step) && o.step <= rs.last_loss_step)) continue;
    rs.last_loss_step = o.step;
    bool spike = false;
    double mean = 0, sd = 0;
    if (static_cast<int>(rs.losses.size()) >= p.loss_min_points) {
      for (double l : rs.losses) mean += l;
      mean /= rs.losses.size();
      for (double l : rs.losses) sd += (l - mean) * (l - mean);
      sd = std::sqrt(sd / rs.losses.size());
      double floor_sd = std::max(1e-6, 0.01 * std::fabs(mean));
      double z = (o.loss - mean) / std::max(sd, floor_sd);
      spike = z > p.loss_spike_z && o.loss > p.loss_spike_ratio * mean;
    }
    if (!spike) {
      rs.spike_steps = 0;
      rs.losses.push_back(o.loss);
      if (static_cast<int>(rs.losses.size()) > p.loss_window) rs.losses.erase(rs.losses.begin());
      continue;
    }
    if (++rs.spike_steps >= p.debounce_evals) {
      std::string ev = "rank " + std::to_string(r) + " loss " + fmt(o.loss, 4) + " at step " + fmt(o.step, 0) +
                       " vs window mean " + fmt(mean, 4) + " (sd " + fmt(sd, 4) + ", " +
                       std::to_string(rs.spike_steps) + " consecutive steps)";
      return verdict("loss_spike", "LossSpike", r, ev, now, false);
    }
  }

  // 6. Checkpoint too old while the job makes progress.
  if (p.checkpoint_interval_steps > 0 && finite(typical)) {
    double max_age = p.checkpoint_max_age_s > 0
                         ? p.checkpoint_max_age_s
                         : std::max(3.0 * p.checkpoint_interval_steps * typical, p.checkpoint_age_floor_s);
    double last = nan_value();
    for (const auto& [r, o] : ranks)
      if (finite(o.checkpoint_ts)) last = finite(last) ? std::max(last, o.checkpoint_ts) : o.checkpoint_ts;
    double since = finite(last) ? std::max(last, st.first_seen) : st.first_seen;
    if (now - since > max_age) {
      if (st.ckpt_old_since < 0) st.ckpt_old_since = now;
      if (++st.ckpt_old_evals >= p.debounce_evals && !st.ckpt_warned) {
        st.ckpt_warned = true;
        std::string ev = "last checkpoint " +
                         (finite(last) ? fmt(now - last, 1) + "s ago" : std::string("never seen in this generation")) +
                         " (threshold " + fmt(max_age, 0) + "s)";
        // A warning only: a restart would restore that old checkpoint and lose every step since.
        return verdict("checkpoint_age", "CheckpointTooOld", -1, ev, since + max_age, false, false);
      }
    } else {
      st.ckpt_old_since = -1;
      st.ckpt_warned = false;  // caught up: the next time it falls behind warns again
      st.ckpt_old_evals = 0;
    }
  }
  return std::nullopt;
}

RestartRequest request_from_verdict(const Verdict& v, const std::string& time) {
  RestartRequest r;
  r.reason = v.reason;
  r.rule = v.rule;
  r.rank = v.rank;
  r.node = v.node;
  r.evidence = v.evidence;
  r.generation = v.generation;
  r.time = time;
  auto onset = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(v.onset)));
  std::time_t secs = std::chrono::system_clock::to_time_t(onset);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  if (v.onset > 0) r.onset = buf;
  return r;
}

}  // namespace railyard::monitor
