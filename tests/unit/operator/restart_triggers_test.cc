// Why a job restarts (operator/controller/restart_triggers.h): the triggers one reconcile finds in pods, nodes,
// worker exits and the restart request annotation, without a server.
#include "operator/controller/restart_triggers.h"

#include <doctest/doctest.h>

#include <functional>

#include "common/rendezvous_protocol.h"
#include "operator/controller/pod_builder.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::valid_job;

namespace {

JobSpec two_replicas() {
  ParsedJob p = parse_job(valid_job());
  REQUIRE_FALSE(p.violation);
  return p.spec;
}

PodPtr pod(const std::string& name, const std::string& uid, const std::string& node, const std::string& phase) {
  Json p = {
      {"metadata", {{"name", name}, {"uid", uid}}}, {"spec", {{"nodeName", node}}}, {"status", {{"phase", phase}}}};
  return std::make_shared<const Json>(std::move(p));
}

// The pods are immutable (as in the informer's cache): a changed pod is a new object.
void edit(PodPtr& p, const std::function<void(Json&)>& change) {
  Json copy = *p;
  change(copy);
  p = std::make_shared<const Json>(std::move(copy));
}

TriggerInputs running_job() {
  TriggerInputs in;
  in.name = "tiny";
  in.generation = 3;
  in.pods_by_index = {{0, pod("tiny-worker-0", "u0", "n0", "Running")},
                      {1, pod("tiny-worker-1", "u1", "n1", "Running")}};
  in.world = {"tiny-worker-0", "tiny-worker-1"};
  in.was_running = true;
  in.node_ready = {{"n0", true}, {"n1", true}};
  in.now = std::chrono::steady_clock::now();
  return in;
}

}  // namespace

TEST_CASE("a pod is the job's only when the job controls it: uid, kind and API group of a controller reference") {
  const Json ref = {
      {"apiVersion", "railyard.dev/v1alpha1"}, {"kind", "TrainingJob"}, {"uid", "J"}, {"controller", true}};
  Json p = {{"metadata", {{"ownerReferences", Json::array({ref})}}}};
  CHECK(controlled_by(p, "J"));
  CHECK_FALSE(controlled_by(p, "K"));
  CHECK_FALSE(controlled_by(p, ""));
  Json q = p;
  q["metadata"]["ownerReferences"][0]["controller"] = false;  // an owner, not the controller
  CHECK_FALSE(controlled_by(q, "J"));
  q = p;
  q["metadata"]["ownerReferences"][0]["kind"] = "Job";
  CHECK_FALSE(controlled_by(q, "J"));
  q = p;
  q["metadata"]["ownerReferences"][0]["apiVersion"] = "batch.example.com/v1";
  CHECK_FALSE(controlled_by(q, "J"));
  q = p;
  q["metadata"]["ownerReferences"][0]["controller"] = "yes";  // malformed: not ours, never a throw
  CHECK_FALSE(controlled_by(q, "J"));
  CHECK_FALSE(controlled_by(Json{{"metadata", Json::object()}}, "J"));  // only the label: not adopted
}

TEST_CASE("a healthy running job has no trigger") {
  TriggerScan s = scan_triggers(two_replicas(), running_job());
  CHECK(s.triggers.empty());
  CHECK(s.to_delete.empty());
  CHECK(s.node_by_pod.at("tiny-worker-1") == "n1");
  CHECK(s.restart_request.empty());
}

