#include "operator/controller/goodput.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "common/kube/client.h"
#include "operator/controller/status.h"

namespace railyard::op::goodput {

namespace {

std::optional<TimePoint> time_at(const Json& obj, const char* field) {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_string()) return std::nullopt;
  try {
    return kube::parse_rfc3339(obj[field].get<std::string>());
  } catch (const std::exception&) {
    return std::nullopt;  // not a time (a hand-edited status): nothing to measure from
  }
}

int64_t int_of(const Json& obj, const char* field, int64_t fallback = 0) {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_number_integer()) return fallback;
  return obj[field].get<int64_t>();
}

// Seconds from status: a status someone else wrote may hold anything; past 1e10 s (three centuries) is not a job's
// time, and a sum of such values must stay finite (JSON has no infinity: the write would fail).
double number_of(const Json& obj, const char* field) {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_number()) return 0;
  const double v = obj[field].get<double>();
  return std::isfinite(v) && v > 0 ? std::min(v, 1e10) : 0;
}

std::string string_of(const Json& obj, const char* field) {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_string()) return "";
  return obj[field].get<std::string>();
}

bool is_cause(std::string_view s) {
  return std::any_of(kCauses.begin(), kCauses.end(), [s](const auto& c) { return c.name == s; });
}

// Milliseconds are as fine as a ledger of reconciles can be, and keep the JSON short.
double ms(double secs) { return std::round(secs * 1000) / 1000; }

double seconds_between(TimePoint from, TimePoint to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());  // a clock that stepped back adds nothing
}

}  // namespace

std::string state_of(const Json& status) {
  const std::string phase = string_of(status, "phase");
  if (phase == "Succeeded" || phase == "Failed") return kEnded;
  if (phase == "Suspended") return "suspended";
  if (phase == "Invalid") return "invalid";
  if (status.contains("initializer") && status["initializer"].is_object() &&
      string_of(status["initializer"], "phase") == "Running")
    return "initializing";
  // Restarting or Resizing: a generation is forming (both turn False as it forms; Running may still read True in the
  // write that records the decision).
  if (condition_true(status, "Running") && !condition_true(status, "Restarting") &&
      !condition_true(status, "Resizing")) {
    // Running: every pod joined the current generation. status.step is that generation's (the rendezvous service
    // keeps progress per generation), so 0 means its first step has not come yet.
    const int64_t step = int_of(status, "step");
    if (step <= 0) return "rendezvousAndInit";
    const Json last = status.contains("lastRestart") ? status["lastRestart"] : Json();
    if (int_of(last, "generation", -1) == int_of(status, "generation") && step <= int_of(last, "stepAtRestart"))
      return "recomputing";
    return "training";
  }
  if (const auto sched = find_condition(status, "Scheduled");
      sched && string_of(*sched, "status") == "False" && string_of(*sched, "reason") == "Unschedulable")
    return "waitingForCapacity";
  return "scheduling";
}

