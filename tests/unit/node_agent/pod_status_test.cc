#include "deploy/local/node_agent/pod_status.h"

#include <doctest/doctest.h>
#include <signal.h>

#include "common/kube/client.h"

namespace na = railyard::node_agent;
using Json = nlohmann::json;

namespace {

na::PodRec restarted_pod() {
  na::PodRec rec;
  rec.uid = "uid-1";
  rec.ns = "team";
  rec.name = "job-worker-0";
  rec.node = "rynode-u0-n0";
  rec.container = "trainer";
  rec.restart_count = 2;
  rec.ip = "127.16.0.7";
  rec.start_time = "2026-01-02T03:00:00Z";
  rec.started_at = railyard::kube::parse_rfc3339("2026-01-02T03:04:05Z");
  rec.pod = {{"metadata", {{"name", rec.name}, {"namespace", rec.ns}, {"uid", rec.uid}}},
             {"status", {{"qosClass", "Guaranteed"}}}};
  return rec;
}

}  // namespace

TEST_CASE("pod status: a terminated container carries exit code, reason, times and the run's container id") {
  na::PodRec rec = restarted_pod();
  na::ExitStatus exit;
  exit.code = 3;
  exit.finished_at = railyard::kube::parse_rfc3339("2026-01-02T03:05:00Z");
  Json term = na::terminated_state(rec, exit, "Error", "");
  CHECK(term == Json{{"exitCode", 3},
                     {"reason", "Error"},
                     {"startedAt", "2026-01-02T03:04:05Z"},
                     {"finishedAt", "2026-01-02T03:05:00Z"},
                     {"containerID", "railyard://uid-1/2"}});

  Json cs = na::container_status(rec, {{"terminated", term}}, false);
  CHECK(cs == Json{{"name", "trainer"},
                   {"state", {{"terminated", term}}},
                   {"lastState", Json::object()},
                   {"ready", false},
                   {"restartCount", 2},
                   {"image", "railyard-node-agent/command"},  // no image: the command runs as is
                   {"imageID", ""},
                   {"started", false},
                   {"containerID", "railyard://uid-1/2"}});

  // A signal death says which signal, with the runtime's 128 + signal exit code.
  na::ExitStatus killed;
  killed.signaled = true;
  killed.signal = SIGKILL;
  killed.code = 137;
  killed.finished_at = exit.finished_at;
  Json kterm = na::terminated_state(rec, killed, "Error", na::describe(killed));
  CHECK(kterm["exitCode"] == 137);
  CHECK(kterm["signal"] == SIGKILL);
  CHECK(kterm["message"] == na::describe(killed));
}

TEST_CASE("pod status: a container waiting to restart shows the previous run and no container id") {
  na::PodRec rec = restarted_pod();
  rec.image = "ghcr.io/example/trainer:1";
  rec.last_terminated = {{"exitCode", 1}, {"reason", "Error"}};
  Json cs =
      na::container_status(rec, {{"waiting", {{"reason", "CrashLoopBackOff"}, {"message", "back-off 2s"}}}}, false);
  CHECK(cs["lastState"] == Json{{"terminated", {{"exitCode", 1}, {"reason", "Error"}}}});
  CHECK(cs["image"] == "ghcr.io/example/trainer:1");
  CHECK(cs["started"] == false);
  CHECK_FALSE(cs.contains("containerID"));

  Json running = na::container_status(rec, {{"running", {{"startedAt", "2026-01-02T03:04:05Z"}}}}, true);
  CHECK(running["started"] == true);
  CHECK(running["ready"] == true);
  CHECK(running["containerID"] == "railyard://uid-1/2");
}

TEST_CASE("pod status: the pods/status patch of a failed pod") {
  na::PodRec rec = restarted_pod();
  Json cs = na::container_status(rec, {{"terminated", {{"exitCode", 128}, {"reason", "NoCommand"}}}}, false);
  const std::string now = "2026-01-02T03:06:00Z";
  Json patch = na::pod_status_patch(rec, "Failed", false, cs, "NoCommand", "container trainer has no command", now);
  const Json& st = patch["status"];
  CHECK(st["phase"] == "Failed");
  CHECK(st["hostIP"] == "127.0.0.1");
  CHECK(st["podIP"] == "127.16.0.7");
  CHECK(st["podIPs"] == Json::array({{{"ip", "127.16.0.7"}}}));
  CHECK(st["startTime"] == "2026-01-02T03:00:00Z");
  CHECK(st["qosClass"] == "Guaranteed");
  CHECK(st["reason"] == "NoCommand");
  CHECK(st["message"] == "container trainer has no command");
  CHECK(st["containerStatuses"] == Json::array({cs}));
  // Lists go whole (a merge patch replaces them); a finished pod is not ready because it completed.
  REQUIRE(st["conditions"].size() == 4);
  CHECK(st["conditions"][0] ==
        Json{{"type", "Initialized"}, {"status", "True"}, {"lastProbeTime", nullptr}, {"lastTransitionTime", now}});
  CHECK(st["conditions"][1] == Json{{"type", "Ready"},
                                    {"status", "False"},
                                    {"lastProbeTime", nullptr},
                                    {"lastTransitionTime", now},
                                    {"reason", "PodCompleted"}});
  CHECK(st["conditions"][2]["type"] == "ContainersReady");
  CHECK(st["conditions"][3]["type"] == "PodScheduled");

  // A pending pod without an address yet: no podIP, a null reason/message (clears an earlier one), and not ready
  // because its containers are not.
  rec.ip.clear();
  rec.start_time.clear();
  Json pending = na::pod_status_patch(rec, "Pending", false, cs, "", "", now)["status"];
  CHECK_FALSE(pending.contains("podIP"));
  CHECK_FALSE(pending.contains("startTime"));
  CHECK(pending["reason"].is_null());
  CHECK(pending["message"].is_null());
  CHECK(pending["conditions"][1]["reason"] == "ContainersNotReady");
}

TEST_CASE("pod status: a pod of an earlier agent run keeps that run's start time") {
  Json pod = {
      {"status",
       {{"containerStatuses",
         Json::array({{{"restartCount", 4}, {"state", {{"running", {{"startedAt", "2026-01-01T00:00:00Z"}}}}}}})}}}};
  Json term = na::agent_restarted_state(pod, "agent restarted", "2026-01-02T00:00:00Z");
  CHECK(term == Json{{"exitCode", 137},
                     {"reason", "NodeAgentRestarted"},
                     {"message", "agent restarted"},
                     {"finishedAt", "2026-01-02T00:00:00Z"},
                     {"startedAt", "2026-01-01T00:00:00Z"}});
  CHECK_FALSE(na::agent_restarted_state(Json::object(), "m", "t").contains("startedAt"));
}
