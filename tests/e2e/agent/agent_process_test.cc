// The real agent binary as local processes (one per simulated pod) against a RendezvousService in this process:
// worker env, exit reporting, in-place re-join on a new generation, signal forwarding, success and bad-token exits.
// Needs no Kubernetes: each "pod" is an agent process with its own loopback IP.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "operator/rendezvous/rendezvous.h"
#include "tests/ctest_env.h"
#include "tests/e2e/agent/agent_test_util.h"
#include "tests/unit/rendezvous/exit_log.h"
#include "worker/agent/pod_agent.h"

namespace fs = std::filesystem;
using railyard::op::GenerationSpec;
using railyard::op::RendezvousService;
using railyard::op::WorkerExit;
using railyard::op::testing::ExitLog;
using Clock = std::chrono::steady_clock;

using railyard::agent_testing::slurp;
using railyard::agent_testing::TempDir;

namespace {

const std::string kToken = "agent-test-token-0123456789abcdef";

std::string agent_binary() {
  const std::string p = railyard::test::bin_path("railyard-worker");
  REQUIRE_MESSAGE(fs::exists(p), "no " << p);
  return p;
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

// One simulated pod: the agent process, stopped by pid when the test ends.
struct AgentProcess {
  pid_t pid = -1;
  fs::path log;
  int status = -1;

  AgentProcess(const std::string& pod, const std::string& ip, int port, int procs, const fs::path& dir,
               const std::vector<std::string>& command, const std::string& token = kToken,
               const std::string& job = "job1", const std::map<std::string, std::string>& extra_env = {}) {
    log = dir / (pod + ".log");
    std::map<std::string, std::string> env;
    for (const char* k : {"PATH", "HOME", "RAILYARD_AGENT_UNREACHABLE_SECONDS"}) {
      if (const char* v = std::getenv(k)) env[k] = v;
    }
    env["RAILYARD_JOB_NAMESPACE"] = "ns1";
    env["RAILYARD_JOB_NAME"] = job;
    env["RAILYARD_POD_NAME"] = pod;
    env["RAILYARD_POD_IP"] = ip;
    env["RAILYARD_RENDEZVOUS_ADDR"] = "127.0.0.1:" + std::to_string(port);
    env["RAILYARD_RENDEZVOUS_TOKEN"] = token;
    env["RAILYARD_PROCS_PER_POD"] = std::to_string(procs);
    env["RAILYARD_AGENT_DIR"] = (dir / ("agent-" + pod)).string();
    env["RAILYARD_AGENT_GRACE_SECONDS"] = "2";
    env["RAILYARD_AGENT_POLL_MS"] = "200";
    env["TEST_OUT"] = dir.string();
    for (const auto& [k, v] : extra_env) env[k] = v;
    std::vector<std::string> args = {agent_binary(), "agent", "--"};
    args.insert(args.end(), command.begin(), command.end());
    std::vector<std::string> envs;
    for (auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string log_path = log.string();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
  }
  ~AgentProcess() {
    if (running()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
    }
  }
  bool running() {
    if (status != -1) return false;
    int s = 0;
    if (::waitpid(pid, &s, WNOHANG) == pid) {
      status = s;
      return false;
    }
    return true;
  }
  // Exit code, or 128+signal; -1 if still running after `seconds`.
  int wait_exit(double seconds) {
    wait_for([&] { return !running(); }, seconds);
    if (status == -1) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

GenerationSpec spec(int64_t gen, std::vector<std::string> pods, int procs) {
  GenerationSpec s;
  s.job_key = "ns1/job1";
  s.generation = gen;
  s.pods = std::move(pods);
  s.procs_per_pod = procs;
  s.token = kToken;
  int world = static_cast<int>(s.pods.size()) * procs;
  s.config = railyard::parse_worker_config(
      {{"layout", {{"dp", world}, {"tp", 1}, {"pp", 1}}}, {"restore", "/ckpt/gen" + std::to_string(gen)}});
  return s;
}

// Prints the env a worker got, publishes its pid and progress, then runs until signalled (recording SIGTERM).
const char* kWorkerScript = R"(
f="$TEST_OUT/gen$RAILYARD_GENERATION-rank$RANK"
echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $RAILYARD_GENERATION $RAILYARD_RESTORE ${RAILYARD_RENDEZVOUS_TOKEN:-notoken} $RAILYARD_CONFIG ${RAILYARD_STORE_TOKEN:-nostoretoken} ${NCCL_SOCKET_IFNAME-unset} ${NCCL_IB_HCA-unset}" > "$f.tmp" && mv "$f.tmp" "$f.env"
echo "$GROUP_RANK $GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $ROLE_NAME $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $TORCHELASTIC_RUN_ID $TORCHELASTIC_USE_AGENT_STORE" > "$f.torch"
echo $$ > "$f.pid.tmp" && mv "$f.pid.tmp" "$f.pid"
if [ "$RANK" = 0 ]; then
  echo '{"step": 7, "loss": 2.5, "tokens_per_second": 123.0}' > "$RAILYARD_PROGRESS_FILE.tmp" && mv "$RAILYARD_PROGRESS_FILE.tmp" "$RAILYARD_PROGRESS_FILE"
fi
trap 'echo term > "$f.term"; exit 143' TERM
while true; do sleep 0.05; done
)";

// The value of the first sample line of `name` whose labels contain `label` ("" matches any); NaN if absent.
double sample(const std::string& text, const std::string& name, const std::string& label = "") {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || (line.size() > name.size() && line[name.size()] != '{' && line[name.size()] != ' '))
      continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nan("");
}

std::string scrape(const std::string& host, int port) {
  httplib::Client c(host, port);
  c.set_connection_timeout(2);
  auto r = c.Get("/metrics");
  REQUIRE_MESSAGE(r, "no answer from " << host << ":" << port << "/metrics");
  REQUIRE(r->status == 200);
  return r->body;
}

std::vector<std::string> fields(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

}  // namespace

TEST_CASE("agents run workers with the right env, report a kill -9, re-join a new generation, forward SIGTERM") {
  TempDir tmp("railyard-agent-test");
  RendezvousService svc("127.0.0.1", 0);
  ExitLog exit_log(svc);
  const std::vector<std::string> pods = {"pod0", "pod1", "pod2"};
  svc.open_generation(spec(1, pods, 2));
  const std::vector<std::string> cmd = {"sh", "-c", kWorkerScript};
  std::vector<std::unique_ptr<AgentProcess>> agents;
  // Pod IPs 127.0.10.1.. like the node agent's per-pod loopback addresses; pod2 starts last.
  // pod1's agent also serves its metrics (RAILYARD_AGENT_METRICS_PORT), checked after the re-join below.
  const int metrics_port = 9399;
  for (int i : {2, 0, 1}) {
    std::map<std::string, std::string> extra;
    // pod1 also gets NCCL settings as a GPU pod's downward API gives them when the Binding had no socket interface:
    // the empty one must not reach the workers (unset is NCCL's "choose yourself"), the other must.
    if (i == 1)
      extra = {{"RAILYARD_AGENT_METRICS_PORT", std::to_string(metrics_port)},
               {"RAILYARD_NODE_NAME", "n1"},
               {"NCCL_SOCKET_IFNAME", ""},
               {"NCCL_IB_HCA", "=mlx5_0,mlx5_1"}};
    agents.push_back(std::make_unique<AgentProcess>(pods[i], "127.0.10." + std::to_string(i + 1), svc.port(), 2,
                                                    tmp.path, cmd, kToken, "job1", extra));
  }
  auto file = [&](int gen, int rank, const char* ext) {
    return tmp.path / ("gen" + std::to_string(gen) + "-rank" + std::to_string(rank) + "." + ext);
  };
  auto all_env = [&](int gen) {
    for (int r = 0; r < 6; ++r)
      if (!fs::exists(file(gen, r, "env")) || !fs::exists(file(gen, r, "pid"))) return false;
    return true;
  };
  bool started = wait_for([&] { return all_env(1); }, 20);
  if (!started) {
    for (auto& a : agents) MESSAGE(slurp(a->log));
  }
  REQUIRE(started);

  int master_port = -1;
  for (int r = 0; r < 6; ++r) {
    auto f = fields(slurp(file(1, r, "env")));
    REQUIRE(f.size() == 13);
    CHECK(f[0] == std::to_string(r));      // RANK
    CHECK(f[1] == std::to_string(r % 2));  // LOCAL_RANK
    CHECK(f[2] == "6");                    // WORLD_SIZE
    CHECK(f[3] == "2");                    // LOCAL_WORLD_SIZE
    CHECK(f[4] == "127.0.10.1");           // MASTER_ADDR: pod0's IP
    if (master_port < 0) master_port = std::stoi(f[5]);
    CHECK(std::stoi(f[5]) == master_port);  // one bootstrap store for all
    CHECK(master_port > 0);
    CHECK(f[6] == "1");                                                       // RAILYARD_GENERATION
    CHECK(f[7] == "/ckpt/gen1");                                              // RAILYARD_RESTORE
    CHECK(f[8] == "notoken");                                                 // the secret stays in the agent
    CHECK(f[10] == railyard::worker::store_token(kToken, "ns1", "job1", 1));  // the bootstrap store's, per generation
    CHECK(f[11] == "unset");                                                  // empty NCCL_* dropped
    CHECK(f[12] == (r / 2 == 1 ? "=mlx5_0,mlx5_1" : "unset"));                // pod1 holds ranks 2 and 3
    auto config = nlohmann::json::parse(slurp(f[9]));
    CHECK(config["layout"]["dp"] == 6);
    CHECK(config["restore"] == "/ckpt/gen1");
    // The rest of torchrun's environment (docs/programs.md): one role, three pods of two ranks each.
    auto t = fields(slurp(file(1, r, "torch")));
    REQUIRE(t.size() == 9);
    CHECK(t[0] == std::to_string(r / 2));  // GROUP_RANK: the pod's index
    CHECK(t[1] == "3");                    // GROUP_WORLD_SIZE: pods
    CHECK(t[2] == std::to_string(r));      // ROLE_RANK
    CHECK(t[3] == "6");                    // ROLE_WORLD_SIZE
    CHECK(t[4] == "default");              // ROLE_NAME
    CHECK(t[5] == "0");                    // TORCHELASTIC_RESTART_COUNT: generation 1
    CHECK(t[6] == "0");                    // TORCHELASTIC_MAX_RESTARTS: RAILYARD_MAX_RESTARTS unset here
    CHECK(t[7] == "ns1_job1");             // TORCHELASTIC_RUN_ID
    CHECK(t[8] == "False");                // TORCHELASTIC_USE_AGENT_STORE
  }
  // Progress from rank 0's file reaches the service.
  CHECK(wait_for(
      [&] {
        auto p = svc.progress("ns1/job1");
        return p && p->step == 7;
      },
      5));
  CHECK(svc.progress("ns1/job1")->loss == doctest::Approx(2.5));

  // kill -9 one worker: its agent reports the exit at once; nobody else's.
  const pid_t victim = std::stoi(slurp(file(1, 3, "pid")));
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(wait_for([&] { return exit_log.size() > 0; }, 5));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    REQUIRE(exits.size() == 1);
    CHECK(exits[0].generation == 1);
    CHECK(exits[0].pod == "pod1");
    CHECK(exits[0].global_rank == 3);
    CHECK(exits[0].signal == 9);
    CHECK(exits[0].reason == "exited");
  }

  // The operator opens generation 2: agents stop the old workers and re-join in place.
  auto t0 = Clock::now();
  svc.open_generation(spec(2, pods, 2));
  bool regen = wait_for([&] { return all_env(2); }, 20);
  if (!regen) {
    for (auto& a : agents) MESSAGE(slurp(a->log));
  }
  REQUIRE(regen);
  MESSAGE("new generation running after " << std::chrono::duration<double>(Clock::now() - t0).count() << " s");
  for (int r = 0; r < 6; ++r) {
    if (r != 3) CHECK_MESSAGE(fs::exists(file(1, r, "term")), "rank " << r << " of gen 1 got no SIGTERM");
    const pid_t old = std::stoi(slurp(file(1, r, "pid")));
    CHECK(::kill(old, 0) == -1);  // gone
    auto f = fields(slurp(file(2, r, "env")));
    REQUIRE(f.size() == 13);
    CHECK(f[0] == std::to_string(r));
    CHECK(f[10] == railyard::worker::store_token(kToken, "ns1", "job1", 2));
    CHECK(f[6] == "2");
    CHECK(f[7] == "/ckpt/gen2");
    CHECK(fields(slurp(file(2, r, "torch")))[5] == "1");  // TORCHELASTIC_RESTART_COUNT: one restart
  }
  for (auto& a : agents) CHECK(a->running());  // re-joined in place, no agent restart

  // pod1's agent counted all of it: two generations (one in-place restart), two rounds of rendezvous, four worker
  // starts, the kill -9 as "signaled" and its SIGTERM'd rank 2 (the script exits 143) as "failed".
  {
    const std::string m = scrape("127.0.10.2", metrics_port);
    INFO(m);
    CHECK(sample(m, "railyard_agent_generation", "pod=\"pod1\"") == 2);
    CHECK(sample(m, "railyard_agent_generations_total") == 2);
    CHECK(sample(m, "railyard_agent_rendezvous_wait_seconds_count") == 2);
    CHECK(sample(m, "railyard_agent_rendezvous_wait_seconds_sum") > 0);
    CHECK(sample(m, "railyard_agent_worker_starts_total") == 4);
    CHECK(sample(m, "railyard_agent_worker_exits_total", "outcome=\"signaled\"") == 1);
    CHECK(sample(m, "railyard_agent_worker_exits_total", "outcome=\"failed\"") == 1);
    CHECK(sample(m, "railyard_agent_worker_exits_total", "outcome=\"succeeded\"") == 0);
    CHECK(m.find("node=\"n1\"") != std::string::npos);
  }
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    CHECK(exits.size() == 1);  // the workers stopped for the new generation are not reported as failures
  }

  // SIGTERM to pod2's agent (replica 2, ranks 4 and 5) reaches its workers, is reported as "stopped", and the
  // agent exits 128+15.
  AgentProcess& pod2 = *agents[0];
  REQUIRE(::kill(pod2.pid, SIGTERM) == 0);
  CHECK(pod2.wait_exit(10) == 143);
  CHECK(fs::exists(file(2, 4, "term")));
  CHECK(fs::exists(file(2, 5, "term")));
  CHECK(::kill(std::stoi(slurp(file(2, 4, "pid"))), 0) == -1);
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    int stopped = 0;
    for (const auto& e : exits)
      if (e.generation == 2 && e.pod == "pod2" && e.reason == "stopped") ++stopped;
    CHECK(stopped == 2);
  }

