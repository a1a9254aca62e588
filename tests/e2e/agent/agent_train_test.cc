// The real trainer under the real agent: `railyard-worker agent` processes (one per simulated pod, each with its own
// loopback IP) join an in-process RendezvousService and start `railyard-worker train --config $RAILYARD_CONFIG` per
// local rank; the workers join one Gloo world from the agent's environment and train data parallel (2 pods x 1 proc)
// and tensor x pipeline parallel (2 pods x 2 procs, tp=2 pp=2). Both runs report through the agent's progress file
// the same loss as one process training the same global batch.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "operator/rendezvous/rendezvous.h"
#include "tests/ctest_env.h"
#include "tests/e2e/agent/agent_test_util.h"

namespace fs = std::filesystem;
using railyard::op::GenerationSpec;
using railyard::op::RendezvousService;
using Clock = std::chrono::steady_clock;

using railyard::agent_testing::slurp;
using railyard::agent_testing::TempDir;

namespace {

const std::string kToken = "agent-train-test-token-0123456789ab";

std::string bin(const std::string& name) { return railyard::test::bin_path(name.c_str()); }

// One simulated pod running the agent; killed by pid if still running at the end.
struct Agent {
  pid_t pid = -1;
  fs::path log;
  Agent(const std::string& pod, const std::string& ip, int port, int procs, const fs::path& dir) {
    log = dir / (pod + ".log");
    std::vector<std::string> env = {"PATH=" + std::string(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin"),
                                    "RAILYARD_JOB_NAMESPACE=ns1",
                                    "RAILYARD_JOB_NAME=train1",
                                    "RAILYARD_POD_NAME=" + pod,
                                    "RAILYARD_POD_IP=" + ip,
                                    "RAILYARD_RENDEZVOUS_ADDR=127.0.0.1:" + std::to_string(port),
                                    "RAILYARD_RENDEZVOUS_TOKEN=" + kToken,
                                    "RAILYARD_PROCS_PER_POD=" + std::to_string(procs),
                                    "RAILYARD_AGENT_DIR=" + (dir / ("agent-" + pod)).string(),
                                    "RAILYARD_AGENT_GRACE_SECONDS=2",
                                    "RAILYARD_AGENT_POLL_MS=200",
                                    "RAILYARD_NUM_THREADS=1",
                                    "RAILYARD_COMM_TIMEOUT_MS=20000"};
    std::vector<std::string> args = {bin("railyard-worker"),
                                     "agent",
                                     "--",
                                     "/bin/sh",
                                     "-c",
                                     "exec '" + bin("railyard-worker") + "' train --config \"$RAILYARD_CONFIG\""};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string log_path = log.string();
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
  }
  ~Agent() {
    if (pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // Exit code (128 + signal), or -1 after `seconds`.
  int wait_exit(double seconds) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
};

// Model L4 C32 NH4 maxT32 V256, B2 T16, global batch 8 sequences (4 micro-batches), 4 steps.
nlohmann::json job_config(const fs::path& data) {
  return {
      {"model", {{"preset", "custom"}, {"layers", 4}, {"hidden", 32}, {"heads", 4}, {"seqLen", 32}, {"vocab", 256}}},
      {"training", {{"steps", 4}, {"microBatch", 2}, {"seqLen", 16}, {"globalBatch", 8}, {"seed", 7}}},
      {"data", {{"train", data.string()}}}};
}

double single_process_loss(const fs::path& dir) {
  std::ofstream(dir / "single.json") << job_config(dir / "data").dump();
  const std::string cmd = bin("railyard-worker") + " train --config " + (dir / "single.json").string() +
                          " --threads 1 --peak-flops 1e11 --log-json " + (dir / "single.jsonl").string() + " 2> " +
                          (dir / "single.txt").string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  double last = 0;
  std::ifstream f(dir / "single.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["event"] == "step") last = j["loss"].get<double>();
  }
  return last;
}

void run_world(const fs::path& dir, int pods, int procs, int dp, int tp, int pp, double want_loss) {
  RendezvousService svc("127.0.0.1", 0);
  GenerationSpec s;
  s.job_key = "ns1/train1";
  s.generation = 1;
  for (int i = 0; i < pods; ++i) s.pods.push_back("pod" + std::to_string(i));
  s.procs_per_pod = procs;
  s.token = kToken;
  s.config = railyard::parse_worker_config(job_config(dir / "data"));
  s.config.layout = railyard::parse_worker_config({{"layout", {{"dp", dp}, {"tp", tp}, {"pp", pp}}}}).layout;
  svc.open_generation(s);
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = 0; i < pods; ++i) {
    agents.push_back(std::make_unique<Agent>("pod" + std::to_string(i), "127.0.12." + std::to_string(i + 1), svc.port(),
                                             procs, dir));
  }
  for (int i = 0; i < pods; ++i) {
    const int code = agents[i]->wait_exit(90);
    INFO("pod" << i << " log:\n" << slurp(agents[i]->log));
    CHECK(code == 0);
  }
  const auto p = svc.progress("ns1/train1");
  REQUIRE(p);
  CHECK(p->all_succeeded);
  CHECK(p->ranks_done == pods * procs);
  CHECK(p->step == 4);
  CHECK(std::abs(p->loss - want_loss) <= 1e-5 * want_loss);
}

}  // namespace

TEST_CASE("agents run the real trainer as one world: dp=2 over 2 pods, tp=2 x pp=2 over 2 pods x 2 procs") {
  TempDir tmp("railyard-agent-train");
  const std::string prep = bin("railyard") + " data prepare --input /usr/share/common-licenses/GPL-3 --output " +
                           (tmp.path / "data").string() + " > " + (tmp.path / "prep.txt").string() + " 2>&1";
  REQUIRE(std::system(prep.c_str()) == 0);
  const double want = single_process_loss(tmp.path);
  REQUIRE(want > 0);
  SUBCASE("data parallel") { run_world(tmp.path, 2, 1, 2, 1, 1, want); }
  SUBCASE("tensor x pipeline parallel") { run_world(tmp.path, 2, 2, 1, 2, 2, want); }
}
