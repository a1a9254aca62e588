// The end of a generation and the replacement rule (operator/controller/lifecycle.h), on the states the elastic
// benchmark and chaos runs met.
#include "operator/controller/lifecycle.h"

#include <doctest/doctest.h>

using namespace railyard::op;

TEST_CASE("a grow opened as the shrunk world trained the last step still completes the job") {
  // Generation 24 ran pod 0 alone and trained the last step; its agent heard "done" and exited 0 as the node came
  // back, and the operator had already opened generation 25 (grow 1 -> 2). Generation 25 never forms: pod 0's
  // agent is gone, so no rank of it ever reports, and only pod 0's phase tells that the job is done.
  CompletionSignals s;
  s.generation = 25;
  s.agent = true;
  s.world = {"j-worker-0", "j-worker-1"};
  s.pod_phase = {{"j-worker-0", "Succeeded"}, {"j-worker-1", "Running"}};
  Completion c = job_completion(s);
  CHECK(c.done);
  CHECK_FALSE(c.by_rendezvous);
  CHECK(c.reason == "AgentSucceeded");
  CHECK(c.message.find("j-worker-0") != std::string::npos);

  // A job without the agent runs its own command in every pod: one pod done says nothing about the others.
  s.agent = false;
  CHECK_FALSE(job_completion(s).done);
  s.pod_phase["j-worker-1"] = "Succeeded";
  c = job_completion(s);
  CHECK(c.done);
  CHECK(c.reason == "AllPodsSucceeded");
}

TEST_CASE("completion: the rendezvous record, the world's pods, nothing before the first generation") {
  CompletionSignals s;
  s.generation = 3;
  s.world = {"j-worker-0", "j-worker-1"};
  s.pod_phase = {{"j-worker-0", "Running"}, {"j-worker-1", "Running"}};
  CHECK_FALSE(job_completion(s).done);
  // A failed or pending pod is no proof of anything.
  s.pod_phase["j-worker-1"] = "Failed";
  CHECK_FALSE(job_completion(s).done);
  s.rendezvous_all_succeeded = true;
  Completion c = job_completion(s);
  CHECK(c.done);
  CHECK(c.by_rendezvous);
  CHECK(c.reason == "AllRanksSucceeded");
  // A Succeeded pod outside the world (the world shrank away from it) does not end the job...
  s.rendezvous_all_succeeded = false;
  s.world = {"j-worker-0"};
  s.pod_phase = {{"j-worker-0", "Running"}, {"j-worker-1", "Succeeded"}};
  CHECK_FALSE(job_completion(s).done);
  // ...nor does anything before the job's first generation.
  s.generation = 0;
  s.pod_phase["j-worker-0"] = "Succeeded";
  CHECK_FALSE(job_completion(s).done);
}