  // Closing the job stops the remaining agents; their workers had not succeeded, so they exit 1.
  svc.close_job("ns1/job1");
  CHECK(agents[1]->wait_exit(10) == 1);
  CHECK(agents[2]->wait_exit(10) == 1);
  CHECK(::kill(std::stoi(slurp(file(2, 0, "pid"))), 0) == -1);
}

TEST_CASE("agents exit 0 once every rank succeeded and the service says the job is done") {
  TempDir tmp("railyard-agent-test");
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"pod0", "pod1"}, 1));
  // pod1's worker finishes a second after pod0's: pod0's agent must wait for the whole job, not just its workers.
  // Each worker also creates an in-memory checkpoint segment under the prefix its agent gives it: the agent owns it
  // and removes it when it ends; a segment left by an earlier agent of pod0 is removed when the new one starts.
  const std::string leftover = "/dev/shm/railyard-ns1_pod0-0123456789abcdef-r0-a";
  std::ofstream(leftover) << "x";
  const std::vector<std::string> cmd = {
      "sh", "-c",
      "echo \"$RAILYARD_SHM_PREFIX\" > \"$TEST_OUT/shm-$RANK\"; echo x > \"/dev/shm$RAILYARD_SHM_PREFIX-r$RANK-a\"; "
      "[ \"$RANK\" = 1 ] && sleep 1; exit 0"};
  AgentProcess a0("pod0", "127.0.11.1", svc.port(), 1, tmp.path, cmd);
  AgentProcess a1("pod1", "127.0.11.2", svc.port(), 1, tmp.path, cmd);
  CHECK(a0.wait_exit(20) == 0);
  CHECK(a1.wait_exit(20) == 0);
  CHECK_FALSE(fs::exists(leftover));
  for (int r = 0; r < 2; ++r) {
    std::string prefix = slurp(tmp.path / ("shm-" + std::to_string(r)));
    while (!prefix.empty() && prefix.back() == '\n') prefix.pop_back();
    CHECK_MESSAGE(prefix.rfind("/railyard-ns1_pod" + std::to_string(r) + "-", 0) == 0, prefix);
    CHECK_MESSAGE(!fs::exists("/dev/shm" + prefix + "-r" + std::to_string(r) + "-a"), "segment left: " << prefix);
  }
  auto p = svc.progress("ns1/job1");
  REQUIRE(p);
  CHECK(p->all_succeeded);
  CHECK(p->ranks_done == 2);
}

