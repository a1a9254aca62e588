// RendezvousService against real HTTP on 127.0.0.1, driven by the agent's RendezvousClient from threads that play
// the pods' agents.
#include "operator/rendezvous/rendezvous.h"

#include <doctest/doctest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "tests/unit/rendezvous/exit_log.h"
#include "worker/agent/pod_agent.h"
#include "worker/agent/rendezvous_client.h"

using railyard::op::GenerationSpec;
using railyard::op::JoinTimeout;
using railyard::op::RendezvousOptions;
using railyard::op::RendezvousService;
using railyard::op::WorkerExit;
using railyard::op::testing::ExitLog;
using railyard::worker::RendezvousClient;
using railyard::worker::RendezvousRequestError;
using Outcome = RendezvousClient::Outcome;
using Clock = std::chrono::steady_clock;
namespace rdzv = railyard::rdzv;

namespace {

const std::string kToken = "tok-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

GenerationSpec spec(int64_t gen, std::vector<std::string> pods, int procs, std::string key = "ns1/job1",
                    std::string token = kToken) {
  GenerationSpec s;
  s.job_key = std::move(key);
  s.generation = gen;
  s.pods = std::move(pods);
  s.procs_per_pod = procs;
  s.token = std::move(token);
  int world = static_cast<int>(s.pods.size()) * procs;
  s.config.layout = railyard::WorkerConfig::Layout{.world = world,
                                                   .dp = world,
                                                   .tp = 1,
                                                   .pp = 1,
                                                   .procs_per_replica = procs,
                                                   .replicas = static_cast<int>(s.pods.size())};
  s.config.restore = "/ckpt/step-100";
  s.config.training.emplace().learning_rate = 0.001;
  return s;
}

rdzv::JoinRequest join_req(const std::string& pod, int procs, int64_t wait_ms, const std::string& agent_id = "",
                           int store_port = 0, std::string ns = "ns1", std::string job = "job1") {
  rdzv::JoinRequest r;
  r.ref = {std::move(ns), std::move(job), pod};
  r.generation = 0;
  r.local_procs = procs;
  r.pod_ip = "127.0.0." + std::to_string(10 + (pod.back() - '0'));
  r.store_port = store_port;
  r.agent_id = agent_id.empty() ? "agent-" + pod : agent_id;
  r.wait_ms = wait_ms;
  return r;
}

RendezvousClient client(const RendezvousService& svc, const std::string& token = kToken) {
  railyard::worker::RendezvousClientOptions o;
  o.max_attempts = 2;
  o.backoff_initial = std::chrono::milliseconds(50);
  return RendezvousClient("127.0.0.1:" + std::to_string(svc.port()), token, o);
}

// Avoids GCC 12's false -Wrestrict on `"p" + std::to_string(i)`.
std::string numbered(const char* prefix, int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%d", prefix, i);
  return buf;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

httplib::Result raw_post(const RendezvousService& svc, const char* path, const std::string& body,
                         const std::string& token) {
  httplib::Client cli("127.0.0.1", svc.port());
  httplib::Headers h;
  if (!token.empty()) h.insert({"Authorization", "Bearer " + token});
  return cli.Post(path, h, body, "application/json");
}

}  // namespace

TEST_CASE("ranks are unique and correct, and joins block until the last pod joins") {
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"p0", "p1", "p2"}, 2));
  auto c = client(svc);

  std::vector<std::future<RendezvousClient::Result>> early;
  auto start = Clock::now();
  for (std::string pod : {"p2", "p0"}) {
    early.push_back(std::async(std::launch::async, [&c, pod] {
      RendezvousClient::Result r;
      auto req = join_req(pod, 2, 5000, "", pod == "p0" ? 31111 : 32222);
      req.peer_port = pod == "p0" ? 41000 : 41002;  // p1 offers no peer-copy listener
      do {
        r = c.join(req);
      } while (r.outcome == Outcome::Waiting);
      return r;
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  for (auto& f : early) {
    REQUIRE(f.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);  // still blocked
  }
  auto last = c.join(join_req("p1", 2, 5000));
  REQUIRE(last.outcome == Outcome::Ready);
  std::vector<rdzv::Assignment> all = {last.assignment};
  for (auto& f : early) {
    auto r = f.get();
    REQUIRE(r.outcome == Outcome::Ready);
    all.push_back(r.assignment);
  }
  CHECK(seconds_since(start) < 3.0);  // released at once, not at the long-poll limit
  std::set<int> ranks;
  for (const auto& a : all) {
    CHECK(a.generation == 1);
    CHECK(a.world_size == 6);
    CHECK(a.num_pods == 3);
    CHECK(a.local_world_size == 2);
    REQUIRE(a.ranks.size() == 2);
    CHECK(a.ranks[0] == a.pod_index * 2);
    CHECK(a.ranks[1] == a.pod_index * 2 + 1);
    CHECK(a.pods == std::vector<std::string>{"p0", "p1", "p2"});
    CHECK(a.master_addr == "127.0.0.10");  // p0's IP
    CHECK(a.master_port == 31111);         // the port p0 offered
    CHECK(a.layout.dp == 6);
    // Every pod learns the peer-copy listeners of the generation in pod order (the ring of the in-memory tier).
    CHECK(a.peers == std::vector<std::string>{"127.0.0.10:41000", "", "127.0.0.12:41002"});
    // And every pod's IP in pod order (the hostfile's hosts when the job does not name its pods by DNS).
    CHECK(a.addresses == std::vector<std::string>{"127.0.0.10", "127.0.0.11", "127.0.0.12"});
    CHECK(a.restore == "/ckpt/step-100");
    // The worker configuration arrives as the operator wrote it (typed on both sides).
    REQUIRE(a.config.training);
    CHECK(a.config.training->learning_rate == 0.001);
    CHECK(a.config.restore == "/ckpt/step-100");
    ranks.insert(a.ranks.begin(), a.ranks.end());
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3, 4, 5});
  CHECK(all[0].pod_index == 1);  // p1 is replica 1 whatever the join order

  // A retried join of the same agent gets the same answer (the reply may have been lost).
  auto again = c.join(join_req("p1", 2, 0));
  REQUIRE(again.outcome == Outcome::Ready);
  CHECK(again.assignment.ranks == last.assignment.ranks);

  auto st = c.status({{"ns1", "job1", "p0"}, 1, 0});
  CHECK(st.outcome == Outcome::Running);
}

TEST_CASE("incomplete world answers waiting with the missing pods; the join timeout gives 408 naming them") {
  RendezvousOptions o;
  o.join_timeout = std::chrono::milliseconds(800);
  RendezvousService svc("127.0.0.1", 0, o);
  std::mutex mu;
  std::vector<JoinTimeout> timeouts;
  svc.set_join_timeout_handler([&](const JoinTimeout& t) {
    std::lock_guard<std::mutex> l(mu);
    timeouts.push_back(t);
  });
  svc.open_generation(spec(1, {"p0", "p1", "p2"}, 1));
  auto c = client(svc);

  auto w = c.join(join_req("p0", 1, 200));
  CHECK(w.outcome == Outcome::Waiting);
  CHECK(w.http_status == 202);
  CHECK(w.missing == std::vector<std::string>{"p1", "p2"});
  auto p = svc.progress("ns1/job1");
  REQUIRE(p);
  CHECK_FALSE(p->world_complete);
  CHECK(p->missing == std::vector<std::string>{"p1", "p2"});

  auto start = Clock::now();
  auto t = c.join(join_req("p0", 1, 5000));
  double took = seconds_since(start);
  CHECK(t.outcome == Outcome::Timeout);
  CHECK(t.http_status == 408);
  CHECK(t.message.find("p1, p2") != std::string::npos);
  CHECK(t.missing == std::vector<std::string>{"p1", "p2"});
  CHECK(took < 1.5);  // bounded by the 800 ms window, not the 5 s long-poll
  {
    std::lock_guard<std::mutex> l(mu);
    REQUIRE(timeouts.size() == 1);
    CHECK(timeouts[0].missing == std::vector<std::string>{"p1", "p2"});
    CHECK(timeouts[0].joined == std::vector<std::string>{"p0"});
  }
  // The retry opens a new window: it waits again instead of failing at once.
  auto retry = c.join(join_req("p0", 1, 200));
  CHECK(retry.outcome == Outcome::Waiting);
}

TEST_CASE("requests without the job's token are refused") {
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"p0"}, 1));
  svc.open_generation(spec(1, {"q0"}, 1, "ns2/other", "tok-other-bbbbbbbbbbbbbbbbbbbbbbbbbbbb"));
  const std::string body = rdzv::to_json(join_req("p0", 1, 0)).dump();

  auto none = raw_post(svc, rdzv::kJoinPath, body, "");
  REQUIRE(none);
  CHECK(none->status == 401);
  CHECK(none->body.find("RAILYARD_RENDEZVOUS_TOKEN") != std::string::npos);

  auto wrong = raw_post(svc, rdzv::kJoinPath, body, "tok-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab");
  REQUIRE(wrong);
  CHECK(wrong->status == 404);
  CHECK(wrong->body.find("job1-rendezvous") != std::string::npos);
  CHECK(wrong->body.find("tok-") == std::string::npos);

  // Another job's valid token does not open this job.
  auto other = raw_post(svc, rdzv::kJoinPath, body, "tok-other-bbbbbbbbbbbbbbbbbbbbbbbbbbbb");
  REQUIRE(other);
  CHECK(other->status == 404);

  // A job that does not exist answers exactly like a wrong token (status and body), with or without a real token:
  // nobody learns which job names exist without holding that job's token.
  rdzv::JoinRequest ghost_req = join_req("p0", 1, 0);
  ghost_req.ref.job = "ghost";
  const std::string ghost_body = rdzv::to_json(ghost_req).dump();
  auto known_wrong = raw_post(svc, rdzv::kJoinPath, body, "tok-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz");
  REQUIRE(known_wrong);
  for (const std::string& tok : {std::string("tok-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"), kToken}) {
    auto ghost = raw_post(svc, rdzv::kJoinPath, ghost_body, tok);
    REQUIRE(ghost);
    CHECK(ghost->status == known_wrong->status);
    std::string expect = known_wrong->body;
    // Same body up to the job name the caller sent (the only request-derived part).
    for (auto pos = expect.find("job1"); pos != std::string::npos; pos = expect.find("job1", pos + 5)) {
      expect.replace(pos, 4, "ghost");
    }
    CHECK(ghost->body == expect);
  }
  // The same for the status and exit endpoints.
  for (const char* path : {rdzv::kStatusPath, rdzv::kExitPath}) {
    nlohmann::json known = path == std::string(rdzv::kStatusPath)
                               ? rdzv::to_json(rdzv::StatusRequest{{"ns1", "job1", "p0"}, 1, 0})
                               : rdzv::to_json(rdzv::ExitReport{{"ns1", "job1", "p0"}, 1, 0, 0, 0, "exited"});
    nlohmann::json ghost = known;
    ghost["job"] = "job2";
    auto a = raw_post(svc, path, known.dump(), "tok-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz");
    auto b = raw_post(svc, path, ghost.dump(), kToken);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->status == 404);
    CHECK(b->status == a->status);
    std::string expect = a->body;
    for (auto pos = expect.find("job1"); pos != std::string::npos; pos = expect.find("job1", pos + 4)) {
      expect.replace(pos, 4, "job2");
    }
    CHECK(b->body == expect);
  }

  // The client sees an unknown job (the agent retries it for a bounded time, then exits 2).
  auto c = client(svc, "tok-nope");
  CHECK(c.join(join_req("p0", 1, 0)).outcome == Outcome::UnknownJob);
  CHECK(c.status({{"ns1", "job1", "p0"}, 1, 0}).outcome == Outcome::UnknownJob);
  CHECK(c.report_exit({{"ns1", "job1", "p0"}, 1, 0, 1, 0, "exited"}).outcome == Outcome::UnknownJob);
  CHECK(client(svc).join(join_req("p0", 1, 0)).outcome == Outcome::Ready);
}