Json account(const Json& previous, const Json& status, TimePoint created, TimePoint now) {
  Json l = previous;
  if (!l.is_object() || !l.contains("since")) {
    // A job that had ended before the operator kept ledgers gets none: its time is not known.
    if (state_of(status) == kEnded) return Json();
    // A job in its first generation starts its ledger at its creation (its first status write already carries
    // generation 1). One further on when the ledger began (an operator upgraded under it) starts now, no restart owed.
    const bool fresh = int_of(status, "generation") <= 1 && int_of(status, "restarts") == 0;
    l = {{"since", kube::format_rfc3339_micro(fresh ? std::min(created, now) : now)},
         {"state", state_of(status)},
         {"restarts", int_of(status, "restarts")},
         {"generation", int_of(status, "generation")},
         {"generationTraining", 0}};
  }
  if (string_of(l, "state") == kEnded && l.contains("seconds")) return l;  // the ledger stays as it was
  Json seconds = Json::object();
  const Json before = l.contains("seconds") ? l["seconds"] : Json();
  for (const auto& c : kCauses) seconds[std::string(c.name)] = number_of(before, std::string(c.name).c_str());

  // The time since the last write went to the state that write recorded.
  const TimePoint since = time_at(l, "since").value_or(now);
  const double elapsed = seconds_between(since, now);
  const std::string state = string_of(l, "state");
  if (is_cause(state)) seconds[state] = seconds[state].get<double>() + elapsed;
  double gen_training = number_of(l, "generationTraining");
  if (state == "training" || state == "recomputing") gen_training += elapsed;

  // A restart decided since: the failed generation trained nothing after its last reported step; that time, up to
  // the restart decision (now: the decision is written first), went to noticing the fault.
  const int64_t restarts = int_of(status, "restarts");
  if (restarts > int_of(l, "restarts")) {
    const Json last = status.contains("lastRestart") ? status["lastRestart"] : Json();
    if (const auto progress_at = time_at(last, "lastProgressTime")) {
      double owed = std::min(seconds_between(*progress_at, now), gen_training);
      for (const char* from : {"training", "recomputing"}) {
        const double take = std::min(owed, seconds[from].get<double>());
        seconds[from] = seconds[from].get<double>() - take;
        seconds["detection"] = seconds["detection"].get<double>() + take;
        owed -= take;
      }
    }
  }
  if (int_of(status, "generation") != int_of(l, "generation")) gen_training = 0;

  // The workers' own account of checkpoint stalls and the restore: what is new since the last charge moves out of
  // training (recomputing) and rendezvousAndInit, never more than those hold.
  const Json workers = l.contains("workers") ? l["workers"] : Json();
  const Json charged_before = l.contains("charged") ? l["charged"] : Json();
  const int64_t workers_gen = int_of(workers, "generation", -1);
  const bool same_gen = int_of(charged_before, "generation", -2) == workers_gen;
  Json charged = {{"generation", workers_gen}};
  for (auto [key, to, froms] :
       {std::tuple{"checkpointStall", "checkpointStall", std::vector<const char*>{"training", "recomputing"}},
        std::tuple{"restore", "restore", std::vector<const char*>{"rendezvousAndInit"}}}) {
    double done = same_gen ? number_of(charged_before, key) : 0;
    double owed = std::max(0.0, number_of(workers, key) - done);
    for (const char* from : froms) {
      const double take = std::min(owed, seconds[from].get<double>());
      seconds[from] = seconds[from].get<double>() - take;
      seconds[to] = seconds[to].get<double>() + take;
      owed -= take;
      done += take;
    }
    charged[key] = done;
  }

  double wall = 0, lost_to_suspend = number_of(seconds, "suspended");
  for (auto& [cause, v] : seconds.items()) {
    v = ms(v.get<double>());
    wall += v.get<double>();
  }
  const double active = wall - lost_to_suspend;
  Json out = {{"wallSeconds", ms(wall)},
              {"seconds", seconds},
              {"state", state_of(status)},
              {"since", kube::format_rfc3339_micro(std::max(since, now))},
              {"restarts", restarts},
              {"generation", int_of(status, "generation")},
              {"generationTraining", ms(gen_training)}};
  if (workers.is_object()) {
    // Rebuilt from what was read, not copied: whatever else a status held does not go back to the API server.
    out["workers"] = {{"generation", workers_gen},
                      {"checkpointStall", number_of(workers, "checkpointStall")},
                      {"restore", number_of(workers, "restore")}};
    out["charged"] = charged;
  }
  if (active > 0) out["ratio"] = std::round(number_of(seconds, "training") / active * 1e4) / 1e4;
  return out;
}

void note_worker_times(Json& status, int64_t generation, double checkpoint_stall_s, double restore_s) {
  if (!status.contains("goodput") || !status["goodput"].is_object()) return;
  auto ok = [](double v) { return std::isfinite(v) && v > 0 ? ms(v) : 0.0; };
  status["goodput"]["workers"] = {
      {"generation", generation}, {"checkpointStall", ok(checkpoint_stall_s)}, {"restore", ok(restore_s)}};
}

}  // namespace railyard::op::goodput