TEST_CASE("a refused token or missing env ends the agent with exit 2 and a clear message") {
  TempDir tmp("railyard-agent-test");
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"pod0"}, 1));
  // A wrong token looks like an unknown job (the service does not say which job names exist): the agent retries for
  // RAILYARD_AGENT_UNREACHABLE_SECONDS, then exits 2.
  AgentProcess bad("pod0", "127.0.12.1", svc.port(), 1, tmp.path, {"true"}, "not-the-token", "job1",
                   {{"RAILYARD_AGENT_UNREACHABLE_SECONDS", "2"}});
  CHECK(bad.wait_exit(15) == 2);
  CHECK(slurp(bad.log).find("refused the token") != std::string::npos);

  // No RAILYARD_POD_IP etc.: run the binary with an almost empty environment.
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  std::string log = (tmp.path / "noenv.log").string();
  std::string bin = agent_binary();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    char* argv[] = {bin.data(), const_cast<char*>("agent"), nullptr};
    char* envp[] = {const_cast<char*>("RAILYARD_JOB_NAMESPACE=ns1"), nullptr};
    ::execve(argv[0], argv, envp);
    ::_exit(127);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(slurp(log).find("RAILYARD_JOB_NAME is not set") != std::string::npos);
}

TEST_CASE(
    "after an operator outage longer than RAILYARD_AGENT_UNREACHABLE_SECONDS agents keep their workers, re-attach, and "
    "deliver exits made meanwhile") {
  TempDir tmp("railyard-agent-test");
  auto svc = std::make_unique<RendezvousService>("127.0.0.1", 0);
  const int port = svc->port();
  const std::vector<std::string> pods = {"pod0", "pod1"};
  svc->open_generation(spec(5, pods, 1));
  const std::vector<std::string> cmd = {"sh", "-c", kWorkerScript};
  // The limit applies only to an agent without running workers: training outlives its control plane.
  const std::map<std::string, std::string> limit = {{"RAILYARD_AGENT_UNREACHABLE_SECONDS", "1"}};
  AgentProcess a0("pod0", "127.0.13.1", port, 1, tmp.path, cmd, kToken, "job1", limit);
  AgentProcess a1("pod1", "127.0.13.2", port, 1, tmp.path, cmd, kToken, "job1", limit);
  auto file = [&](int rank, const char* ext) { return tmp.path / ("gen5-rank" + std::to_string(rank) + "." + ext); };
  REQUIRE(wait_for([&] { return fs::exists(file(0, "pid")) && fs::exists(file(1, "pid")); }, 20));
  const std::string env0 = slurp(file(0, "env"));
  const pid_t w0 = std::stoi(slurp(file(0, "pid")));
  const pid_t w1 = std::stoi(slurp(file(1, "pid")));

  // The leader goes away for twice the limit; while it is gone, pod1's worker dies.
  svc.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  REQUIRE(::kill(w1, SIGKILL) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(a0.running());
  CHECK(a1.running());

  // A new leader serves the same address and re-opens the current generation.
  RendezvousService again("127.0.0.1", port);
  ExitLog exit_log(again);
  again.open_generation(spec(5, pods, 1));
  REQUIRE(wait_for(
      [&] {
        auto p = again.progress("ns1/job1");
        return p && p->world_complete;
      },
      15));
  CHECK(wait_for([&] { return exit_log.size() == 1; }, 10));
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    REQUIRE(exits.size() == 1);
    CHECK(exits[0].global_rank == 1);
    CHECK(exits[0].signal == 9);
  }
  // pod0's worker was neither restarted nor signalled, and its world is the same.
  CHECK(::kill(w0, 0) == 0);
  CHECK_FALSE(fs::exists(file(0, "term")));
  CHECK(slurp(file(0, "env")) == env0);
  CHECK(a0.running());
  CHECK(a1.running());
  again.close_job("ns1/job1");
  CHECK(a0.wait_exit(10) == 1);
  CHECK(a1.wait_exit(10) == 1);
}