TEST_CASE("lost, failed, deleted pods and lost or excluded nodes") {
  const JobSpec spec = two_replicas();
  TriggerInputs in = running_job();
  in.pods_by_index.erase(1);
  TriggerScan s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "PodLost");
  CHECK(s.triggers[0].rank == 1);
  // A pod the job grows into (not in the world yet), or lost while a restart forms, is not a loss.
  in.world = {"tiny-worker-0"};
  CHECK(scan_triggers(spec, in).triggers.empty());
  in = running_job();
  in.in_transition = true;
  in.pods_by_index.erase(1);
  CHECK(scan_triggers(spec, in).triggers.empty());

  in = running_job();
  edit(in.pods_by_index[1], [](Json& p) {
    p["status"] = {{"phase", "Failed"},
                   {"containerStatuses", {{{"name", "worker"}, {"state", {{"terminated", {{"exitCode", 3}}}}}}}}};
  });
  s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "PodFailed");
  CHECK(s.triggers[0].permanent);  // 1-127 are permanent without lists
  CHECK(s.triggers[0].uid == "u1");
  REQUIRE(s.to_delete.size() == 1);
  CHECK(s.to_delete[0] == PodDeletion{"tiny-worker-1", "u1", true});  // fenced by its UID
  // The agent's own infrastructure exits (unreachable service 201, fenced 202) never fail the job, whatever the
  // exit-code policy; the same codes from a pod without the agent (its own command) follow the policy.
  for (int code : {railyard::rdzv::kAgentExitUnreachable, railyard::rdzv::kAgentExitFenced}) {
    TriggerInputs infra = running_job();
    edit(infra.pods_by_index[1], [code](Json& p) {
      p["status"] = {{"phase", "Failed"},
                     {"containerStatuses", {{{"name", "worker"}, {"state", {{"terminated", {{"exitCode", code}}}}}}}}};
    });
    JobSpec strict = spec;
    strict.permanent_exit_codes = {code};
    REQUIRE(scan_triggers(strict, infra).triggers.size() == 1);
    CHECK_FALSE(scan_triggers(strict, infra).triggers[0].permanent);
    infra.agent = false;
    CHECK(scan_triggers(strict, infra).triggers[0].permanent);
  }
  // Handled by an earlier restart: no trigger, but the failed pod still goes.
  in.handled_uids = {"u1"};
  s = scan_triggers(spec, in);
  CHECK(s.triggers.empty());
  CHECK(s.to_delete.size() == 1);

  in = running_job();
  edit(in.pods_by_index[0], [](Json& p) { p["metadata"]["deletionTimestamp"] = "2026-11-28T03:00:00Z"; });
  s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "PodDeleted");
  CHECK(s.to_delete.empty());

  // Being deleted and its processes ended (the kubelet says so): force-deleted, so that only the kubelet's clean-up
  // of volumes and cgroups does not hold the name its replacement needs.
  edit(in.pods_by_index[0], [](Json& p) {
    p["spec"]["containers"] = Json::array({{{"name", "worker"}}});
    p["status"]["containerStatuses"] = Json::array(
        {{{"name", "worker"}, {"state", {{"running", {{"startedAt", "2026-11-28T02:00:00Z"}}}}}}});
  });
  CHECK(scan_triggers(spec, in).to_delete.empty());  // still running: its grace is its own
  edit(in.pods_by_index[0], [](Json& p) {
    p["status"]["containerStatuses"][0]["state"] = {{"terminated", {{"exitCode", 143}}}};
  });
  s = scan_triggers(spec, in);
  REQUIRE(s.to_delete.size() == 1);
  CHECK(s.to_delete[0] == PodDeletion{"tiny-worker-0", "u0", true});
  CHECK(s.triggers.size() == 1);  // still one PodDeleted restart
  edit(in.pods_by_index[0], [](Json& p) {
    p["spec"]["containers"].push_back({{"name", "sidecar"}});  // a container without a status has not ended
  });
  CHECK(scan_triggers(spec, in).to_delete.empty());
  // The agent exited on the deletion's SIGTERM, so the kubelet calls the pod Failed before it confirms the deletion:
  // force-deleted as well.
  edit(in.pods_by_index[0], [](Json& p) { p["status"]["phase"] = "Failed"; });
  in.handled_uids = {"u0"};
  s = scan_triggers(spec, in);
  REQUIRE(s.to_delete.size() == 1);
  CHECK(s.to_delete[0] == PodDeletion{"tiny-worker-0", "u0", true});
  CHECK(s.triggers.empty());

  in = running_job();
  in.node_ready["n0"] = false;
  in.node_ready.erase("n1");
  s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 2);
  CHECK(s.triggers[0].reason == "NodeLost");
  CHECK(s.triggers[0].detail.find("not Ready") != std::string::npos);
  CHECK(s.triggers[1].detail.find("gone") != std::string::npos);
  REQUIRE(s.to_delete.size() == 2);
  CHECK(s.to_delete[0] == PodDeletion{"tiny-worker-0", "u0", true});
  CHECK(s.to_delete[1] == PodDeletion{"tiny-worker-1", "u1", true});

  in = running_job();
  in.excluded_nodes = {"n1"};
  s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "NodeExcluded");
  CHECK(s.triggers[0].node == "n1");

  // Generation 0 (never started): nothing can fail.
  in = running_job();
  in.generation = 0;
  in.pods_by_index.clear();
  CHECK(scan_triggers(spec, in).triggers.empty());
}