TEST_CASE("a node loss is one generation: the lost pod is replaced into the generation the survivor's exit opened") {
  // The survivor's exit 200 opened generation n+1 (condition Restarting) with the same pods; the survivor joined,
  // the pod on the lost node never will. Then the node goes NotReady.
  FormingGeneration g;
  g.restarting = true;
  g.rendezvous_known = true;
  g.world_complete = false;
  g.missing = {"j-worker-1"};
  const std::vector<TriggerFacts> node_lost = {{"NodeLost", "j-worker-1", false}};
  CHECK(replace_into_forming_generation(g, node_lost));
  CHECK(replace_into_forming_generation(g, {{"PodFailed", "j-worker-1", false}}));
  CHECK(replace_into_forming_generation(g, {{"NodeExcluded", "j-worker-1", false}}));
  // A frozen pod: its peers' agents found them hung (the restart), and it fell silent before it could re-join.
  CHECK(replace_into_forming_generation(g, {{"AgentSilent", "j-worker-1", false}}));
  CHECK_FALSE(replace_into_forming_generation(g, {{"Hang", "j-worker-1", false}}));

  // A pod that joined is part of the world: losing it is a new fault.
  CHECK_FALSE(replace_into_forming_generation(g, {{"NodeLost", "j-worker-0", false}}));
  // Once the world formed, its workers may be running: a loss needs a new generation.
  g.world_complete = true;
  CHECK_FALSE(replace_into_forming_generation(g, node_lost));
  g.world_complete = false;
  // Not while running (the generation was seen complete: Restarting is False), nor without the rendezvous record
  // (a new leader that has not re-opened the generation yet).
  g.restarting = false;
  CHECK_FALSE(replace_into_forming_generation(g, node_lost));
  g.restarting = true;
  g.rendezvous_known = false;
  CHECK_FALSE(replace_into_forming_generation(g, node_lost));
  g.rendezvous_known = true;
  // A worker's exit, a monitor's request and a permanent failure keep their own handling.
  CHECK_FALSE(replace_into_forming_generation(g, {{"WorkerExit", "j-worker-1", false}}));
  CHECK_FALSE(replace_into_forming_generation(g, {{"RestartRequested", "", false}}));
  CHECK_FALSE(replace_into_forming_generation(g, {{"PodFailed", "j-worker-1", true}}));
  // Every trigger of the pass must qualify.
  CHECK_FALSE(
      replace_into_forming_generation(g, {{"NodeLost", "j-worker-1", false}, {"WorkerExit", "j-worker-0", false}}));
  CHECK_FALSE(replace_into_forming_generation(g, {}));
  // At most once per pod and generation: a pod that keeps failing before it joins spends the restart budget.
  g.replaced = {"j-worker-1"};
  CHECK_FALSE(replace_into_forming_generation(g, node_lost));
}

TEST_CASE("the restart is attributed to the cause: permanent, then a request, then not a survivor's peer-lost exit") {
  using std::chrono::milliseconds;
  const TriggerFacts survivor{"WorkerExit", "j-worker-0", false, true, milliseconds(5)};
  const TriggerFacts killed{"WorkerExit", "j-worker-1", false, false, milliseconds(2)};
  // Both reports in one pass, the survivor's first (its collective saw the loss before the agent reaped the killed
  // rank): the killed rank names the failure (seen flaky in e2e_elastic_process_failure on 2026-11-27).
  CHECK(attribution({survivor, killed}) == 1);
  CHECK(attribution({killed, survivor}) == 0);
  CHECK(attribution({survivor}) == 0);  // only survivors (the grace ran out): the first
  CHECK(attribution({}) == 0);
  const TriggerFacts request{"RestartRequested", "", false, false, milliseconds(0)};
  const TriggerFacts node_lost{"NodeExcluded", "j-worker-1", false, false, milliseconds(0)};
  CHECK(attribution({node_lost, request}) == 1);  // the monitor's diagnosis over the node it blamed
  const TriggerFacts permanent{"WorkerExit", "j-worker-2", true, false, milliseconds(0)};
  CHECK(attribution({survivor, request, permanent}) == 2);
}