TEST_CASE("with no workers running, an unreachable service ends the agent with the retryable exit 201") {
  TempDir tmp("railyard-agent-test");
  int port = 0;
  {
    RendezvousService probe("127.0.0.1", 0);  // a port that was free a moment ago and now has no listener
    port = probe.port();
  }
  ::setenv("RAILYARD_AGENT_UNREACHABLE_SECONDS", "1", 1);
  AgentProcess a("pod0", "127.0.14.1", port, 1, tmp.path, {"true"});
  ::unsetenv("RAILYARD_AGENT_UNREACHABLE_SECONDS");
  CHECK(a.wait_exit(30) == railyard::rdzv::kAgentExitUnreachable);
  CHECK(slurp(a.log).find("unreachable") != std::string::npos);
}

TEST_CASE("fenced: an agent whose pod was replaced under its name kills its workers at once and exits 202") {
  TempDir tmp("railyard-agent-test");
  RendezvousService svc("127.0.0.1", 0);
  std::atomic<int> exits{0};
  svc.set_exit_handler([&](const WorkerExit&) { ++exits; });
  auto g = spec(2, {"pod0"}, 1);
  g.pod_uids = std::map<std::string, std::string>{{"pod0", "uid-old"}};
  svc.open_generation(g);
  const std::vector<std::string> cmd = {"sh", "-c", kWorkerScript};
  AgentProcess a("pod0", "127.0.16.1", svc.port(), 1, tmp.path, cmd, kToken, "job1", {{"RAILYARD_POD_UID", "uid-old"}});
  const fs::path pid_file = tmp.path / "gen2-rank0.pid";
  REQUIRE(wait_for([&] { return fs::exists(pid_file); }, 20));
  const pid_t w = std::stoi(slurp(pid_file));
  // Its node's kubelet died; the operator replaced the pod: another UID holds the name now.
  svc.set_pod_uids("ns1/job1", {{"pod0", "uid-new"}});
  CHECK(a.wait_exit(10) == railyard::rdzv::kAgentExitFenced);
  CHECK(::kill(w, 0) != 0);                               // the worker is gone
  CHECK_FALSE(fs::exists(tmp.path / "gen2-rank0.term"));  // killed, no grace: it writes nothing more
  CHECK(slurp(a.log).find("fenced") != std::string::npos);
  CHECK(exits.load() == 0);  // nothing it said counted
}

TEST_CASE("a worker command that cannot be executed is reported as exit code 127 with a message") {
  TempDir tmp("railyard-agent-test");
  RendezvousService svc("127.0.0.1", 0);
  ExitLog exit_log(svc);
  svc.open_generation(spec(1, {"pod0"}, 1));
  AgentProcess a("pod0", "127.0.15.1", svc.port(), 1, tmp.path, {"/nonexistent/railyard-train"});
  REQUIRE(wait_for([&] { return exit_log.size() > 0; }, 15));
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    CHECK(exits[0].exit_code == 127);
    CHECK(exits[0].signal == 0);
  }
  svc.close_job("ns1/job1");
  CHECK(a.wait_exit(10) == 1);
  CHECK(slurp(a.log).find("cannot exec the worker command \"/nonexistent/railyard-train\"") != std::string::npos);
}

// A program's pod (RAILYARD_AGENT_RANK_METRICS=1): its ranks serve no metrics, the agent serves theirs on
// RAILYARD_METRICS_PORT + local rank from their progress files and output (docs/programs.md), and copies their
// output to its own.
const char* kProgramScript = R"(
p="$RAILYARD_PROGRESS_FILE"
echo $$ > "$TEST_OUT/pid-$RAILYARD_GENERATION-$RANK"
put() { echo "$1" > "$p.tmp" && mv "$p.tmp" "$p"; }
echo "out of rank $RANK generation $RAILYARD_GENERATION"
echo "err of rank $RANK" >&2
if [ "$RAILYARD_GENERATION" = 1 ]; then
  if [ "$RANK" = 0 ]; then
    put '{"step": 5, "loss": 2.5, "tokens_per_second": 100.0, "compute_seconds": 1.0}'; sleep 1
    put '{"step": 10, "loss": 2.25, "tokens_per_second": 110.0, "compute_seconds": 3.0}'
  else
    put '{"step": 5, "loss": NaN, "tokens_per_second": 100.0}'
  fi
fi
echo done > "$TEST_OUT/quiet-$RAILYARD_GENERATION-$RANK"
if [ "$RAILYARD_GENERATION" = 2 ]; then
  [ "$RANK" = 1 ] && exec sleep 600  # blocked for good: the process uses no CPU
  sh -c 'while :; do :; done' &      # computing in a child while this shell waits (a wrapper script's shape)
  wait
fi
while true; do sleep 0.05; done
)";

static int two_free_ports() {
  // Two consecutive ports free on the agent's address (the rank series' ports are base + local rank).
  for (int base = 21000 + (::getpid() % 4000) * 2; base < 65000; base += 2) {
    bool ok = true;
    for (int p : {base, base + 1}) {
      // A plain socket, closed at once (httplib's Server keeps its listening socket and reuses the port).
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(p));
      ::inet_pton(AF_INET, "127.0.12.1", &a.sin_addr);
      if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ok = false;
      if (fd >= 0) ::close(fd);
    }
    if (ok) return base;
  }
  FAIL("no two consecutive free ports");
  return -1;
}