TEST_CASE("malformed bodies get 400 naming the field") {
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"p0", "p1"}, 2));
  auto post = [&](const std::string& body) {
    auto r = raw_post(svc, rdzv::kJoinPath, body, kToken);
    REQUIRE(r);
    return std::make_pair(r->status, r->body);
  };
  auto [c1, b1] = post("{not json");
  CHECK(c1 == 400);
  CHECK(b1.find("not valid JSON") != std::string::npos);
  auto [c2, b2] = post("[1,2]");
  CHECK(c2 == 400);
  CHECK(b2.find("JSON object") != std::string::npos);

  auto good = rdzv::to_json(join_req("p0", 2, 0));
  auto without = [&](const char* f) {
    auto j = good;
    j.erase(f);
    return j.dump();
  };
  for (const char* f : {"namespace", "job", "pod", "generation", "local_procs", "pod_ip", "agent_id"}) {
    // Not a structured binding: CHECK_MESSAGE captures its message in a lambda, which clang 14 refuses for those.
    const auto reply = post(without(f));
    const auto& code = reply.first;
    const auto& body = reply.second;
    CHECK_MESSAGE(code == 400, f);
    CHECK_MESSAGE(body.find(std::string("'") + f + "'") != std::string::npos, body);
  }
  auto wrong_type = good;
  wrong_type["local_procs"] = "two";
  auto [c3, b3] = post(wrong_type.dump());
  CHECK(c3 == 400);
  CHECK(b3.find("'local_procs' must be an integer") != std::string::npos);
  auto bad_port = good;
  bad_port["store_port"] = 70000;
  auto [c4, b4] = post(bad_port.dump());
  CHECK(c4 == 400);
  CHECK(b4.find("'store_port'") != std::string::npos);
  // The heartbeat promise: optional (older agents send none), bounded, and an agent cannot announce "silent" itself.
  CHECK(rdzv::parse_join_request(good).heartbeat_ms == 0);
  auto beat = good;
  beat["heartbeat_ms"] = 500;
  CHECK(rdzv::parse_join_request(beat).heartbeat_ms == 500);
  CHECK(rdzv::to_json(rdzv::parse_join_request(beat))["heartbeat_ms"] == 500);
  beat["heartbeat_ms"] = rdzv::kMaxHeartbeatMs + 1;
  auto [c5, b5] = post(beat.dump());
  CHECK(c5 == 400);
  CHECK(b5.find("'heartbeat_ms'") != std::string::npos);

  // Valid shape, wrong value: local_procs disagrees with the generation.
  auto c = client(svc);
  try {
    c.join(join_req("p0", 3, 0));
    FAIL("expected RendezvousRequestError");
  } catch (const RendezvousRequestError& e) {
    CHECK(std::string(e.what()).find("RAILYARD_PROCS_PER_POD=2") != std::string::npos);
  }
  auto exit_body = rdzv::to_json(rdzv::ExitReport{{"ns1", "job1", "p0"}, 1, 0, 0, 0, "exited"});
  exit_body["reason"] = "bored";
  auto r = raw_post(svc, rdzv::kExitPath, exit_body.dump(), kToken);
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(r->body.find("'reason'") != std::string::npos);
  exit_body["reason"] = railyard::op::kExitSilent;
  r = raw_post(svc, rdzv::kExitPath, exit_body.dump(), kToken);
  REQUIRE(r);
  CHECK(r->status == 400);

  // "message" is optional (older agents send none) and bounded.
  auto no_message = rdzv::to_json(rdzv::ExitReport{{"ns1", "job1", "p0"}, 1, 0, 2, 0, "exited"});
  CHECK_FALSE(no_message.contains("message"));
  CHECK(rdzv::parse_exit_report(no_message).message.empty());
  auto with_message = no_message;
  with_message["message"] = "bad initFrom";
  CHECK(rdzv::parse_exit_report(with_message).message == "bad initFrom");
  with_message["message"] = std::string(rdzv::kMaxExitMessageBytes, 'x');
  CHECK(rdzv::parse_exit_report(with_message).message.size() == rdzv::kMaxExitMessageBytes);
  with_message["message"] = std::string(rdzv::kMaxExitMessageBytes + 1, 'x');
  CHECK_THROWS_WITH_AS(rdzv::parse_exit_report(with_message), doctest::Contains("field 'message' must be at most 4096"),
                       rdzv::ProtocolError);
  r = raw_post(svc, rdzv::kExitPath, with_message.dump(), kToken);
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(r->body.find("'message'") != std::string::npos);
  with_message["message"] = 42;
  CHECK_THROWS_WITH_AS(rdzv::parse_exit_report(with_message), doctest::Contains("'message' must be a string"),
                       rdzv::ProtocolError);
  // A hang report (the rank still runs): reason "hung" with its onset; the onset is bounded and optional.
  rdzv::ExitReport hung{{"ns1", "job1", "p0"}, 1, 0, 0, 0, rdzv::kExitHung};
  hung.onset = 1.7e9;
  auto hung_body = rdzv::to_json(hung);
  CHECK(rdzv::parse_exit_report(hung_body).reason == "hung");
  CHECK(rdzv::parse_exit_report(hung_body).onset == 1.7e9);
  CHECK_FALSE(rdzv::to_json(rdzv::ExitReport{{"ns1", "job1", "p0"}, 1, 0, 0, 0, rdzv::kExitHung}).contains("onset"));
  for (const nlohmann::json& bad : {nlohmann::json(-1), nlohmann::json(2e12), nlohmann::json("soon")}) {
    hung_body["onset"] = bad;
    CHECK_THROWS_WITH_AS(rdzv::parse_exit_report(hung_body), doctest::Contains("field 'onset'"), rdzv::ProtocolError);
  }

  auto nf = raw_post(svc, "/v1/nope", "{}", kToken);
  REQUIRE(nf);
  CHECK(nf->status == 404);

  // A bad GenerationSpec is refused by open_generation itself.
  auto bad = spec(2, {"p0", "p1"}, 2);
  bad.config.layout->dp = 3;
  CHECK_THROWS_WITH_AS(svc.open_generation(bad), doctest::Contains("dp*tp*pp"), std::invalid_argument);
  bad = spec(2, {"p0", "p0"}, 1);
  CHECK_THROWS_AS(svc.open_generation(bad), std::invalid_argument);
  bad = spec(2, {"p0"}, 1);
  bad.token.clear();
  CHECK_THROWS_WITH_AS(svc.open_generation(bad), doctest::Contains("token"), std::invalid_argument);
}

