// The goodput ledger (operator/controller/goodput.h): a job's life replayed as the status writes the reconcile makes,
// each at its time; every second lands in one cause, and the causes add up to the wall time.
#include "operator/controller/goodput.h"

#include <doctest/doctest.h>

#include <cmath>

#include "common/kube/client.h"
#include "operator/controller/status.h"

using namespace railyard::op;
using goodput::TimePoint;

namespace {

const TimePoint t0 = railyard::kube::parse_rfc3339("2026-12-06T10:00:00Z");
TimePoint at(double s) { return t0 + std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

// The status writes of one job, each through account() as Controller::write_status does.
struct Job {
  Json status = Json::object();
  void write(double when) {
    status["goodput"] = goodput::account(status.value("goodput", Json()), status, t0, at(when));
  }
  void condition(const char* type, bool v, const char* reason = "R") {
    set_condition(status, type, v, reason, "", "t");
  }
  double secs(const char* cause) const { return status["goodput"]["seconds"].value(cause, -1.0); }
};

}  // namespace

TEST_CASE("state_of: phase, initializer, capacity, the world, its first step, recomputation") {
  Json s = Json::object();
  CHECK(goodput::state_of(s) == "scheduling");
  s["phase"] = "Succeeded";
  CHECK(goodput::state_of(s) == "ended");
  s["phase"] = "Failed";
  CHECK(goodput::state_of(s) == "ended");
  s["phase"] = "Suspended";
  CHECK(goodput::state_of(s) == "suspended");
  s["phase"] = "Invalid";
  CHECK(goodput::state_of(s) == "invalid");
  s["phase"] = "Pending";
  s["initializer"] = {{"phase", "Running"}};
  CHECK(goodput::state_of(s) == "initializing");
  s["initializer"]["phase"] = "Succeeded";
  CHECK(goodput::state_of(s) == "scheduling");
  set_condition(s, "Scheduled", false, "Unschedulable", "no room", "t");
  CHECK(goodput::state_of(s) == "waitingForCapacity");
  set_condition(s, "Scheduled", true, "Bound", "", "t");
  CHECK(goodput::state_of(s) == "scheduling");
  set_condition(s, "Running", true, "AllPodsRunning", "", "t");
  s["generation"] = 1;
  CHECK(goodput::state_of(s) == "rendezvousAndInit");
  s["step"] = 3;
  CHECK(goodput::state_of(s) == "training");
  // A restart: while Restarting, the stale Running of the decision's write does not count.
  s["generation"] = 2;
  s["lastRestart"] = {{"generation", 2}, {"stepAtRestart", 40}};
  set_condition(s, "Restarting", true, "WorkerExit", "", "t");
  CHECK(goodput::state_of(s) == "scheduling");
  set_condition(s, "Restarting", false, "Recovered", "", "t");
  s["step"] = 0;
  CHECK(goodput::state_of(s) == "rendezvousAndInit");
  s["step"] = 35;
  CHECK(goodput::state_of(s) == "recomputing");
  s["step"] = 41;
  CHECK(goodput::state_of(s) == "training");
  set_condition(s, "Resizing", true, "ScaledDown", "", "t");
  CHECK(goodput::state_of(s) == "scheduling");
}

TEST_CASE(
    "a job with one restart: each span lands in its cause, detection is taken from training, the sum is the wall") {
  Job j;
  j.write(0.5);  // the first reconcile: pods being created
  CHECK(j.secs("scheduling") == doctest::Approx(0.5));
  CHECK(j.status["goodput"]["state"] == "scheduling");
  j.status["generation"] = 1;
  j.condition("Scheduled", true);
  j.condition("Running", true);
  j.write(4.0);  // world formed
  CHECK(j.secs("scheduling") == doctest::Approx(4.0));
  j.status["step"] = 1;
  j.write(6.0);  // first step
  CHECK(j.secs("rendezvousAndInit") == doctest::Approx(2.0));
  j.status["step"] = 50;
  j.write(20.0);  // a step write while training
  CHECK(j.secs("training") == doctest::Approx(14.0));

  // Rank killed at 25.5; the last step arrived at 25.0; the restart is decided and written at 26.0.
  j.status["restarts"] = 1;
  j.status["generation"] = 2;
  j.status["lastRestart"] = {
      {"generation", 2}, {"stepAtRestart", 60}, {"lastProgressTime", railyard::kube::format_rfc3339_micro(at(25.0))}};
  j.condition("Restarting", true);
  j.write(26.0);
  CHECK(j.secs("training") == doctest::Approx(19.0));  // 6 -> 25
  CHECK(j.secs("detection") == doctest::Approx(1.0));  // 25 -> 26
  CHECK(j.status["goodput"]["state"] == "scheduling");
  CHECK(j.status["goodput"]["generationTraining"] == 0);
  j.write(26.2);  // the same reconcile writes again: nothing is charged twice
  CHECK(j.secs("detection") == doctest::Approx(1.0));
  CHECK(j.secs("scheduling") == doctest::Approx(4.2));

  j.condition("Restarting", false);
  j.status["step"] = 0;
  j.write(28.0);  // the new world formed
  j.status["step"] = 55;
  j.status["lastRestart"]["recoveredTime"] = "2026-12-06T10:00:29Z";
  j.write(29.0);  // its first step: a disk restore at 54 retrains up to 60
  CHECK(j.secs("rendezvousAndInit") == doctest::Approx(3.0));
  CHECK(j.status["goodput"]["state"] == "recomputing");
  j.status["step"] = 61;
  j.write(31.0);
  CHECK(j.secs("recomputing") == doctest::Approx(2.0));
  j.status["phase"] = "Succeeded";
  j.condition("Running", false);
  j.write(40.0);
  CHECK(j.secs("training") == doctest::Approx(28.0));
  CHECK(j.status["goodput"]["state"] == "ended");
  // Ended: later writes (cleanPodPolicy, observedGeneration) leave the ledger as it was.
  const Json final_ledger = j.status["goodput"];
  j.write(500.0);
  CHECK(j.status["goodput"] == final_ledger);

  double sum = 0;
  for (auto& [cause, v] : j.status["goodput"]["seconds"].items()) sum += v.get<double>();
  CHECK(sum == doctest::Approx(40.0));
  CHECK(j.status["goodput"]["wallSeconds"].get<double>() == doctest::Approx(40.0));
  CHECK(j.status["goodput"]["ratio"].get<double>() == doctest::Approx(28.0 / 40.0).epsilon(1e-3));
}

TEST_CASE("the workers' checkpoint stalls and restore move out of training and start-up, once each, per generation") {
  Job j;
  j.status["generation"] = 1;
  j.condition("Running", true);
  j.write(0.0);  // world formed: rendezvousAndInit
  j.status["step"] = 1;
  goodput::note_worker_times(j.status, 1, 0, 0.75);  // the first step's report: the restore took 0.75 s
  j.write(2.0);
  CHECK(j.secs("rendezvousAndInit") == doctest::Approx(1.25));
  CHECK(j.secs("restore") == doctest::Approx(0.75));
  j.status["step"] = 40;
  goodput::note_worker_times(j.status, 1, 1.5, 0.75);  // a synchronous save stalled 1.5 s
  j.write(10.0);
  CHECK(j.secs("training") == doctest::Approx(6.5));
  CHECK(j.secs("checkpointStall") == doctest::Approx(1.5));
  j.status["step"] = 41;
  j.write(11.0);  // nothing new reported: nothing moves again
  CHECK(j.secs("checkpointStall") == doctest::Approx(1.5));
  CHECK(j.secs("restore") == doctest::Approx(0.75));
  // A new generation's workers report from 0 again; their restore is new.
  j.status["restarts"] = 1;
  j.status["generation"] = 2;
  j.status["lastRestart"] = {{"generation", 2}};
  j.condition("Restarting", true);
  j.write(12.0);
  j.condition("Restarting", false);
  j.status["step"] = 0;
  j.write(13.0);
  j.status["step"] = 42;
  goodput::note_worker_times(j.status, 2, 0, 0.5);
  j.write(14.0);
  CHECK(j.secs("restore") == doctest::Approx(1.25));
  CHECK(j.secs("rendezvousAndInit") == doctest::Approx(1.75));
  // A report larger than the time the ledger holds moves only that much (the rest waits for the next write).
  goodput::note_worker_times(j.status, 2, 100, 0.5);
  j.write(15.0);
  CHECK(j.secs("training") == doctest::Approx(0.0));
  double sum = 0;
  for (auto& [cause, v] : j.status["goodput"]["seconds"].items()) sum += v.get<double>();
  CHECK(sum == doctest::Approx(15.0));
}

TEST_CASE("detection never takes more than the failed generation trained; a fault during init charges nothing") {
  Job j;
  j.status["generation"] = 1;
  j.condition("Running", true);
  j.status["step"] = 5;
  j.write(0.0);
  j.write(2.0);  // 2 s of training in generation 1
  // A hang detected long after the last step (the last step was 30 s before the decision).
  j.status["restarts"] = 1;
  j.status["generation"] = 2;
  j.status["lastRestart"] = {{"generation", 2}, {"lastProgressTime", "2026-12-06T09:59:35Z"}};
  j.condition("Restarting", true);
  j.write(5.0);
  CHECK(j.secs("detection") == doctest::Approx(5.0));  // capped by the 5 s generation 1 trained
  CHECK(j.secs("training") == doctest::Approx(0.0));
  // The second world fails before its first step: no progress time, nothing moves to detection.
  j.condition("Restarting", false);
  j.status["step"] = 0;
  j.write(7.0);
  j.status["restarts"] = 2;
  j.status["generation"] = 3;
  j.status["lastRestart"] = {{"generation", 3}};
  j.condition("Restarting", true);
  j.write(9.0);
  CHECK(j.secs("detection") == doctest::Approx(5.0));
  CHECK(j.secs("rendezvousAndInit") == doctest::Approx(2.0));
}

TEST_CASE("a ledger starts at creation for a new job, now for a job that ran before it; bad input is no crash") {
  Json fresh = Json::object();
  Json l = goodput::account(Json(), fresh, t0, at(3));
  CHECK(l["seconds"]["scheduling"] == doctest::Approx(3.0));
  // The first write of a new job already carries generation 1 (start_generation writes it): still from creation.
  l = goodput::account(Json(), Json{{"generation", 1}}, t0, at(0.6));
  CHECK(l["seconds"]["scheduling"] == doctest::Approx(0.6));
  Json running = {{"generation", 4}, {"restarts", 2}, {"phase", "Running"}};
  l = goodput::account(Json(), running, t0, at(3));
  CHECK(l["wallSeconds"] == 0);
  CHECK(l["restarts"] == 2);  // no detection owed for restarts before the ledger
  // A job that ended before the operator kept ledgers gets none.
  CHECK(goodput::account(Json(), Json{{"phase", "Succeeded"}, {"generation", 3}}, t0, at(3)).is_null());
  // A hand-edited ledger: wrong types and unknown causes are ignored, a bad time starts from now.
  Json status = {{"goodput", {{"since", "yesterday"}, {"state", "coffee"}, {"seconds", {{"training", "x"}}}}}};
  l = goodput::account(status["goodput"], status, t0, at(3));
  CHECK(l["wallSeconds"] == 0);
  CHECK(l["state"] == "scheduling");
  // Absurd numbers stay finite (a JSON write of an infinity would fail every reconcile of the job).
  Json huge = {{"since", "2026-12-06T10:00:00Z"},
               {"state", "training"},
               {"seconds", {{"training", 1e308}, {"detection", 1e308}}},
               {"workers", {{"checkpointStall", 1e308}}}};
  Json sane = goodput::account(huge, Json{{"generation", 1}}, t0, at(1));
  CHECK(std::isfinite(sane["wallSeconds"].get<double>()));
  CHECK(sane["wallSeconds"].get<double>() <= 3e10 + 1);
  CHECK(sane["workers"]["checkpointStall"] == 1e10);  // rebuilt within the CRD's bounds, not copied
  CHECK(sane["workers"]["generation"] == -1);
  // A clock that stepped back adds nothing.
  Json later = goodput::account(l, status, t0, at(1));
  CHECK(later["wallSeconds"] == 0);
}