TEST_CASE("a program's ranks: the agent serves their series from progress and output, and copies the output") {
  TempDir tmp("railyard-agent-test");
  RendezvousService svc("127.0.0.1", 0);
  svc.open_generation(spec(1, {"pod0"}, 2));
  const int port = two_free_ports();
  const double t_start = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  AgentProcess a("pod0", "127.0.12.1", svc.port(), 2, tmp.path, {"sh", "-c", kProgramScript}, kToken, "job1",
                 {{"RAILYARD_AGENT_RANK_METRICS", "1"},
                  {"RAILYARD_METRICS_PORT", std::to_string(port)},
                  {"RAILYARD_NODE_NAME", "n7"}});
  auto scraped = [&](int local_rank) {  // "" while the agent is not serving yet
    httplib::Client c("127.0.12.1", port + local_rank);
    c.set_connection_timeout(2);
    auto r = c.Get("/metrics");
    return r && r->status == 200 ? r->body : std::string();
  };
  const bool stepped = wait_for(
      [&] {
        return fs::exists(tmp.path / "quiet-1-0") && fs::exists(tmp.path / "quiet-1-1") &&
               sample(scraped(0), "railyard_worker_step") == 10 && sample(scraped(1), "railyard_worker_step") == 5;
      },
      20);
  if (!stepped) MESSAGE(slurp(a.log));
  REQUIRE(stepped);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // one more agent poll after the last output
  const std::string m0 = scraped(0), m1 = scraped(1);
  INFO(m0, m1);
  const std::string r0 = "rank=\"0\"";
  CHECK(
      m0.find(
          "railyard_worker_step{generation=\"1\",namespace=\"ns1\",node=\"n7\",rank=\"0\",trainingjob=\"job1\"} 10") !=
      std::string::npos);
  CHECK(sample(m0, "railyard_worker_steps_total", r0) == 5);  // 5 -> 10 within the generation
  CHECK(sample(m0, "railyard_worker_loss", r0) == doctest::Approx(2.25));
  CHECK(sample(m0, "railyard_worker_tokens_per_second", r0) == doctest::Approx(110));
  CHECK(sample(m0, "railyard_worker_step_phase_seconds_total", "phase=\"compute\"") == doctest::Approx(2.0));
  // A histogram as the trainer serves it: records at steps 5 and 10, ~1 s apart, are 5 observations of their mean.
  CHECK(m0.find("# TYPE railyard_worker_step_duration_seconds histogram") != std::string::npos);
  CHECK(sample(m0, "railyard_worker_step_duration_seconds_count", r0) == 5);
  const double d = sample(m0, "railyard_worker_step_duration_seconds_sum", r0) / 5;
  CHECK(d > 0.1);
  CHECK(d < 1.0);
  CHECK(sample(m0, "railyard_worker_last_step_timestamp_seconds", r0) > t_start);
  CHECK(sample(m0, "railyard_worker_nonfinite_total", r0) == 0);
  // Python's json.dump writes a NaN loss as a bare NaN: read, counted, and not sent to the job's status.
  CHECK(std::isnan(sample(m1, "railyard_worker_loss", "rank=\"1\"")));
  CHECK(sample(m1, "railyard_worker_nonfinite_total", "rank=\"1\"") == 1);
  REQUIRE(svc.progress("ns1/job1"));
  CHECK(svc.progress("ns1/job1")->loss == doctest::Approx(2.25));
  // The output clock: when the rank last wrote, not when it was scraped; it stands still while the rank is quiet.
  const double out0 = sample(m0, "railyard_worker_last_output_timestamp_seconds", r0);
  CHECK(out0 > t_start);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  CHECK(sample(scraped(0), "railyard_worker_last_output_timestamp_seconds", r0) == out0);
  // The ranks' output reached the agent's, stream for stream (stdout and stderr go to one log file here).
  const std::string log = slurp(a.log);
  CHECK(log.find("out of rank 0 generation 1") != std::string::npos);
  CHECK(log.find("out of rank 1 generation 1") != std::string::npos);
  CHECK(log.find("err of rank 1") != std::string::npos);

  // A stopped rank (SIGSTOP, as a hang is injected): the agent sees its state and serves when it first saw it stopped;
  // 0 again once it runs (the monitor's `stopped` rule reads it).
  CHECK(sample(m1, "railyard_worker_process_stopped_since_timestamp_seconds", "rank=\"1\"") == 0);
  const pid_t rank1 = std::stoi(slurp(tmp.path / "pid-1-1"));
  const double before_stop = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  REQUIRE(::kill(rank1, SIGSTOP) == 0);
  double since = 0;
  const bool seen = wait_for(
      [&] {
        since = sample(scraped(1), "railyard_worker_process_stopped_since_timestamp_seconds", "rank=\"1\"");
        return since > 0;
      },
      5);
  ::kill(rank1, SIGCONT);
  REQUIRE(seen);
  CHECK(since >= before_stop - 0.01);
  CHECK(since < before_stop + 3);
  CHECK(sample(scraped(0), "railyard_worker_process_stopped_since_timestamp_seconds", r0) == 0);  // rank 0 ran on
  CHECK(wait_for(
      [&] { return sample(scraped(1), "railyard_worker_process_stopped_since_timestamp_seconds", "rank=\"1\"") == 0; },
      5));

  // A new generation: generation 1's series are gone; generation 2's ranks have their output clock but no step
  // series until they report one (this script reports none in generation 2: the silence rule's case).
  svc.open_generation(spec(2, {"pod0"}, 2));
  REQUIRE(wait_for([&] { return fs::exists(tmp.path / "quiet-2-0") && fs::exists(tmp.path / "quiet-2-1"); }, 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const std::string g2 = scraped(0);
  INFO(g2);
  CHECK(g2.find("generation=\"1\"") == std::string::npos);
  CHECK(sample(g2, "railyard_worker_last_output_timestamp_seconds", "generation=\"2\"") >= out0);
  CHECK(std::isnan(sample(g2, "railyard_worker_step")));
  CHECK(slurp(a.log).find("out of rank 0 generation 2") != std::string::npos);
  // CPU time (the monitor's `idle` rule): rank 1, blocked in a sleep, is served idle since about when it stopped
  // computing; rank 0, whose shell waits while its child computes, 0 (the rank's whole process tree counts).
  double idle1 = 0;
  const bool idle_seen = wait_for(
      [&] {
        idle1 = sample(scraped(1), "railyard_worker_cpu_idle_since_timestamp_seconds", "rank=\"1\"");
        return idle1 > 0;
      },
      5);
  CHECK(idle_seen);
  const double now_idle = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(idle1 > t_start);
  CHECK(idle1 <= now_idle);
  CHECK(sample(scraped(0), "railyard_worker_cpu_idle_since_timestamp_seconds", "rank=\"0\"") == 0);
  svc.close_job("ns1/job1");
  CHECK(a.wait_exit(10) == 1);
}

// torchrun mode's rank: a plain Python script (torchrun starts it; no torch needed in it). Writes the environment
// torchrun gave it, reports progress to its own file in RAILYARD_PROGRESS_DIR, and local rank 0 of each pod starts a
// process in a session of its own (torch >= 2 starts ranks that way; a signal to torchrun's group never reaches it).
// Generation 3 succeeds at once.
const char* kTorchrunRank = R"(
import json, os, signal, subprocess, sys, time
e = os.environ
out = os.path.join(e["TEST_OUT"], "tr-gen%s-rank%s" % (e["RAILYARD_GENERATION"], e["RANK"]))
if e["RAILYARD_GENERATION"] == "3":
    sys.exit(0)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "RAILYARD_GENERATION", "RAILYARD_PROGRESS_FILE"]
away = subprocess.Popen(["sleep", "600"], start_new_session=True).pid if e["LOCAL_RANK"] == "0" else 0
with open(out + ".tmp", "w") as f:
    f.write(" ".join(e.get(k, "unset") for k in keys) + " %d %d %d\n" % (os.getpid(), os.getppid(), away))
os.replace(out + ".tmp", out + ".env")
p = os.path.join(e["RAILYARD_PROGRESS_DIR"], "progress-%s.json" % e["LOCAL_RANK"])
with open(p + ".tmp", "w") as f:
    json.dump({"step": 20 + int(e["RANK"]), "loss": 1.5}, f)
os.replace(p + ".tmp", p)
def term(*_):
    open(out + ".term", "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(0.05)
)";

bool ports_free(const char* ip, int base, int n) {
  for (int p = base; p < base + n; ++p) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(p));
    ::inet_pton(AF_INET, ip, &a.sin_addr);
    const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    if (!ok) return false;
  }
  return true;
}

