// Status bookkeeping and restart decisions.
#include <doctest/doctest.h>

#include "operator/controller/failure_policy.h"
#include "operator/controller/status.h"
#include "tests/unit/operator/job_fixture.h"

using namespace railyard::op;
using railyard::op::testing::job_with;
using railyard::op::testing::valid_job;
using Json = nlohmann::json;

TEST_CASE("lastTransitionTime changes only when a condition flips") {
  Json status = Json::object();
  CHECK(set_condition(status, "Running", false, "PodsNotRunning", "0 of 2", "T1"));
  CHECK(find_condition(status, "Running")->at("lastTransitionTime") == "T1");
  // Same value, new message: changed, but the transition time stays.
  CHECK(set_condition(status, "Running", false, "PodsNotRunning", "1 of 2", "T2"));
  CHECK(find_condition(status, "Running")->at("lastTransitionTime") == "T1");
  CHECK(find_condition(status, "Running")->at("message") == "1 of 2");
  // Identical: no change, so no status write.
  Json before = status;
  CHECK_FALSE(set_condition(status, "Running", false, "PodsNotRunning", "1 of 2", "T3"));
  CHECK_FALSE(status_differs(before, status));
  // A flip moves the time.
  CHECK(set_condition(status, "Running", true, "AllPodsRunning", "2 of 2", "T4"));
  CHECK(find_condition(status, "Running")->at("lastTransitionTime") == "T4");
  CHECK(condition_true(status, "Running"));
  CHECK(status_differs(before, status));
  CHECK(status["conditions"].size() == 1);
  CHECK_FALSE(condition_true(status, "Failed"));
}

TEST_CASE("conditions carry the observedGeneration they were computed from") {
  Json status = Json::object();
  set_condition(status, "Running", true, "AllPodsRunning", "2 of 2", "T1");
  set_condition(status, "Scheduled", true, "Bound", "all bound", "T1");
  stamp_conditions(status);  // no status.observedGeneration yet: nothing to stamp
  CHECK_FALSE(find_condition(status, "Running")->contains("observedGeneration"));
  status["observedGeneration"] = 3;
  stamp_conditions(status);
  CHECK(find_condition(status, "Running")->at("observedGeneration") == 3);
  CHECK(find_condition(status, "Scheduled")->at("observedGeneration") == 3);
  // A spec edit (generation 4) re-stamps every condition; the transition time stays where the status did not flip.
  status["observedGeneration"] = 4;
  stamp_conditions(status);
  CHECK(find_condition(status, "Running")->at("observedGeneration") == 4);
  CHECK(find_condition(status, "Running")->at("lastTransitionTime") == "T1");
}

TEST_CASE("exit codes: Kubeflow's default classes, overridable by lists") {
  JobSpec spec = parse_job(valid_job()).spec;
  CHECK(classify_exit(spec, 0) == ExitClass::Success);
  CHECK(classify_exit(spec, 1) == ExitClass::Permanent);
  CHECK(classify_exit(spec, 127) == ExitClass::Permanent);
  CHECK(classify_exit(spec, 128) == ExitClass::Retryable);
  CHECK(classify_exit(spec, 137) == ExitClass::Retryable);
  CHECK(classify_exit(spec, -1, 9) == ExitClass::Retryable);  // SIGKILL
  JobSpec listed =
      parse_job(job_with(Json::parse(
                    R"({"spec": {"failurePolicy": {"retryableExitCodes": [1], "permanentExitCodes": [137]}}})")))
          .spec;
  CHECK(classify_exit(listed, 1) == ExitClass::Retryable);
  CHECK(classify_exit(listed, 137) == ExitClass::Permanent);
  CHECK(classify_exit(listed, -1, 9) == ExitClass::Permanent);  // 128+9
  CHECK(classify_exit(listed, 2) == ExitClass::Retryable);      // an explicit permanent list replaces the range
}

TEST_CASE("restarts open a new generation until maxRestarts is spent") {
  JobSpec spec = parse_job(valid_job()).spec;  // maxRestarts 3
  int restarts = 0;
  int64_t gen = 1;
  for (int i = 0; i < 3; ++i) {
    RestartDecision d = decide_restart(spec, restarts, gen, "WorkerExit", "rank 1 exited with code 137", false);
    REQUIRE_FALSE(d.fail);
    CHECK(d.restarts == restarts + 1);
    CHECK(d.next_generation == gen + 1);
    CHECK(d.reason == "WorkerExit");
    restarts = d.restarts;
    gen = d.next_generation;
  }
  RestartDecision d = decide_restart(spec, restarts, gen, "WorkerExit", "rank 1 exited with code 137", false);
  CHECK(d.fail);
  CHECK(d.reason == "MaxRestartsExceeded");
  CHECK(d.message.find("WorkerExit") != std::string::npos);
  CHECK(d.message.find("maxRestarts=3") != std::string::npos);
  CHECK(d.next_generation == gen);

  RestartDecision p = decide_restart(spec, 0, 1, "WorkerExit", "rank 0 exited with code 2", true);
  CHECK(p.fail);
  CHECK(p.reason == "PermanentExitCode");
  CHECK(p.restarts == 0);
}

TEST_CASE("a failed job's status, condition and event carry the failed process's own words, bounded") {
  JobSpec spec = parse_job(valid_job()).spec;
  const std::string detail = "rank 0 (pod tiny-worker-0) exited with code 2";
  RestartDecision d = decide_restart(spec, 0, 1, "WorkerExit", detail, true);
  const std::string cause = "error: initFrom /etc/passwd is not a checkpoint";
  FailureTexts f = failure_texts(d, detail, cause);
  CHECK(f.last_failure == detail + ": " + cause);
  CHECK(f.condition == detail + " (a permanent exit code: failing without restart): " + cause);
  CHECK(f.event == "PermanentExitCode: " + detail + " (a permanent exit code: failing without restart): " + cause);

  // No cause (an older agent, a pod without a termination message): the messages as before.
  f = failure_texts(d, detail, "");
  CHECK(f.last_failure == detail);
  CHECK(f.condition == d.message);
  CHECK(f.event == "PermanentExitCode: " + d.message);

  // A hostile cause: huge, control characters, invalid UTF-8. Bounded (its end kept), clean, valid JSON.
  std::string hostile = "\x1b[2J\x07\xff" + std::string(100000, 'x') + std::string("\x00\x01 the real reason", 18);
  f = failure_texts(d, detail, hostile);
  CHECK(f.last_failure.size() <= detail.size() + 2 + kMaxCauseBytes);
  CHECK(f.condition.size() <= d.message.size() + 2 + kMaxCauseBytes);
  CHECK(f.event.size() <= kMaxEventMessageBytes);
  for (const std::string* s : {&f.last_failure, &f.condition, &f.event}) {
    CHECK(s->ends_with("x the real reason"));
    CHECK(s->find("...") != std::string::npos);
    CHECK(s->find('\x01') == std::string::npos);
    CHECK(s->find('\x1b') == std::string::npos);
    CHECK_NOTHROW((void)Json(*s).dump());
  }
  CHECK(f.last_failure.starts_with(detail + ": ..."));
  // The same job status with the message in it is written as JSON without error.
  Json status = Json::object();
  status["lastFailure"] = {{"message", f.last_failure}};
  set_condition(status, "Failed", true, d.reason, f.condition, "T1");
  CHECK(Json::parse(status.dump()) == status);

  // No room left for the cause: just the text, cut.
  CHECK(with_cause(std::string(2000, 'a'), cause, 1024).size() <= 1024);
  CHECK(with_cause("short", cause, 1024) == "short: " + cause);
}