TEST_CASE("a new generation supersedes waiting and running agents within a second") {
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"p0", "p1"}, 1));
  auto c = client(svc);

  // Waiting: p0 is long-polling a join that cannot complete.
  auto waiting = std::async(std::launch::async, [&] { return c.join(join_req("p0", 1, 8000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto t0 = Clock::now();
  svc.open_generation(spec(2, {"p0", "p1"}, 1));
  auto w = waiting.get();
  CHECK(seconds_since(t0) < 1.0);
  CHECK(w.outcome == Outcome::Superseded);
  CHECK(w.generation == 2);

  // Running: both join generation 2, then p0 long-polls status while generation 3 opens.
  auto j0 = std::async(std::launch::async, [&] { return c.join(join_req("p0", 1, 5000)); });
  auto j1 = c.join(join_req("p1", 1, 5000));
  REQUIRE(j1.outcome == Outcome::Ready);
  REQUIRE(j0.get().outcome == Outcome::Ready);
  CHECK(c.status({{"ns1", "job1", "p0"}, 2, 0}).outcome == Outcome::Running);
  auto watching = std::async(std::launch::async, [&] { return c.status({{"ns1", "job1", "p0"}, 2, 8000}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  t0 = Clock::now();
  svc.open_generation(spec(3, {"p0", "p1", "p2"}, 1));
  auto s = watching.get();
  CHECK(seconds_since(t0) < 1.0);
  CHECK(s.outcome == Outcome::Superseded);
  CHECK(s.generation == 3);

  // Re-opening the current generation is a no-op, an older one is ignored.
  svc.open_generation(spec(3, {"p0", "p1", "p2"}, 1));
  svc.open_generation(spec(2, {"p0", "p1"}, 1));
  CHECK(svc.progress("ns1/job1")->generation == 3);
  CHECK(svc.progress("ns1/job1")->world_size == 3);

  // A pod outside the generation is told so.
  auto nm = c.join(join_req("p9", 1, 0));
  CHECK(nm.outcome == Outcome::NotMember);
  CHECK(nm.message.find("p9") != std::string::npos);
}

TEST_CASE("exits are delivered once each, progress is aggregated, and the job reports done") {
  RendezvousService svc("127.0.0.1", 0);
  ExitLog exit_log(svc);
  svc.open_generation(spec(1, {"p0", "p1"}, 2));
  auto c = client(svc);
  auto j0 = std::async(std::launch::async, [&] { return c.join(join_req("p0", 2, 5000)); });
  REQUIRE(c.join(join_req("p1", 2, 5000)).outcome == Outcome::Ready);
  REQUIRE(j0.get().outcome == Outcome::Ready);

  // Progress from two ranks: the lowest global rank's report is the job's.
  CHECK(c.report_progress({{"ns1", "job1", "p1"}, 1, 1, 40, 3.5, 1000}).outcome == Outcome::Recorded);
  CHECK(c.report_progress({{"ns1", "job1", "p0"}, 1, 0, 42, 3.25, 2000}).outcome == Outcome::Recorded);
  auto p = svc.progress("ns1/job1");
  REQUIRE(p);
  CHECK(p->step == 42);
  CHECK(p->loss == doctest::Approx(3.25));
  CHECK(p->tokens_per_second == doctest::Approx(2000));
  CHECK(p->world_complete);
  CHECK(p->last_step_at.time_since_epoch().count() > 0);
  // Checkpoint stalls and the restore (optional, cumulative per process): the most of any rank, for the ledger.
  CHECK(p->checkpoint_stall_seconds == 0);
  rdzv::ProgressReport timed{{"ns1", "job1", "p1"}, 1, 1, 43, 3.4, 1000};
  timed.checkpoint_stall_seconds = 1.5;
  timed.restore_seconds = 0.25;
  // Through the wire format, as the agent sends it.
  CHECK(c.report_progress(rdzv::parse_progress_report(rdzv::to_json(timed))).outcome == Outcome::Recorded);
  timed.ref.pod = "p0";
  timed.local_rank = 0;
  timed.checkpoint_stall_seconds = 0.5;
  timed.restore_seconds = std::nullopt;
  CHECK(c.report_progress(timed).outcome == Outcome::Recorded);
  p = svc.progress("ns1/job1");
  CHECK(p->checkpoint_stall_seconds == doctest::Approx(1.5));
  CHECK(p->restore_seconds == doctest::Approx(0.25));
  // Not seconds: refused naming the field.
  nlohmann::json bad = rdzv::to_json(timed);
  bad["restore_seconds"] = -1;
  CHECK_THROWS_WITH_AS(rdzv::parse_progress_report(bad), doctest::Contains("restore_seconds"), rdzv::ProtocolError);
  bad["restore_seconds"] = 2e9;
  CHECK_THROWS_WITH_AS(rdzv::parse_progress_report(bad), doctest::Contains("restore_seconds"), rdzv::ProtocolError);

  // A failure: reported twice (the agent retried), delivered once.
  rdzv::ExitReport kill{{"ns1", "job1", "p1"}, 1, 1, -1, 9, "exited"};
  kill.message = "Traceback:\n\x1b[31mOSError: no such file\x1b[0m";
  CHECK(c.report_exit(kill).outcome == Outcome::Recorded);
  CHECK(c.report_exit(kill).outcome == Outcome::Duplicate);
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    REQUIRE(exits.size() == 1);
    CHECK(exits[0].job_key == "ns1/job1");
    CHECK(exits[0].pod == "p1");
    CHECK(exits[0].local_rank == 1);
    CHECK(exits[0].global_rank == 3);
    CHECK(exits[0].signal == 9);
    CHECK(exits[0].exit_code == -1);
    CHECK(exits[0].reason == "exited");
    // The rank's last words reach the operator, their escape sequences stripped.
    CHECK(exits[0].message == "Traceback:\nOSError: no such file");
  }
  // A hang report of the other pod's rank: delivered with its onset and evidence.
  rdzv::ExitReport hang{{"ns1", "job1", "p0"}, 1, 1, 0, 0, rdzv::kExitHung};
  hang.message = "no step for 2.1s after step 42";
  hang.onset = 1.7e9;
  CHECK(c.report_exit(hang).outcome == Outcome::Recorded);
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    REQUIRE(exits.size() == 2);
    CHECK(exits[1].reason == "hung");
    CHECK(exits[1].global_rank == 1);
    CHECK(exits[1].onset == 1.7e9);
    CHECK(exits[1].message == "no step for 2.1s after step 42");
  }
  // Generation 2: exits of generation 1 are stale and not delivered.
  svc.open_generation(spec(2, {"p0", "p1"}, 2));
  CHECK(c.report_exit({{"ns1", "job1", "p0"}, 1, 0, -1, 15, "exited"}).outcome == Outcome::Stale);
  CHECK(c.report_progress({{"ns1", "job1", "p0"}, 1, 0, 50, 3.0, 1}).outcome == Outcome::Stale);
  auto k0 = std::async(std::launch::async, [&] { return c.join(join_req("p0", 2, 5000)); });
  REQUIRE(c.join(join_req("p1", 2, 5000)).outcome == Outcome::Ready);
  REQUIRE(k0.get().outcome == Outcome::Ready);
  p = svc.progress("ns1/job1");
  CHECK(p->generation == 2);
  CHECK(p->step == 0);  // progress starts over with the generation
  for (std::string pod : {"p0", "p1"}) {
    for (int l = 0; l < 2; ++l) {
      CHECK(c.status({{"ns1", "job1", pod}, 2, 0}).outcome == Outcome::Running);
      CHECK(c.report_exit({{"ns1", "job1", pod}, 2, l, 0, 0, "exited"}).outcome == Outcome::Recorded);
    }
  }
  p = svc.progress("ns1/job1");
  CHECK(p->ranks_done == 4);
  CHECK(p->all_succeeded);
  CHECK(c.status({{"ns1", "job1", "p0"}, 2, 0}).outcome == Outcome::Done);
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    CHECK(exits.size() == 6);  // generation 1's kill and hang, then generation 2's four
    std::set<int> ranks;
    for (size_t i = 2; i < exits.size(); ++i) {
      CHECK(exits[i].generation == 2);
      CHECK(exits[i].exit_code == 0);
      ranks.insert(exits[i].global_rank);
    }
    CHECK(ranks == std::set<int>{0, 1, 2, 3});
  }
}

TEST_CASE("a restarted agent, an unknown job and a closed job") {
  RendezvousService svc("127.0.0.1", 0);
  std::atomic<int> restarted{0};
  svc.set_exit_handler([&](const WorkerExit& e) {
    if (e.reason == "agent_restarted" && e.pod == "p0" && e.global_rank == -1) ++restarted;
  });
  auto c = client(svc);
  CHECK(c.join(join_req("p0", 1, 0)).outcome == Outcome::UnknownJob);
  svc.open_generation(spec(4, {"p0"}, 1));
  REQUIRE(c.join(join_req("p0", 1, 0, "first")).outcome == Outcome::Ready);
  auto again = c.join(join_req("p0", 1, 0, "second"));
  CHECK(again.outcome == Outcome::Started);
  CHECK(c.join(join_req("p0", 1, 0, "second")).outcome == Outcome::Started);
  CHECK(restarted.load() == 1);

  auto watching = std::async(std::launch::async, [&] { return c.status({{"ns1", "job1", "p0"}, 4, 8000}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  svc.close_job("ns1/job1");
  CHECK(watching.get().outcome == Outcome::Closed);
  CHECK(c.join(join_req("p0", 1, 0)).outcome == Outcome::Closed);
  CHECK_FALSE(svc.progress("ns1/job1"));
  // Closed jobs still check tokens.
  CHECK(client(svc, "tok-x").status({{"ns1", "job1", "p0"}, 4, 0}).outcome == Outcome::UnknownJob);
  // The job can be opened again (deleted and re-created under the same name).
  svc.open_generation(spec(1, {"p0"}, 1));
  CHECK(c.join(join_req("p0", 1, 0)).outcome == Outcome::Ready);
}

namespace {
rdzv::JoinRequest with_uid(rdzv::JoinRequest r, std::string uid) {
  r.ref.uid = std::move(uid);
  return r;
}
}  // namespace

TEST_CASE("fencing: a replaced pod's leftover (same name, old UID) can neither join nor report, and is told to stop") {
  RendezvousService svc("127.0.0.1", 0);
  std::atomic<int> restarted{0}, exits{0};
  svc.set_exit_handler([&](const WorkerExit& e) { ++(e.reason == "agent_restarted" ? restarted : exits); });
  auto c = client(svc);
  auto g2 = spec(2, {"p0", "p1"}, 1);
  g2.pod_uids = std::map<std::string, std::string>{{"p0", "uid-old0"}, {"p1", "uid-1"}};
  svc.open_generation(g2);
  auto old0 = std::async(std::launch::async,
                         [&] { return c.join(with_uid(join_req("p0", 1, 5000, "old-agent"), "uid-old0")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(c.join(with_uid(join_req("p1", 1, 5000), "uid-1")).outcome == Outcome::Ready);
  REQUIRE(old0.get().outcome == Outcome::Ready);

  // The replacement's agent may be quicker than the operator: while the old UID still holds the name, the new one is
  // asked to retry, never fenced (e2e_elastic_hang met this race), and breaks nothing.
  CHECK(c.join(with_uid(join_req("p0", 1, 0, "new-agent"), "uid-new0")).outcome == Outcome::NotMember);
  // p0's kubelet dies, its container lives on. The operator deletes the pod (nobody holds the name) and opens
  // generation 3.
  svc.set_pod_uids("ns1/job1", {{"p1", "uid-1"}});
  auto g3 = spec(3, {"p0", "p1"}, 1);
  g3.pod_uids = std::map<std::string, std::string>{{"p1", "uid-1"}};
  svc.open_generation(g3);
  const rdzv::JobRef old_ref{"ns1", "job1", "p0", "uid-old0"};
  // Its UID held the name and no longer does: fenced on every path, never a member, never an "agent restarted".
  CHECK(c.status({old_ref, 2, 0}).outcome == Outcome::Fenced);
  CHECK(c.join(with_uid(join_req("p0", 1, 0, "old-agent"), "uid-old0")).outcome == Outcome::Fenced);
  // A pod the operator has not told of yet (created a moment ago) is asked to retry.
  CHECK(c.join(with_uid(join_req("p0", 1, 0, "new-agent"), "uid-new0")).outcome == Outcome::NotMember);
  // The replacement is seen. A stale cache that names the old pod again changes nothing for it.
  svc.set_pod_uids("ns1/job1", {{"p0", "uid-old0"}, {"p1", "uid-1"}});
  CHECK(c.join(with_uid(join_req("p0", 1, 0, "old-agent"), "uid-old0")).outcome == Outcome::Fenced);
  svc.set_pod_uids("ns1/job1", {{"p0", "uid-new0"}, {"p1", "uid-1"}});
  auto fenced = c.join(with_uid(join_req("p0", 1, 0, "old-agent"), "uid-old0"));
  CHECK(fenced.outcome == Outcome::Fenced);
  CHECK(fenced.message.find("uid-new0") != std::string::npos);
  CHECK(c.status({old_ref, 3, 0}).outcome == Outcome::Fenced);
  CHECK(c.status({old_ref, 2, 0}).outcome == Outcome::Fenced);
  // The replacement and p1 form generation 3.
  auto new0 = std::async(std::launch::async,
                         [&] { return c.join(with_uid(join_req("p0", 1, 5000, "new-agent"), "uid-new0")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(c.join(with_uid(join_req("p1", 1, 5000), "uid-1")).outcome == Outcome::Ready);
  auto a = new0.get();
  REQUIRE(a.outcome == Outcome::Ready);
  CHECK(a.assignment.generation == 3);
  // Reports of the leftover are stale; the holder's count.
  rdzv::ExitReport ex;
  ex.ref = old_ref;
  ex.generation = 3;
  ex.exit_code = 1;
  CHECK(c.report_exit(ex).outcome == Outcome::Stale);
  rdzv::ProgressReport pr;
  pr.ref = old_ref;
  pr.generation = 3;
  pr.step = 999;
  CHECK(c.report_progress(pr).outcome == Outcome::Stale);
  CHECK(svc.progress("ns1/job1")->step == 0);
  CHECK(c.join(with_uid(join_req("p0", 1, 0, "old-agent"), "uid-old0")).outcome == Outcome::Fenced);
  ex.ref.uid = "uid-new0";
  CHECK(c.report_exit(ex).outcome == Outcome::Recorded);
  CHECK(restarted.load() == 0);  // the leftover never broke the world
  CHECK(exits.load() == 1);
  // An over-long UID is refused naming the field.
  CHECK_THROWS_WITH_AS(c.join(with_uid(join_req("p0", 1, 0), std::string(200, 'u'))), doctest::Contains("pod_uid"),
                       RendezvousRequestError);
}

TEST_CASE("fencing: a pod replaced while the world forms leaves it, and the world waits for its replacement") {
  RendezvousService svc("127.0.0.1", 0);
  auto g = spec(1, {"p0", "p1"}, 1);
  g.pod_uids = std::map<std::string, std::string>{{"p0", "a"}, {"p1", "b"}};
  svc.open_generation(g);
  auto c = client(svc);
  CHECK(c.join(with_uid(join_req("p0", 1, 0, "agent-a"), "a")).outcome == Outcome::Waiting);
  svc.set_pod_uids("ns1/job1", {{"p0", "a2"}, {"p1", "b"}});
  CHECK(c.join(with_uid(join_req("p1", 1, 0), "b")).outcome == Outcome::Waiting);
  CHECK(svc.progress("ns1/job1")->missing == std::vector<std::string>{"p0"});
  CHECK(c.join(with_uid(join_req("p0", 1, 0, "agent-a"), "a")).outcome == Outcome::Fenced);
  auto r = c.join(with_uid(join_req("p0", 1, 0, "agent-a2"), "a2"));
  REQUIRE(r.outcome == Outcome::Ready);
  CHECK(r.assignment.world_size == 2);
}

TEST_CASE("a world far beyond the core threads forms while every join is held: each first join gets its assignment") {
  // Each join holds its request thread until the world is complete (10 s hold here). With a fixed pool of 4 the first
  // four joins would hold every thread and the others could not even register: those four would get 202 after their
  // hold, and the world would form only over many holds (1,000 agents: 44 s with the former fixed 64 threads,
  // docs/benchmarks.md "Rendezvous at 10,000 agents"). The pool gives each held join a thread of its own.
  RendezvousOptions o;
  o.threads = 4;
  RendezvousService svc("127.0.0.1", 0, o);
  const int n = 300;
  std::vector<std::string> pods;
  for (int i = 0; i < n; ++i) pods.push_back(numbered("p", i));
  svc.open_generation(spec(1, pods, 1));
  railyard::worker::RendezvousClientOptions co;
  co.max_attempts = 5;
  RendezvousClient c("127.0.0.1:" + std::to_string(svc.port()), kToken, co);
  std::vector<std::future<std::string>> fs;
  for (int i = 0; i < n; ++i) {
    fs.push_back(std::async(std::launch::async, [&c, i]() -> std::string {
      rdzv::JoinRequest r = join_req("p0", 1, 10000);
      r.ref.pod = numbered("p", i);
      r.agent_id = numbered("a", i);
      try {
        auto res = c.join(r);  // one request: the first answer must be the assignment
        if (res.outcome == Outcome::Ready) return numbered("rank", res.assignment.ranks.at(0));
        return std::string("first answer ") + railyard::worker::to_string(res.outcome);
      } catch (const std::exception& e) {
        return std::string("error: ") + e.what();
      }
    }));
  }
  std::set<std::string> ranks;
  for (auto& f : fs) {
    auto got = f.get();
    CHECK_MESSAGE(got.rfind("rank", 0) == 0, got);
    ranks.insert(got);
  }
  CHECK(ranks.size() == static_cast<size_t>(n));
}

TEST_CASE("a waiting or timed-out join names at most 20 missing pods and counts them all") {
  RendezvousOptions o;
  o.join_timeout = std::chrono::milliseconds(600);
  RendezvousService svc("127.0.0.1", 0, o);
  std::vector<std::string> pods;
  for (int i = 0; i < 30; ++i) pods.push_back(numbered("p", i));
  svc.open_generation(spec(1, pods, 1));
  auto c = client(svc);
  auto w = c.join(join_req("p0", 1, 100));
  REQUIRE(w.outcome == Outcome::Waiting);
  REQUIRE(w.missing.size() == rdzv::kMaxPodsNamed);
  CHECK(w.missing.front() == "p1");
  CHECK(w.missing.back() == "p20");
  CHECK(w.missing_count == 29);
  auto t = c.join(join_req("p0", 1, 5000));
  REQUIRE(t.outcome == Outcome::Timeout);
  CHECK(t.missing.size() == rdzv::kMaxPodsNamed);
  CHECK(t.missing_count == 29);
  CHECK_MESSAGE(t.message.find("p1, p2") != std::string::npos, t.message);
  CHECK_MESSAGE(t.message.find("... (29 in all)") != std::string::npos, t.message);
  CHECK_MESSAGE(t.message.find("p29") == std::string::npos, t.message);
  // The operator's join-timeout event still gets every missing pod (sync_observe names them in the job's condition).
  auto p = svc.progress("ns1/job1");
  REQUIRE(p);
  CHECK(p->missing.size() == 29);
}

TEST_CASE("garbage on every endpoint gets 400 naming the problem, never a crash") {
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"p0"}, 1));
  std::string deep(500000, '[');  // 1 MB with the closing half: the largest body the service reads
  deep += std::string(500000, ']');
  const std::vector<std::string> bodies = {"",
                                           "null",
                                           "{}",
                                           "[]",
                                           "\"text\"",
                                           "12",
                                           deep,
                                           R"({"namespace": 1, "job": "job1", "pod": "p0"})",
                                           R"({"namespace": "ns1", "job": "", "pod": "p0"})",
                                           R"({"namespace": "ns1", "job": "job1", "pod": "p0", "generation": 1e30})",
                                           R"({"namespace": "ns1", "job": "job1", "pod": "p0", "generation": -1})",
                                           R"({"namespace": "ns1", "job": "job1", "pod": "p0", "generation": "1"})"};
  for (const char* path : {rdzv::kJoinPath, rdzv::kStatusPath, rdzv::kExitPath, rdzv::kProgressPath}) {
    for (const auto& body : bodies) {
      auto r = raw_post(svc, path, body, kToken);
      REQUIRE(r);
      CHECK_MESSAGE(r->status == 400, path << " " << body.substr(0, 80));
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      REQUIRE(j.is_object());
      CHECK(j["status"] == "error");
      CHECK_FALSE(j["error"].get<std::string>().empty());
    }
  }
  auto progress = rdzv::to_json(rdzv::ProgressReport{{"ns1", "job1", "p0"}, 1, 0, 5, 1.0, 1.0});
  progress["loss"] = "low";
  auto r = raw_post(svc, rdzv::kProgressPath, progress.dump(), kToken);
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(r->body.find("'loss' must be a number") != std::string::npos);
  // The service still works.
  CHECK(client(svc).join(join_req("p0", 1, 0)).outcome == Outcome::Ready);
}

TEST_CASE(
    "the bootstrap store token: per job and generation, keyed by the rendezvous token, which it does not reveal") {
  using railyard::worker::store_token;
  const std::string t = store_token(kToken, "ns1", "job1", 3);
  CHECK(t.size() == 64);
  CHECK(t.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(store_token(kToken, "ns1", "job1", 3) == t);  // every agent of the generation derives the same one
  CHECK(store_token(kToken, "ns1", "job1", 4) != t);
  CHECK(store_token(kToken, "ns1", "job2", 3) != t);
  CHECK(store_token(kToken, "ns2", "job1", 3) != t);
  CHECK(store_token(std::string(kToken) + "x", "ns1", "job1", 3) != t);
  CHECK(t.find(kToken) == std::string::npos);
  // Pinned (computed independently with Python's hmac module): agents of different builds must agree.
  CHECK(t == "128fa79a7be2ca314609a6b12aa584fb0a4be8ce5453daa02e6e4ba7afb152f7");
}

TEST_CASE("the peer copy token: per job, keyed by the rendezvous token, never the token nor a store token") {
  using railyard::worker::peer_copy_token;
  using railyard::worker::store_token;
  const std::string p = peer_copy_token(kToken, "ns1", "job1");
  CHECK(p.size() == 64);
  CHECK(p != kToken);
  CHECK(p.find(kToken) == std::string::npos);
  CHECK(peer_copy_token(kToken, "ns1", "job2") != p);
  for (int64_t g = 0; g < 4; ++g) CHECK(store_token(kToken, "ns1", "job1", g) != p);
  // Pinned (Python: hmac.new(token, b"railyard peer copy\nns1/job1", sha256)): agents of different builds agree.
  CHECK(p == "3b81c4d3ba3a4ab854bac9667d46a2fbd037dbead926c68f4fcd7bfff0c1ec75");
}

TEST_CASE("the agent's configuration errors name the variable") {
  CHECK_THROWS_WITH_AS(RendezvousClient("nohost", kToken), doctest::Contains("RAILYARD_RENDEZVOUS_ADDR"),
                       railyard::ConfigError);
  CHECK_THROWS_AS(RendezvousClient("host:", kToken), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(RendezvousClient("host:99999", kToken), doctest::Contains("port"), railyard::ConfigError);
  CHECK_THROWS_AS(RendezvousClient("host:8x", kToken), railyard::ConfigError);
  CHECK_THROWS_WITH_AS(RendezvousClient("host:80", ""), doctest::Contains("RAILYARD_RENDEZVOUS_TOKEN"),
                       railyard::ConfigError);
  CHECK(RendezvousClient("10.1.2.3:8477", kToken).port() == 8477);

  const std::vector<std::pair<const char*, const char*>> env = {
      {"RAILYARD_JOB_NAMESPACE", "ns1"}, {"RAILYARD_JOB_NAME", "job1"},       {"RAILYARD_POD_NAME", "p0"},
      {"RAILYARD_POD_IP", "127.0.0.1"},  {"RAILYARD_RENDEZVOUS_ADDR", "h:1"}, {"RAILYARD_RENDEZVOUS_TOKEN", "t"},
      {"RAILYARD_PROCS_PER_POD", "2"},   {"RAILYARD_AGENT_DIR", "/tmp/x"}};
  for (auto [k, v] : env) ::setenv(k, v, 1);
  auto cfg = railyard::worker::AgentConfig::from_env({"echo", "hi"});
  CHECK(cfg.procs_per_pod == 2);
  CHECK(cfg.work_dir == "/tmp/x");
  CHECK(cfg.command == std::vector<std::string>{"echo", "hi"});
  ::setenv("RAILYARD_PROCS_PER_POD", "two", 1);
  CHECK_THROWS_WITH_AS(railyard::worker::AgentConfig::from_env({}), doctest::Contains("RAILYARD_PROCS_PER_POD"),
                       railyard::ConfigError);
  ::setenv("RAILYARD_PROCS_PER_POD", "2", 1);
  ::setenv("RAILYARD_AGENT_POLL_MS", "5000", 1);
  CHECK_THROWS_WITH_AS(railyard::worker::AgentConfig::from_env({}), doctest::Contains("RAILYARD_AGENT_POLL_MS"),
                       railyard::ConfigError);
  ::unsetenv("RAILYARD_AGENT_POLL_MS");
  ::unsetenv("RAILYARD_POD_IP");
  CHECK_THROWS_WITH_AS(railyard::worker::AgentConfig::from_env({}), doctest::Contains("RAILYARD_POD_IP is not set"),
                       railyard::ConfigError);
  for (auto [k, v] : env) ::unsetenv(k);
}

TEST_CASE(
    "a pod that falls silent while its peers are heard is reported once, with its UID and when it was last heard") {
  RendezvousOptions o;
  o.silence_after = std::chrono::milliseconds(400);
  RendezvousService svc("127.0.0.1", 0, o);
  std::mutex mu;
  std::vector<std::pair<WorkerExit, Clock::time_point>> silent;
  svc.set_exit_handler([&](const WorkerExit& e) {
    std::lock_guard<std::mutex> l(mu);
    if (e.reason == railyard::op::kExitSilent) silent.push_back({e, Clock::now()});
  });
  auto c = client(svc);
  auto g = spec(1, {"p0", "p1", "p2", "p3"}, 1);
  g.pod_uids = std::map<std::string, std::string>{{"p0", "u0"}, {"p1", "u1"}, {"p2", "u2"}, {"p3", "u3"}};
  svc.open_generation(g);
  auto join = [&](const std::string& pod, const std::string& uid, int64_t heartbeat_ms) {
    auto r = with_uid(join_req(pod, 1, 5000), uid);
    r.heartbeat_ms = heartbeat_ms;
    return std::async(std::launch::async, [&c, r] { return c.join(r); });
  };
  // p3's agent promised no heartbeat (an older agent): never blamed.
  auto j0 = join("p0", "u0", 100), j1 = join("p1", "u1", 100), j2 = join("p2", "u2", 100), j3 = join("p3", "u3", 0);
  REQUIRE(j0.get().outcome == Outcome::Ready);
  REQUIRE(j1.get().outcome == Outcome::Ready);
  REQUIRE(j2.get().outcome == Outcome::Ready);
  REQUIRE(j3.get().outcome == Outcome::Ready);
  const auto p2_last = Clock::now();
  const double p2_last_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // p0 and p1 poll every 100 ms for 1.5 s; p2 and p3 send nothing.
  const auto poll_until = [&](Clock::time_point until) {
    while (Clock::now() < until) {
      CHECK(c.status({{"ns1", "job1", "p0", "u0"}, 1, 0}).outcome == Outcome::Running);
      CHECK(c.status({{"ns1", "job1", "p1", "u1"}, 1, 0}).outcome == Outcome::Running);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  };
  poll_until(p2_last + std::chrono::milliseconds(1500));
  {
    std::lock_guard<std::mutex> l(mu);
    REQUIRE(silent.size() == 1);
    const WorkerExit& e = silent[0].first;
    CHECK(e.pod == "p2");
    CHECK(e.uid == "u2");
    CHECK(e.generation == 1);
    CHECK(e.global_rank == -1);
    CHECK(e.message.find("pod p2") != std::string::npos);
    CHECK(e.message.find("every 100 ms") != std::string::npos);
    CHECK(std::abs(e.onset - p2_last_unix) < 0.3);
    // Not before the threshold, and within it plus a few watch ticks (a loaded machine may lag more). p2_last was
    // taken as the joins returned, a little after the service last heard p2 (seen 0.3997 s on a loaded run).
    const double after_s = std::chrono::duration<double>(silent[0].second - p2_last).count();
    CHECK(after_s >= 0.35);
    CHECK(after_s < 1.4);
  }
  // Once per generation, however long the silence lasts and even if it speaks again.
  CHECK(c.status({{"ns1", "job1", "p2", "u2"}, 1, 0}).outcome == Outcome::Running);
  poll_until(Clock::now() + std::chrono::milliseconds(700));
  {
    std::lock_guard<std::mutex> l(mu);
    CHECK(silent.size() == 1);
  }
  // The operator replaced p2 (another UID holds the name): its old UID is fenced, and the new one not yet heard.
  svc.set_pod_uids("ns1/job1", {{"p0", "u0"}, {"p1", "u1"}, {"p2", "u2b"}, {"p3", "u3"}});
  poll_until(Clock::now() + std::chrono::milliseconds(700));
  {
    std::lock_guard<std::mutex> l(mu);
    CHECK(silent.size() == 1);
  }
  // Everyone goes quiet (the operator's own network, say): nobody is blamed.
  auto g2 = spec(2, {"p0", "p1"}, 1);
  svc.open_generation(g2);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  std::lock_guard<std::mutex> l(mu);
  CHECK(silent.size() == 1);
}

TEST_CASE("a survivor's lost-peer exit makes a pod quiet since before it silent at half the threshold") {
  // 2 s threshold, 100 ms heartbeats. p1 goes quiet; p0 keeps polling and, 0.3 s in, reports that its collective lost
  // a peer (kExitPeerLost): p1 is silent at about 1 s, not 2 s. A second job without the report waits the full 2 s.
  RendezvousOptions o;
  o.silence_after = std::chrono::milliseconds(2000);
  RendezvousService svc("127.0.0.1", 0, o);
  std::mutex mu;
  std::map<std::string, std::pair<WorkerExit, Clock::time_point>> silent;  // by job
  svc.set_exit_handler([&](const WorkerExit& e) {
    std::lock_guard<std::mutex> l(mu);
    if (e.reason == railyard::op::kExitSilent) silent.emplace(e.job_key, std::make_pair(e, Clock::now()));
  });
  auto c = client(svc);
  for (const char* job : {"job1", "job2"}) {
    auto g = spec(1, {"p0", "p1"}, 1, std::string("ns1/") + job);
    g.pod_uids = std::map<std::string, std::string>{{"p0", "u0"}, {"p1", "u1"}};
    svc.open_generation(g);
  }
  std::vector<std::future<decltype(c.join(join_req("p0", 1, 0)))>> joins;
  for (const char* job : {"job1", "job2"})
    for (const char* pod : {"p0", "p1"}) {
      auto r = with_uid(join_req(pod, 1, 5000, "", 0, "ns1", job), std::string("u") + pod[1]);
      r.heartbeat_ms = 100;
      joins.push_back(std::async(std::launch::async, [&c, r] { return c.join(r); }));
    }
  for (auto& j : joins) REQUIRE(j.get().outcome == Outcome::Ready);
  const auto p1_last = Clock::now();
  bool reported = false;
  while (Clock::now() < p1_last + std::chrono::milliseconds(2600)) {
    for (const char* job : {"job1", "job2"}) {
      const auto st = c.status({{"ns1", job, "p0", "u0"}, 1, 0}).outcome;
      CHECK((st == Outcome::Running || st == Outcome::Waiting));
    }
    if (!reported && Clock::now() > p1_last + std::chrono::milliseconds(300)) {
      CHECK(c.report_exit({{"ns1", "job1", "p0", "u0"}, 1, 0, rdzv::kExitPeerLost, 0, "exited"}).outcome ==
            Outcome::Recorded);
      reported = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::lock_guard<std::mutex> l(mu);
  REQUIRE(silent.count("ns1/job1") == 1);
  REQUIRE(silent.count("ns1/job2") == 1);
  const auto& [e1, at1] = silent.at("ns1/job1");
  CHECK(e1.pod == "p1");
  CHECK(e1.message.find("a survivor reported losing a peer since") != std::string::npos);
  const double s1 = std::chrono::duration<double>(at1 - p1_last).count();
  CHECK(s1 >= 0.9);
  CHECK(s1 < 1.7);  // plus a few watch ticks on a loaded machine; well before the full 2 s
  const auto& [e2, at2] = silent.at("ns1/job2");
  CHECK(e2.pod == "p1");
  CHECK(e2.message.find("survivor") == std::string::npos);
  CHECK(std::chrono::duration<double>(at2 - p1_last).count() >= 1.9);
}