TEST_CASE(
    "torchrun mode: the real torchrun gets the world through PET_*, its failed rank is reported, restarts end "
    "its whole tree, success counts every rank") {
  // Debian 12's torchrun (torch 1.13) under Python 3.11 through the example image's wrapper of its start-up bug.
  REQUIRE_MESSAGE(::system("/usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null") == 0,
                  "python3-torch is missing (scripts/install-deps.sh --with-torch installs it)");
  TempDir tmp("railyard-agent-test");
  const fs::path script = tmp.path / "rank.py";
  std::ofstream(script) << kTorchrunRank;
  RendezvousService svc("127.0.0.1", 0);
  ExitLog exit_log(svc);
  const std::vector<std::string> pods = {"pod0", "pod1"};
  svc.open_generation(spec(1, pods, 2));
  const std::vector<std::string> cmd = {"/usr/bin/python3",
                                        railyard::test::source_path("deploy/examples/pytorch/torchrun"),
                                        "--monitor_interval=0.1", script.string()};
  int metrics = 23000 + (::getpid() % 3000) * 2;
  while (!ports_free("127.0.14.2", metrics, 2)) metrics += 2;
  std::vector<std::unique_ptr<AgentProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    std::map<std::string, std::string> extra = {{"RAILYARD_LAUNCHER", "torchrun"}, {"RAILYARD_MAX_RESTARTS", "5"}};
    if (i == 1) {
      extra["RAILYARD_AGENT_RANK_METRICS"] = "1";
      extra["RAILYARD_METRICS_PORT"] = std::to_string(metrics);
    }
    agents.push_back(std::make_unique<AgentProcess>(pods[i], "127.0.14." + std::to_string(i + 1), svc.port(), 2,
                                                    tmp.path, cmd, kToken, "job1", extra));
  }
  auto env_of = [&](int gen, int rank) {
    return fields(slurp(tmp.path / ("tr-gen" + std::to_string(gen) + "-rank" + std::to_string(rank) + ".env")));
  };
  auto all_env = [&](int gen) {
    for (int r = 0; r < 4; ++r)
      if (env_of(gen, r).size() != 14) return false;
    return true;
  };
  const auto t0 = Clock::now();
  const bool started = wait_for([&] { return all_env(1); }, 60);
  if (!started)
    for (auto& a : agents) MESSAGE(slurp(a->log));
  REQUIRE(started);
  MESSAGE("two torchruns started four ranks in " << std::chrono::duration<double>(Clock::now() - t0).count() << " s");
  pid_t torchrun1 = -1;
  for (int r = 0; r < 4; ++r) {
    const auto f = env_of(1, r);
    INFO("rank " << r);
    CHECK(f[0] == std::to_string(r));      // torchrun's numbering is the rendezvous': pod index x 2 + local rank
    CHECK(f[1] == std::to_string(r % 2));  // LOCAL_RANK
    CHECK(f[2] == "4");                    // WORLD_SIZE: 2 pods (PET_NNODES) x 2 (PET_NPROC_PER_NODE)
    CHECK(f[3] == "2");
    CHECK(f[4] == std::to_string(r / 2));  // GROUP_RANK: PET_NODE_RANK
    CHECK(f[5] == "127.0.14.1");           // pod 0, where its torchrun serves the store (PET_MASTER_ADDR)
    CHECK(f[7] == "0");                    // PET_MAX_RESTARTS: torchrun's own restarts off
    CHECK(f[8] == "ns1_job1");             // PET_RDZV_ID
    CHECK(f[9] == "1");
    CHECK(f[10] == "unset");  // no RAILYARD_PROGRESS_FILE shared by all ranks
    if (r == 2) torchrun1 = std::stoi(f[12]);
  }
  // Each local rank's progress file: global rank 0's reaches the service, pod1's local rank 1 its own series.
  CHECK(wait_for(
      [&] {
        auto p = svc.progress("ns1/job1");
        return p && p->step == 20;
      },
      10));
  auto scraped = [&](int local_rank) {
    httplib::Client c("127.0.14.2", metrics + local_rank);
    c.set_connection_timeout(2);
    auto r = c.Get("/metrics");
    return r && r->status == 200 ? r->body : std::string();
  };
  CHECK(wait_for([&] { return sample(scraped(1), "railyard_worker_step", "rank=\"3\"") == 23; }, 10));
  CHECK(sample(scraped(0), "railyard_worker_step", "rank=\"2\"") == 22);
  // A stopped rank is seen among torchrun's children (the agent reads their LOCAL_RANK), not torchrun itself.
  const pid_t rank3 = std::stoi(env_of(1, 3)[11]);
  REQUIRE(::kill(rank3, SIGSTOP) == 0);
  CHECK(wait_for(
      [&] { return sample(scraped(1), "railyard_worker_process_stopped_since_timestamp_seconds", "rank=\"3\"") > 0; },
      5));
  CHECK(sample(scraped(0), "railyard_worker_process_stopped_since_timestamp_seconds", "rank=\"2\"") == 0);
  ::kill(rank3, SIGCONT);

  // kill -9 of global rank 3: torchrun ends its other rank and exits 1; the agent reports rank 3 killed by signal 9.
  REQUIRE(::kill(rank3, SIGKILL) == 0);
  const bool reported = wait_for([&] { return exit_log.size() > 0; }, 30);
  if (!reported) {
    for (auto& a : agents) MESSAGE(slurp(a->log));
    (void)!::system("ps -eo pid,ppid,pgid,sid,stat,wchan:20,cmd | grep -E 'rank.py|torchrun|sleep 600' >&2");
  }
  REQUIRE(reported);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    REQUIRE(exits.size() == 1);
    CHECK(exits[0].pod == "pod1");
    CHECK(exits[0].global_rank == 3);
    CHECK(exits[0].signal == 9);
    CHECK(exits[0].reason == "exited");
    // torchrun's line naming the failed rank, reported before its exit barrier lets it print its summary.
    CHECK(exits[0].message.find("failed (exitcode: -9) local_rank: 1") != std::string::npos);
  }

  // Generation 2: pod0's torchrun, still running, is stopped with its ranks and everything they started; both pods
  // start torchrun again.
  std::vector<pid_t> gen1;
  for (int r = 0; r < 4; ++r) {
    const auto f = env_of(1, r);
    gen1.push_back(std::stoi(f[11]));                    // the rank
    gen1.push_back(std::stoi(f[12]));                    // its torchrun
    if (f[13] != "0") gen1.push_back(std::stoi(f[13]));  // what it started in a session of its own
  }
  CHECK(gen1.size() == 10);
  svc.open_generation(spec(2, pods, 2));
  const bool regen = wait_for([&] { return all_env(2); }, 60);
  if (!regen)
    for (auto& a : agents) MESSAGE(slurp(a->log));
  REQUIRE(regen);
  auto alive = [](pid_t p) {
    std::ifstream in("/proc/" + std::to_string(p) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    const size_t close = stat.rfind(')');
    return in && close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
  };
  for (pid_t p : gen1) CHECK_MESSAGE(!alive(p), "process " << p << " of generation 1 outlived its torchrun");
  CHECK(fs::exists(tmp.path / "tr-gen1-rank0.term"));  // pod0's ranks were stopped through torchrun (SIGTERM)
  CHECK(std::stoi(env_of(2, 2)[12]) != torchrun1);     // a new torchrun
  {
    const std::vector<WorkerExit> exits = exit_log.all();
    CHECK(exits.size() == 1);  // ranks stopped for a new generation are no failures
  }

  // Generation 3: every rank exits 0, so each torchrun does; each agent reports both its ranks, the service counts
  // four, calls the job done and the agents exit 0.
  svc.open_generation(spec(3, pods, 2));
  CHECK(agents[0]->wait_exit(60) == 0);
  CHECK(agents[1]->wait_exit(60) == 0);
  auto p = svc.progress("ns1/job1");
  REQUIRE(p);
  CHECK(p->all_succeeded);
  CHECK(p->ranks_done == 4);
}