TEST_CASE("worker exits of the current generation") {
  const JobSpec spec = two_replicas();
  TriggerInputs in = running_job();
  auto exit_of = [&](int64_t gen, int code, int sig, const std::string& reason) {
    railyard::op::WorkerExit e;
    e.generation = gen;
    e.pod = "tiny-worker-1";
    e.global_rank = 1;
    e.exit_code = code;
    e.signal = sig;
    e.reason = reason;
    e.received = in.now - std::chrono::milliseconds(400);
    return e;
  };
  in.exits = {exit_of(2, 137, 0, "exited"),  // an older generation
              exit_of(3, 0, 0, "exited"),    // a clean exit
              exit_of(3, 0, 0, "stopped"),   // stopped by the agent
              exit_of(3, -1, 9, "exited"),   // killed
              exit_of(3, 200, 0, "exited"),  // a survivor whose peer went away
              exit_of(3, 0, 0, "agent_restarted")};
  TriggerScan s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 3);
  CHECK(s.triggers[0].reason == "WorkerExit");
  CHECK(s.triggers[0].detail.find("signal 9") != std::string::npos);
  CHECK_FALSE(s.triggers[0].permanent);
  CHECK(s.triggers[0].node == "n1");
  CHECK(s.triggers[0].age == std::chrono::milliseconds(400));
  CHECK(s.triggers[1].peer_lost);
  CHECK(s.triggers[2].reason == "AgentRestarted");
  CHECK(s.triggers[0].cause.empty());  // an agent that sent no message

  // A failed rank's last words (the agent's exit report message) become the trigger's cause.
  in.exits = {exit_of(3, 2, 0, "exited")};
  in.exits[0].message = "error: initFrom /etc/passwd is not a checkpoint";
  s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].permanent);
  CHECK(s.triggers[0].detail == "rank 1 (pod tiny-worker-1) exited with code 2");
  CHECK(s.triggers[0].cause == "error: initFrom /etc/passwd is not a checkpoint");
}

TEST_CASE("an agent's hang report is a Hang of that rank, with its evidence and onset") {
  const JobSpec spec = two_replicas();
  TriggerInputs in = running_job();
  railyard::op::WorkerExit e;
  e.generation = 3;
  e.pod = "tiny-worker-1";
  e.global_rank = 1;
  e.exit_code = 0;  // nothing exited: the rank still runs
  e.signal = 0;
  e.reason = "hung";
  e.message = "process stopped (state T: SIGSTOP, SIGTSTP or a debugger) for 1.0s (threshold 1.0s), seen by its agent";
  e.onset = 1.7e9;
  e.received = in.now;
  in.exits = {e};
  TriggerScan s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "Hang");
  CHECK(s.triggers[0].detector == "agent");
  CHECK(s.triggers[0].rank == 1);
  CHECK(s.triggers[0].pod == "tiny-worker-1");
  CHECK(s.triggers[0].node == "n1");
  CHECK_FALSE(s.triggers[0].permanent);
  CHECK_FALSE(s.triggers[0].peer_lost);
  CHECK(s.triggers[0].onset == 1.7e9);
  CHECK(s.triggers[0].detail == "rank 1 (pod tiny-worker-1) hung");
  CHECK(s.triggers[0].cause == e.message);
  // Of an older generation: nothing.
  in.exits[0].generation = 2;
  CHECK(scan_triggers(spec, in).triggers.empty());
}