TEST_CASE("a restart caused only by survivors' peer-lost exits is held for the culprit's report") {
  using std::chrono::milliseconds;
  const milliseconds grace(1500);
  // Rank 1 was killed (-9); rank 0's collective failed and it exited 200, and its report arrived first.
  TriggerFacts survivor{"WorkerExit", "j-worker-0", false, true, milliseconds(200)};
  CHECK(hold_for_culprit({survivor}, grace) == milliseconds(1300));
  // Two survivors: held until the oldest report is grace old.
  TriggerFacts survivor2{"WorkerExit", "j-worker-2", false, true, milliseconds(900)};
  CHECK(hold_for_culprit({survivor, survivor2}, grace) == milliseconds(600));
  // The grace is over: restart on what is known (the survivor is named: the culprit never reported).
  survivor.age = milliseconds(1500);
  CHECK(hold_for_culprit({survivor}, grace) == milliseconds(0));
  survivor.age = milliseconds(200);
  // The culprit's report is here: restart now, it names the failure.
  TriggerFacts culprit{"WorkerExit", "j-worker-1", false, false, milliseconds(10)};
  CHECK(hold_for_culprit({survivor, culprit}, grace) == milliseconds(0));
  // Any other cause (a pod or node lost, a monitor's request) is a cause of its own: no hold.
  for (const char* reason : {"PodFailed", "NodeLost", "PodDeleted", "RestartRequested", "AgentRestarted"}) {
    TriggerFacts other{reason, "j-worker-1", false, false, milliseconds(0)};
    CHECK(hold_for_culprit({survivor, other}, grace) == milliseconds(0));
  }
  // A peer-lost exit the failure policy lists as permanent fails the job at once.
  TriggerFacts permanent{"WorkerExit", "j-worker-0", true, true, milliseconds(0)};
  CHECK(hold_for_culprit({permanent}, grace) == milliseconds(0));
  CHECK(hold_for_culprit({}, grace) == milliseconds(0));
}

TEST_CASE("Succeeded and Failed are terminal: later spec changes and restart requests are ignored and reported") {
  // The job a `kubectl scale` reopened on the local cluster: Succeeded in generation 1 (spec version 1), then the spec
  // went to version 2 (replicas 1 -> 2) and a restart request arrived.
  FinishedFacts f;
  f.phase = "Running";
  f.generation = 2;
  f.observed_generation = 1;
  f.restart_request = "r1";
  CHECK_FALSE(finished_job(f).finished);  // a running job follows its spec

  f.phase = "Succeeded";
  f.succeeded_condition = true;
  FinishedJob d = finished_job(f);
  CHECK(d.finished);
  CHECK(d.result == "Succeeded");
  CHECK(d.spec_ignored);
  CHECK(d.restart_ignored);
  REQUIRE(d.ignored.size() == 2);
  CHECK(d.ignored[0].find("generation 1 -> 2") != std::string::npos);
  CHECK(d.ignored[0].find("already Succeeded") != std::string::npos);
  CHECK(d.ignored[1].find("'r1'") != std::string::npos);

  // Once acknowledged (observedGeneration, the restart-handled annotation), nothing more is reported.
  f.observed_generation = 2;
  f.restart_handled = "r1";
  d = finished_job(f);
  CHECK(d.finished);
  CHECK_FALSE(d.spec_ignored);
  CHECK_FALSE(d.restart_ignored);
  CHECK(d.ignored.empty());
  // A request the job handled while it ran (status.restartRequestHandled) is not a new one either.
  f.restart_handled = "";
  f.request_handled = "r1";
  CHECK(finished_job(f).ignored.empty());
  // A status without observedGeneration (written by an older operator) reports no spec change.
  f.observed_generation = -1;
  f.generation = 7;
  CHECK_FALSE(finished_job(f).spec_ignored);

  // Failed is terminal too; the event's request text is cut short (the monitor's JSON carries its evidence).
  FinishedFacts g;
  g.phase = "Failed";
  g.failed_condition = true;
  g.generation = 1;
  g.observed_generation = 1;
  g.restart_request = std::string(300, 'x');
  d = finished_job(g);
  CHECK(d.result == "Failed");
  CHECK(d.restart_ignored);
  REQUIRE(d.ignored.size() == 1);
  CHECK(d.ignored[0].size() < 300);

  // A status an older operator overwrote with Invalid while condition Succeeded stayed True is still finished.
  FinishedFacts h;
  h.phase = "Invalid";
  h.succeeded_condition = true;
  d = finished_job(h);
  CHECK(d.finished);
  CHECK(d.result == "Succeeded");
  // Invalid, Suspended and the rest are not terminal.
  for (const char* p : {"Invalid", "Suspended", "Restarting", "Resizing", "Pending", ""}) {
    FinishedFacts x;
    x.phase = p;
    CHECK_FALSE(finished_job(x).finished);
  }
}