// A program's rank with flash checkpoints (worker/agent/python/railyard_flash.py, on PYTHONPATH from the agent): a
// small data-parallel model over Gloo, a snapshot into shared memory after every step before the progress record, and
// at the end the SHA-256 of its parameters.
const char* kFlashRank = R"(
import hashlib, json, os, sys, time
import torch, torch.distributed as dist
from railyard_flash import Checkpoint
out, gen, rank = os.environ["TEST_OUT"], os.environ.get("RAILYARD_GENERATION", "ref"), int(os.environ["RANK"])
f = f"{out}/flash-gen{gen}-rank{rank}"
with open(f + ".pid.tmp", "w") as p:
    p.write(str(os.getpid()))
os.replace(f + ".pid.tmp", f + ".pid")
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ckpt = Checkpoint(replicated=True)
start = ckpt.load({"model": model, "opt": opt}) + 1
with open(f + ".restored", "w") as r:
    json.dump({"step": start - 1, "from": ckpt.restored_from, "pythonpath": os.environ.get("PYTHONPATH", "")}, r)
progress = os.environ.get("RAILYARD_PROGRESS_FILE", "")
for step in range(start, 121):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 31 + rank))
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    ckpt.save(step, {"model": model, "opt": opt})  # before the step is reported: a reported step is held
    if progress:
        with open(progress + ".tmp", "w") as pf:
            json.dump({"step": step, "loss": loss.item()}, pf)
        os.replace(progress + ".tmp", progress)
    with open(f"{out}/flash-steps-{gen}-rank{rank}", "a") as d:  # where a run departs from the reference, if it does
        d.write(f"{step} {hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()}\n")
    time.sleep(0.05)
ckpt.close()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
with open(f"{out}/flash-final-{gen}-rank{rank}", "w") as d:
    d.write(digest)
sys.stdout.flush()
os._exit(0)
)";

