// The restart a reconcile's triggers lead to (operator/controller/restart_plan.h), decided without a server: the
// attribution, restart or fail, the record status keeps, the time to detect and the texts; its recovery; and the
// world's conditions and phase, and the gang's gaps (lifecycle.h world_status, gang_gaps).
#include "operator/controller/restart_plan.h"

#include <doctest/doctest.h>

#include <map>
#include <memory>

#include "common/kube/client.h"
#include "operator/controller/lifecycle.h"

using namespace railyard::op;
namespace kube = railyard::kube;

namespace {

JobSpec spec_with_max_restarts(int max_restarts) {
  JobSpec spec;
  spec.max_restarts = max_restarts;
  return spec;
}

Trigger trigger(const std::string& reason, const std::string& pod, const std::string& uid) {
  Trigger t;
  t.reason = reason;
  t.pod = pod;
  t.uid = uid;
  t.detail = pod + " " + reason;
  t.detector = "operator";
  return t;
}

RestartInputs inputs(std::vector<Trigger> triggers) {
  RestartInputs in;
  in.restarts = 1;
  in.generation = 4;
  in.triggers = std::move(triggers);
  in.now_s = "2026-12-07T10:00:10Z";
  in.now = kube::parse_rfc3339(in.now_s);
  in.step = 120;
  return in;
}

// A pod as the informer holds it: on `node` (none when empty), in `phase`, being deleted or not.
PodPtr pod(const std::string& node, const std::string& phase, bool deleting) {
  Json p = {{"metadata", {{"name", "p"}}}, {"spec", Json::object()}, {"status", {{"phase", phase}}}};
  if (!node.empty()) p["spec"]["nodeName"] = node;
  if (deleting) p["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z";
  return std::make_shared<const Json>(p);
}

}  // namespace

TEST_CASE("a restart: the next generation, its record and its event name the culprit, not a survivor") {
  Trigger survivor = trigger("WorkerExit", "j-worker-1", "u1");
  survivor.peer_lost = true;
  Trigger culprit = trigger("WorkerExit", "j-worker-0", "u0");
  culprit.rank = 0;
  culprit.node = "n0";
  culprit.cause = "Traceback: boom";
  RestartInputs in = inputs({survivor, culprit});
  in.handled_uids = {"old"};
  in.last_progress = kube::parse_rfc3339("2026-12-07T10:00:07Z");
  const RestartPlan p = plan_restart(spec_with_max_restarts(3), in);
  CHECK_FALSE(p.decision.fail);
  CHECK(p.attributed == 1);
  CHECK(p.decision.next_generation == 5);
  CHECK(p.decision.restarts == 2);
  CHECK(p.record["generation"] == 5);
  CHECK(p.record["reason"] == "WorkerExit");
  CHECK(p.record["pod"] == "j-worker-0");
  CHECK(p.record["node"] == "n0");
  CHECK(p.record["rank"] == 0);
  CHECK(p.record["stepAtRestart"] == 120);
  CHECK(p.record["time"] == "2026-12-07T10:00:10Z");
  CHECK(p.record["lastProgressTime"].get<std::string>().rfind("2026-12-07T10:00:07", 0) == 0);
  // Every trigger's pod is handled by this one restart, beside the earlier ones.
  CHECK(p.record["podUIDs"] == Json::array({"old", "u1", "u0"}));
  // The process's own words reach the record, the condition and the event.
  CHECK(p.record["message"].get<std::string>().find("Traceback: boom") != std::string::npos);
  CHECK(p.condition.find("Traceback: boom") != std::string::npos);
  CHECK(p.event.warning);
  CHECK(p.event.reason == "Restarting");
  CHECK(p.event.message.rfind("generation 5: WorkerExit: ", 0) == 0);
  CHECK(p.event.message.find("[detector operator, pod j-worker-0, node n0, rank 0] (restart 2 of at most 3)") !=
        std::string::npos);
  CHECK_FALSE(p.detection);
  CHECK_FALSE(p.record.contains("symptom"));
}

TEST_CASE("the budget spent or a permanent exit: the job fails and the record has no generation") {
  RestartInputs in = inputs({trigger("PodFailed", "j-worker-1", "u1")});
  in.restarts = 3;
  RestartPlan p = plan_restart(spec_with_max_restarts(3), in);
  CHECK(p.decision.fail);
  CHECK(p.decision.reason == "MaxRestartsExceeded");
  CHECK(p.decision.next_generation == 4);
  CHECK_FALSE(p.record.contains("generation"));
  CHECK(p.event.reason == "Failed");
  CHECK(p.event.message.rfind("MaxRestartsExceeded: ", 0) == 0);
  CHECK(p.condition.find("failurePolicy.maxRestarts=3") != std::string::npos);

  // A permanent failure is attributed first and fails with budget left.
  Trigger permanent = trigger("WorkerExit", "j-worker-0", "u0");
  permanent.permanent = true;
  in = inputs({trigger("NodeLost", "j-worker-1", "u1"), permanent});
  p = plan_restart(spec_with_max_restarts(3), in);
  CHECK(p.decision.fail);
  CHECK(p.attributed == 1);
  CHECK(p.decision.reason == "PermanentExitCode");
}

TEST_CASE("the monitor's request: its symptom as a short word, the time from onset to request") {
  Trigger t = trigger("RestartRequested", "", "");
  RestartInputs in = inputs({t});
  in.restart_request =
      R"({"reason":"Straggler","rule":"straggler","time":"2026-12-07T10:00:08Z","onset":"2026-12-07T10:00:02.5Z"})";
  RestartPlan p = plan_restart(spec_with_max_restarts(3), in);
  CHECK(p.record["symptom"] == "Straggler");
  CHECK(p.record["detectSeconds"] == doctest::Approx(5.5));
  REQUIRE(p.detection);
  CHECK(p.detection->symptom == "Straggler");
  CHECK(p.detection->seconds == doctest::Approx(5.5));
  CHECK_FALSE(p.record.contains("pod"));

  // A tenant's free text is no label value; a request without onset has no time to detect.
  in.restart_request = R"({"reason":"not a {label}","time":"2026-12-07T10:00:08Z"})";
  p = plan_restart(spec_with_max_restarts(3), in);
  CHECK(p.record["symptom"] == "other");
  CHECK_FALSE(p.record.contains("detectSeconds"));
  CHECK_FALSE(p.detection);
  // A hand-written request ("now", or times that are not RFC 3339) restarts all the same.
  for (const char* r : {"now", R"({"time":"yesterday","onset":"today"})"}) {
    in.restart_request = r;
    p = plan_restart(spec_with_max_restarts(3), in);
    CHECK_FALSE(p.decision.fail);
    CHECK_FALSE(p.detection);
  }
  // Without a symptom the time still counts, as "unknown".
  in.restart_request = R"({"time":"2026-12-07T10:00:08Z","onset":"2026-12-07T10:00:09Z"})";
  p = plan_restart(spec_with_max_restarts(3), in);
  REQUIRE(p.detection);
  CHECK(p.detection->symptom == "unknown");
  CHECK(p.detection->seconds == 0);  // an onset after the request is no negative time
}

TEST_CASE("an agent's hang report and a silent pod: detected from the onset to now") {
  Trigger hang = trigger("Hang", "j-worker-0", "u0");
  hang.onset = std::chrono::duration<double>(kube::parse_rfc3339("2026-12-07T10:00:07Z").time_since_epoch()).count();
  RestartPlan p = plan_restart(spec_with_max_restarts(3), inputs({hang}));
  CHECK(p.record["symptom"] == "Hang");
  CHECK(p.record["detectSeconds"] == doctest::Approx(3.0));
  REQUIRE(p.detection);
  CHECK(p.detection->symptom == "Hang");

  Trigger silent = trigger("AgentSilent", "j-worker-1", "u1");
  p = plan_restart(spec_with_max_restarts(3), inputs({silent}));
  CHECK(p.record["symptom"] == "Silent");
  CHECK_FALSE(p.record.contains("detectSeconds"));  // no onset known
  CHECK_FALSE(p.detection);
}

TEST_CASE("handled pods are capped at the newest kMaxHandledUids") {
  RestartInputs in = inputs({trigger("PodDeleted", "j-worker-0", "new")});
  for (int i = 100; i < 140; ++i) in.handled_uids.insert(std::string("h").append(std::to_string(i)));
  const RestartPlan p = plan_restart(spec_with_max_restarts(3), in);
  REQUIRE(p.record["podUIDs"].size() == kMaxHandledUids);
  CHECK(p.record["podUIDs"].back() == "new");
  CHECK(p.record["podUIDs"].front() == "h109");
}

TEST_CASE("recovery: the restart's generation's first step, once, timed from the restart") {
  Json last = {{"generation", 5}, {"time", "2026-12-07T10:00:10Z"}, {"reason", "NodeLost"}};
  const auto first_at = kube::parse_rfc3339("2026-12-07T10:00:13.46Z");
  // Another generation's first step says nothing about this restart.
  CHECK_FALSE(mark_recovered(last, 4, first_at, 121));
  CHECK_FALSE(last.contains("recoveredTime"));
  const std::optional<double> secs = mark_recovered(last, 5, first_at, 121);
  REQUIRE(secs);
  CHECK(*secs == doctest::Approx(3.46));
  CHECK(last["recoverySeconds"] == doctest::Approx(3.5));
  CHECK(last["resumedStep"] == 121);
  CHECK(last["recoveredTime"].get<std::string>().rfind("2026-12-07T10:00:13", 0) == 0);
  // Observed once: a later reconcile finds it recovered.
  CHECK_FALSE(mark_recovered(last, 5, first_at + std::chrono::seconds(5), 130));
  CHECK(last["resumedStep"] == 121);
  // A status someone else wrote (a time that is not RFC 3339, or none) is left as it is, without a throw.
  Json odd = {{"generation", 5}, {"time", "soon"}};
  CHECK_FALSE(mark_recovered(odd, 5, first_at, 121));
  CHECK_FALSE(odd.contains("recoveredTime"));
  Json none = {{"generation", 5}};
  CHECK_FALSE(mark_recovered(none, 5, first_at, 121));
}

TEST_CASE("the world's conditions and phase") {
  WorldFacts f;
  f.replicas = 4;
  f.world = 4;
  f.generation = 2;
  f.rendezvous = true;
  auto cond = [](const WorldStatus& w, const std::string& type) -> const ConditionChange* {
    for (const ConditionChange& c : w.conditions)
      if (c.type == type) return &c;
    return nullptr;
  };
  // Nothing yet.
  WorldStatus w = world_status(f);
  CHECK(w.phase == "Pending");
  CHECK(cond(w, "Created")->reason == "CreatingPods");
  CHECK(cond(w, "Created")->message == "0 of 4 worker pods exist");
  CHECK(cond(w, "Scheduled") == nullptr);
  CHECK(cond(w, "Running")->message == "0 of 4 worker pods of the world running");
  f.exist = 4;
  CHECK(world_status(f).phase == "Created");
  f.bound = 4;
  w = world_status(f);
  CHECK(w.phase == "Scheduled");
  CHECK(cond(w, "Scheduled")->value);
  // Every pod runs but the generation has not formed at the rendezvous: not Running yet, and once the join timeout
  // passed, that is why.
  f.running = 4;
  w = world_status(f);
  CHECK_FALSE(w.world_up);
  CHECK(w.phase == "Scheduled");
  f.join_timeout = "j-worker-3 never joined the rendezvous";
  CHECK(cond(world_status(f), "Running")->reason == "JoinTimeout");
  f.world_formed = true;
  w = world_status(f);
  CHECK(w.world_up);
  CHECK(w.phase == "Running");
  CHECK(cond(w, "Running")->message == "every pod joined generation 2");
  // Without the rendezvous, pods running is the world up.
  f.rendezvous = false;
  f.world_formed = false;
  CHECK(cond(world_status(f), "Running")->message == "4 of 4 worker pods are running");
  f.rendezvous = true;
  // A restart waits for its world, then ends Recovered; a resize likewise.
  f.restarting = true;
  f.world_formed = false;
  f.join_timeout.clear();
  w = world_status(f);
  CHECK(w.phase == "Restarting");
  CHECK(cond(w, "Restarting") == nullptr);
  f.world_formed = true;
  w = world_status(f);
  CHECK(w.phase == "Running");
  CHECK(cond(w, "Restarting")->reason == "Recovered");
  CHECK_FALSE(cond(w, "Restarting")->value);
  f.restarting = false;
  f.resizing = true;
  f.world = 3;
  f.running = 2;
  w = world_status(f);
  CHECK(w.phase == "Resizing");
  CHECK(cond(w, "Running")->message == "2 of 3 worker pods of the world running");
  f.running = 3;
  w = world_status(f);
  CHECK(cond(w, "Resizing")->message == "generation 2 runs 3 replicas");
}

TEST_CASE("the gang's gaps: missing pods are created unless their old pod is still going; pods without a node wait") {
  std::map<int, PodPtr> pods = {
      {0, pod("n0", "Running", false)},  // bound: nothing to do
      {1, pod("", "Pending", false)},    // waits for a node
      {2, pod("", "Pending", true)},     // being deleted: neither waits nor is replaced yet
      {3, pod("", "Failed", false)},     // failed: its replacement comes after its deletion
      {9, pod("", "Pending", false)},    // beyond replicas: not the gang's (a surplus pod)
  };
  GangGaps g = gang_gaps(6, pods, {5});
  CHECK(g.create == std::vector<int>{4});  // 5's old pod is still being deleted
  CHECK(g.unbound == std::vector<int>{1});
  g = gang_gaps(6, pods, {});
  CHECK(g.create == std::vector<int>{4, 5});
  CHECK(gang_gaps(0, pods, {}).create.empty());
}

TEST_CASE("the gang after the creates: pods created now count, bound where this reconcile put them") {
  const std::map<int, PodPtr> pods = {
      {0, pod("n0", "Running", false)},   {1, pod("n1", "Failed", false)},  // bound but failed: exists, not healthy
      {2, pod("n2", "Running", true)},     // being deleted: does not exist for the world
      {3, pod("", "Pending", false)},      // bound by this reconcile (known_nodes), not seen bound yet
      {6, pod("n6", "Succeeded", false)},  // beyond replicas: not the gang's
  };
  // j-worker-4 was created now on n4; j-worker-5 created now without a node.
  const GangState g =
      gang_state("j", 6, pods, {"j-worker-4", "j-worker-5"}, {{"j-worker-3", "n3"}, {"j-worker-4", "n4"}});
  CHECK(g.exist == 5);
  CHECK(g.bound == 4);
  CHECK(g.placed == std::vector<std::string>{"n0", "n1", "n3", "n4"});
  CHECK(g.node_of.at("j-worker-3") == "n3");
  CHECK_FALSE(g.node_of.count("j-worker-5"));
  CHECK(g.healthy == std::vector<std::string>{"j-worker-0", "j-worker-3", "j-worker-4"});
  CHECK(g.up.at("j-worker-0"));
  CHECK_FALSE(g.up.at("j-worker-3"));
  CHECK_FALSE(g.up.at("j-worker-4"));
  CHECK_FALSE(g.up.count("j-worker-2"));

  // The world: every replica, unless an elastic job is short of capacity and can run on the healthy pods.
  JobSpec spec;
  spec.replicas = 6;
  CHECK(world_members(spec, "j", false, g.healthy).size() == 6);
  CHECK(world_members(spec, "j", true, g.healthy).size() == 6);  // not elastic: the whole gang or nothing
  spec.min_replicas = 2;
  spec.max_replicas = 6;
  spec.global_batch = 12;  // divisible by a data degree of 3
  spec.micro_batch = 1;
  CHECK(world_members(spec, "j", true, g.healthy) ==
        std::vector<std::string>{"j-worker-0", "j-worker-3", "j-worker-4"});
  spec.min_replicas = 4;  // too few healthy pods for the smallest world: the whole gang again
  CHECK(world_members(spec, "j", true, g.healthy).size() == 6);
}