TEST_CASE("a pod the rendezvous service found silent is replaced at once, only while that UID holds the name") {
  const JobSpec spec = two_replicas();
  TriggerInputs in = running_job();
  railyard::op::WorkerExit e;
  e.generation = 3;
  e.pod = "tiny-worker-1";
  e.exit_code = 0;
  e.reason = railyard::op::kExitSilent;
  e.uid = "u1";
  e.message = "no request from the agent of pod tiny-worker-1 (uid u1) for 4.1 s ...";
  e.onset = 1.7e9;
  e.received = in.now;
  in.exits = {e};
  TriggerScan s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "AgentSilent");
  CHECK(s.triggers[0].detector == "rendezvous");
  CHECK(s.triggers[0].pod == "tiny-worker-1");
  CHECK(s.triggers[0].node == "n1");
  CHECK(s.triggers[0].uid == "u1");  // handled once: lastRestart.podUIDs
  CHECK(s.triggers[0].onset == 1.7e9);
  CHECK(s.triggers[0].cause == e.message);
  CHECK_FALSE(s.triggers[0].permanent);
  // Deleted with force (a frozen kubelet never confirms a graceful deletion): its replacement is created next.
  REQUIRE(s.to_delete.size() == 1);
  CHECK(s.to_delete[0] == PodDeletion{"tiny-worker-1", "u1", true});
  // The name is held by a replacement now, the restart handled this UID already, the pod failed or is being deleted
  // (scan_pods speaks for it), or the report is of an older generation: nothing.
  TriggerInputs replaced = in;
  edit(replaced.pods_by_index[1], [](Json& p) { p["metadata"]["uid"] = "u1b"; });
  CHECK(scan_triggers(spec, replaced).triggers.empty());
  CHECK(scan_triggers(spec, replaced).to_delete.empty());
  TriggerInputs handled = in;
  handled.handled_uids = {"u1"};
  CHECK(scan_triggers(spec, handled).triggers.empty());
  TriggerInputs deleting = in;
  edit(deleting.pods_by_index[1], [](Json& p) { p["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"; });
  for (const Trigger& t : scan_triggers(spec, deleting).triggers) CHECK(t.reason != "AgentSilent");
  TriggerInputs gone = in;
  gone.pods_by_index.erase(1);
  for (const Trigger& t : scan_triggers(spec, gone).triggers) CHECK(t.reason != "AgentSilent");
  TriggerInputs older = in;
  older.exits[0].generation = 2;
  CHECK(scan_triggers(spec, older).triggers.empty());
}

TEST_CASE("a Failed pod without the agent's report says why with its termination message") {
  const JobSpec spec = two_replicas();
  TriggerInputs in = running_job();
  edit(in.pods_by_index[1], [](Json& p) {
    p["status"]["phase"] = "Failed";
    p["status"]["containerStatuses"] = Json::array(
        {{{"name", "sidecar"}, {"state", {{"terminated", {{"exitCode", 0}, {"message", "not this one"}}}}}},
         {{"name", "worker"},
          {"state", {{"terminated", {{"exitCode", 3}, {"message", "FileNotFoundError: /data/train_0.bin\n"}}}}}}});
  });
  TriggerScan s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "PodFailed");
  CHECK(s.triggers[0].permanent);
  CHECK(s.triggers[0].cause == "FileNotFoundError: /data/train_0.bin\n");
  CHECK(pod_termination_message(*in.pods_by_index[0]).empty());  // a running pod has none
}

TEST_CASE("a restart request acts once and names the monitor's rank and node") {
  const JobSpec spec = two_replicas();
  TriggerInputs in = running_job();
  in.restart_request = R"({"reason":"Hang","rank":1,"node":"n1","generation":3})";
  in.restart_detector = "monitor";
  TriggerScan s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].reason == "RestartRequested");
  CHECK(s.triggers[0].detector == "monitor");
  CHECK(s.triggers[0].rank == 1);
  CHECK(s.triggers[0].pod == "tiny-worker-1");
  CHECK(s.restart_request == in.restart_request);
  // Handled already: nothing.
  in.request_handled = in.restart_request;
  s = scan_triggers(spec, in);
  CHECK(s.triggers.empty());
  CHECK(s.restart_request.empty());
  // A hand-written value restarts too, with no rank or pod; before the first generation it is only recorded.
  in.restart_request = "now";
  in.restart_detector = "annotation";
  s = scan_triggers(spec, in);
  REQUIRE(s.triggers.size() == 1);
  CHECK(s.triggers[0].rank == -1);
  CHECK(s.triggers[0].pod.empty());
  in.generation = 0;
  s = scan_triggers(spec, in);
  CHECK(s.triggers.empty());
  CHECK(s.restart_request == "now");
}