TEST_CASE(
    "flash checkpoints: the agent delivers railyard_flash; a kill -9 restores from memory with no step lost, a "
    "replaced pod from its peer's copy, and the run ends with an undisturbed run's parameters") {
  REQUIRE_MESSAGE(::system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") == 0,
                  "python3-torch is missing (scripts/install-deps.sh --with-torch installs it)");
  TempDir tmp("railyard-agent-test");
  const fs::path script = tmp.path / "flash_rank.py";
  std::ofstream(script) << kFlashRank;
  const std::vector<std::string> cmd = {"/usr/bin/python3", script.string()};

  // The undisturbed run: the same two ranks without the agent (the module from the source tree, a fresh start).
  {
    int port = 29400 + (::getpid() % 500) * 2;
    while (!ports_free("127.0.0.1", port, 1)) port += 2;
    const std::string prefix = "/railyard-flashref-" + std::to_string(::getpid());
    std::vector<pid_t> ranks;
    for (int r = 0; r < 2; ++r) {
      pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::setenv("PYTHONPATH", railyard::test::source_path("worker/agent/python").c_str(), 1);
        ::setenv("TEST_OUT", tmp.path.c_str(), 1);
        ::setenv("RANK", std::to_string(r).c_str(), 1);
        ::setenv("WORLD_SIZE", "2", 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        ::setenv("RAILYARD_SHM_PREFIX", prefix.c_str(), 1);
        ::setenv("OMP_NUM_THREADS", "1", 1);
        ::execl("/usr/bin/python3", "python3", script.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      ranks.push_back(pid);
    }
    for (pid_t pid : ranks) {
      int st = 0;
      ::waitpid(pid, &st, 0);
      CHECK(WIFEXITED(st));
      CHECK(WEXITSTATUS(st) == 0);
    }
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/dev/shm", ec))
      if (e.path().filename().string().rfind(prefix.substr(1), 0) == 0) fs::remove(e.path(), ec);
  }
  const std::string reference = slurp(tmp.path / "flash-final-ref-rank0");
  REQUIRE(reference.size() == 64);
  CHECK(slurp(tmp.path / "flash-final-ref-rank1") == reference);

  RendezvousService svc("127.0.0.1", 0);
  ExitLog exit_log(svc);
  auto flash_spec = [&](int64_t gen) {
    GenerationSpec s = spec(gen, {"pod0", "pod1"}, 1);
    s.config.checkpoint.emplace().memory_interval_steps = 1;  // the in-memory tier on: the agents keep peer copies
    return s;
  };
  // The ranks under the agents see what the reference's saw: OpenBLAS picks its kernels (and so the last bits of a
  // GEMM) from OPENBLAS_CORETYPE, which some machines set.
  std::map<std::string, std::string> env = {{"OMP_NUM_THREADS", "1"}};
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("OPENBLAS_", 0) == 0) env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  svc.open_generation(flash_spec(1));
  auto pod0 = std::make_unique<AgentProcess>("pod0", "127.0.16.1", svc.port(), 1, tmp.path, cmd, kToken, "job1", env);
  auto pod1 = std::make_unique<AgentProcess>("pod1", "127.0.16.2", svc.port(), 1, tmp.path, cmd, kToken, "job1", env);
  auto step_now = [&] {
    auto p = svc.progress("ns1/job1");
    return p ? p->step : int64_t{0};
  };
  auto restored = [&](int gen, int rank) {
    const std::string t =
        slurp(tmp.path / ("flash-gen" + std::to_string(gen) + "-rank" + std::to_string(rank) + ".restored"));
    return t.empty() ? nlohmann::json() : nlohmann::json::parse(t, nullptr, false);
  };
  auto pid_of = [&](int gen, int rank) {
    return std::stoi(slurp(tmp.path / ("flash-gen" + std::to_string(gen) + "-rank" + std::to_string(rank) + ".pid")));
  };
  auto dump_logs = [&] {
    MESSAGE(slurp(pod0->log));
    MESSAGE(slurp(pod1->log));
  };
  const bool trained = wait_for([&] { return step_now() >= 15; }, 90);
  if (!trained) dump_logs();
  REQUIRE(trained);
  {
    const auto r = restored(1, 1);
    REQUIRE(r.is_object());
    CHECK(r["step"] == 0);  // generation 1 starts fresh
    // The module's folder first on PYTHONPATH: the agent's own copy, not the source tree's.
    CHECK(r["pythonpath"].get<std::string>().rfind((tmp.path / "agent-pod1" / "python").string(), 0) == 0);
  }

  // kill -9 of rank 1 in the middle of training: every step reported so far is held in memory by both ranks.
  REQUIRE(::kill(pid_of(1, 1), SIGKILL) == 0);
  REQUIRE(wait_for([&] { return exit_log.size() > 0; }, 30));
  const int64_t reported = step_now();
  svc.open_generation(flash_spec(2));
  const bool back = wait_for([&] { return restored(2, 0).is_object() && restored(2, 1).is_object(); }, 60);
  if (!back) dump_logs();
  REQUIRE(back);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << restored(2, r).dump());
    CHECK(restored(2, r)["from"] == "memory");
    CHECK(restored(2, r)["step"].get<int64_t>() >= reported);  // no reported step is trained again
  }
  CHECK(restored(2, 0)["step"] == restored(2, 1)["step"]);
  MESSAGE("kill -9 after step " << reported << " reported: both ranks restored step " << restored(2, 0)["step"]
                                << " from memory");

  // Rank 1's pod goes with its memory while training, `sig` to its agent, and generation `gen` opens with a new pod1:
  // the replacement fetches rank 1's copy from pod0 and both restore one step, rank 0 from its memory.
  auto replace_pod1 = [&](int gen, int sig) {
    const int64_t start = restored(gen - 1, 0)["step"].get<int64_t>();
    REQUIRE(wait_for([&] { return step_now() >= start + 10; }, 60));
    ::kill(pod1->pid, sig);
    pod1->wait_exit(30);
    const int64_t reported_then = step_now();
    svc.open_generation(flash_spec(gen));
    pod1 = std::make_unique<AgentProcess>("pod1", "127.0.16.2", svc.port(), 1, tmp.path, cmd, kToken, "job1", env);
    const bool back_again = wait_for([&] { return restored(gen, 0).is_object() && restored(gen, 1).is_object(); }, 60);
    if (!back_again) dump_logs();
    REQUIRE(back_again);
    INFO("signal " << sig << ", rank 0: " << restored(gen, 0).dump() << " rank 1: " << restored(gen, 1).dump()
                   << " reported " << reported_then);
    if (restored(gen, 1)["from"] != "peer") dump_logs();
    CHECK(restored(gen, 0)["from"] == "memory");
    CHECK(restored(gen, 1)["from"] == "peer");
    CHECK(restored(gen, 0)["step"] == restored(gen, 1)["step"]);
    // The copy lags the snapshot by at most one memory interval (here one step).
    CHECK(restored(gen, 1)["step"].get<int64_t>() >= reported_then - 1);
    CHECK(slurp(pod1->log).find("fetched the peer copies of a rank") != std::string::npos);
  };
  // Lost (agent and rank SIGKILLed, as with a node; the replacement's agent removes what the old one left in this
  // machine's shared /dev/shm), then deleted (SIGTERM, as the kubelet does when a straggler's pod is moved).
  replace_pod1(3, SIGKILL);
  replace_pod1(4, SIGTERM);

  // Both run to the end: the parameters of the run that was never disturbed, bit for bit.
  CHECK(pod0->wait_exit(90) == 0);
  CHECK(pod1->wait_exit(30) == 0);
  CHECK(slurp(tmp.path / "flash-final-4-rank0") == reference);
  CHECK(slurp(tmp.path / "flash-final-4-rank1") == reference);
  // Each generation's steps against the reference's: the first step that differs, if any.
  auto steps = [&](const std::string& gen, int rank) {
    std::map<int, std::string> m;
    std::istringstream in(slurp(tmp.path / ("flash-steps-" + gen + "-rank" + std::to_string(rank))));
    for (int st; in >> st;) in >> m[st];
    return m;
  };
  for (int r = 0; r < 2; ++r) {
    const auto ref = steps("ref", r);
    for (const char* gen : {"1", "2", "3", "4"}) {
      for (const auto& [st, digest] : steps(gen, r)) {
        if (ref.count(st) && ref.at(st) == digest) continue;
        FAIL_CHECK("generation " << gen << " rank " << r << " departs from the reference at step " << st);
        break;
      }
    }
  }
}
