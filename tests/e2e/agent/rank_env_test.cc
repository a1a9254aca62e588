// What the agent starts each local rank with (worker/agent/rank_env.h): the rank's place in the world as
// torch.distributed.run gives it, the RAILYARD_* worker contract (docs/rendezvous.md "What each worker process
// gets"), and an inherited environment that cannot override any of it or leak the rendezvous token.
#include "worker/agent/rank_env.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/flash_checkpoint.h"
#include "worker/agent/flash_module.h"
#include "worker/agent/name_wait.h"
#include "worker/agent/pod_agent.h"

using railyard::WorkerConfig;
using railyard::rdzv::Assignment;
using railyard::worker::generation_config;
using railyard::worker::inherited_env;
using railyard::worker::rank_env;
using railyard::worker::RankEnvParams;
using railyard::worker::torchrun_env;
using railyard::worker::worker_command;

namespace {

// Pod 1 of 2, two local ranks (global 2 and 3) of a world of 4, generation 3 restoring a checkpoint.
Assignment assignment() {
  Assignment a;
  a.generation = 3;
  a.world_size = 4;
  a.num_pods = 2;
  a.pod_index = 1;
  a.local_world_size = 2;
  a.ranks = {2, 3};
  a.layout.dp = 2;
  a.layout.tp = 2;
  a.layout.pp = 1;
  a.master_addr = "10.0.0.7";
  a.master_port = 29511;
  a.restore = "/ckpt/step-120";
  a.pods = {"job1-0", "job1-1"};
  return a;
}

RankEnvParams params() {
  // Initialized, not assigned member by member: GCC 12's -Wrestrict misfires on std::string assignments here.
  return RankEnvParams{.run_id = "ns1_job1",
                       .max_restarts = "5",
                       .config_path = "/tmp/agent/gen-3/config.json",
                       .progress_file = "/tmp/agent/gen-3/progress-1.json",
                       .progress_dir = "/tmp/agent/gen-3",
                       .shm_prefix = "/railyard-ns1_job1-1-abcd",
                       .peer_steps = {},
                       .store_token = "feedbeef",
                       .peer_tls = nullptr,
                       .master_addr = "",
                       .hostfile = "",
                       .python_path = ""};
}

// name -> every value it has in env, in order (a name set twice would show as two values).
std::map<std::string, std::vector<std::string>> by_name(const std::vector<std::string>& env) {
  std::map<std::string, std::vector<std::string>> m;
  for (const auto& kv : env) {
    const auto eq = kv.find('=');
    REQUIRE(eq != std::string::npos);
    m[kv.substr(0, eq)].push_back(kv.substr(eq + 1));
  }
  return m;
}

// Every name of `want` is set in `env` exactly once, to want's value.
void check_has_once(const std::map<std::string, std::vector<std::string>>& env,
                    const std::map<std::string, std::string>& want) {
  for (const auto& kv : want) {  // not a structured binding: clang before 16 cannot capture one in INFO's lambda
    const std::string& name = kv.first;
    INFO(name);
    REQUIRE(env.count(name) == 1);
    CHECK(env.at(name) == std::vector<std::string>{kv.second});
  }
}

// `want` plus the generation's RAILYARD_* variables for assignment() and params(), which a rank and torchrun's one
// process get alike (the worker contract, docs/worker.md).
std::map<std::string, std::string> with_generation_vars(std::map<std::string, std::string> want) {
  want.insert({
      {"RAILYARD_GENERATION", "3"},
      {"RAILYARD_CONFIG", "/tmp/agent/gen-3/config.json"},
      {"RAILYARD_RESTORE", "/ckpt/step-120"},
      {"RAILYARD_POD_INDEX", "1"},
      {"RAILYARD_NUM_PODS", "2"},
      {"RAILYARD_DP", "2"},
      {"RAILYARD_TP", "2"},
      {"RAILYARD_PP", "1"},
      {"RAILYARD_PROGRESS_DIR", "/tmp/agent/gen-3"},  // + progress-$LOCAL_RANK.json: a rank's RAILYARD_PROGRESS_FILE
      {"RAILYARD_SHM_PREFIX", "/railyard-ns1_job1-1-abcd"},
      {"RAILYARD_STORE_TOKEN", "feedbeef"},
  });
  return want;
}

}  // namespace

TEST_CASE("a rank's environment names its place in the world and the worker contract") {
  const auto env = by_name(rank_env({"PATH=/usr/bin"}, assignment(), 1, params()));
  const std::map<std::string, std::string> want = with_generation_vars({
      {"PATH", "/usr/bin"},
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "4"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_RANK", "3"},
      {"ROLE_WORLD_SIZE", "4"},
      {"ROLE_NAME", "default"},
      {"TORCHELASTIC_RESTART_COUNT", "2"},
      {"TORCHELASTIC_MAX_RESTARTS", "5"},
      {"TORCHELASTIC_RUN_ID", "ns1_job1"},
      {"TORCHELASTIC_USE_AGENT_STORE", "False"},
      {"MASTER_ADDR", "10.0.0.7"},
      {"MASTER_PORT", "29511"},
      {"RAILYARD_PROGRESS_FILE", "/tmp/agent/gen-3/progress-1.json"},  // = RAILYARD_PROGRESS_DIR/progress-1.json
  });
  check_has_once(env, want);
  CHECK(env.size() == want.size());  // nothing else; in particular no RAILYARD_SHM_PEER_STEPS without fetched steps
  CHECK(env.count("RAILYARD_RENDEZVOUS_TOKEN") == 0);
}

TEST_CASE("torchrun mode: the pod's one process gets the world as PET_*, torchrun's own variables are its to set") {
  const char* pod_env[] = {
      "PATH=/usr/bin",
      "PET_NNODES=7",  // a template's stale world: the generation's replaces it
      "PET_MASTER_PORT=1",
      "PET_LOG_DIR=/logs",  // torchrun's other settings stay the user's
      "LOCAL_RANK=5",      "RAILYARD_PROGRESS_FILE=/stale", "RAILYARD_RENDEZVOUS_TOKEN=secret", nullptr};
  const auto env = by_name(torchrun_env(inherited_env(pod_env), assignment(), params()));
  const std::map<std::string, std::string> want = with_generation_vars({
      {"PATH", "/usr/bin"},
      {"PET_LOG_DIR", "/logs"},
      {"PET_NNODES", "2"},          // pods in this generation
      {"PET_NPROC_PER_NODE", "2"},  // local ranks per pod
      {"PET_NODE_RANK", "1"},       // this pod's index: torchrun numbers its ranks 2 and 3, as the rendezvous did
      {"PET_MASTER_ADDR", "10.0.0.7"},
      {"PET_MASTER_PORT", "29511"},
      {"PET_MAX_RESTARTS", "0"},  // Railyard restarts the generation
      {"PET_RDZV_BACKEND", "static"},
      {"PET_RDZV_ID", "ns1_job1"},  // torchrun's TORCHELASTIC_RUN_ID, as per rank
  });
  check_has_once(env, want);
  // Nothing else: no RANK/LOCAL_RANK/WORLD_SIZE/MASTER_*/TORCHELASTIC_* (torchrun sets them per rank; a LOCAL_RANK
  // on torchrun would also make it look like a rank to the agent) and no one RAILYARD_PROGRESS_FILE for all ranks.
  CHECK(env.size() == want.size());
  CHECK(env.count("LOCAL_RANK") == 0);
  CHECK(env.count("RAILYARD_PROGRESS_FILE") == 0);
  CHECK(env.count("RAILYARD_RENDEZVOUS_TOKEN") == 0);
  // Per rank, the PET_* the agent sets for torchrun are dropped too (never a stale world from the template).
  const auto per_rank = by_name(rank_env(inherited_env(pod_env), assignment(), 0, params()));
  CHECK(per_rank.count("PET_NNODES") == 0);
  CHECK(per_rank.at("PET_LOG_DIR") == std::vector<std::string>{"/logs"});
}

TEST_CASE("the first generation counts no restart, and fetched peer steps are passed on") {
  Assignment a = assignment();
  a.generation = 1;
  a.restore = "";
  RankEnvParams p = params();
  p.peer_steps = {100, 120};
  const auto env = by_name(rank_env({}, a, 0, p));
  CHECK(env.at("RANK") == std::vector<std::string>{"2"});
  CHECK(env.at("LOCAL_RANK") == std::vector<std::string>{"0"});
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == std::vector<std::string>{"0"});
  CHECK(env.at("RAILYARD_RESTORE") == std::vector<std::string>{""});  // set, empty: a fresh start
  CHECK(env.at("RAILYARD_SHM_PEER_STEPS") == std::vector<std::string>{"100,120"});
  CHECK(env.count("RAILYARD_SHM_PEER_COPY") == 0);  // no peer copy this generation
  p.peer_copy = true;  // the agent copies the rank's slots to a peer: the trainer keeps what the peer holds
  CHECK(by_name(rank_env({}, a, 0, p)).at("RAILYARD_SHM_PEER_COPY") == std::vector<std::string>{"1"});
}

TEST_CASE("the inherited environment cannot override the rank's variables nor leak the rendezvous token") {
  const char* agent_env[] = {"PATH=/usr/bin",
                             "RANK=99",
                             "WORLD_SIZE=1",
                             "MASTER_ADDR=stale.example",
                             "RAILYARD_CONFIG=/etc/stale.json",
                             "RAILYARD_SHM_PEER_STEPS=7",
                             "RAILYARD_SHM_PEER_COPY=1",
                             "RAILYARD_RENDEZVOUS_TOKEN=secret",
                             "RAILYARD_RENDEZVOUS_CA=-----BEGIN CERTIFICATE-----",
                             "RAILYARD_JOB_NAME=job1",
                             "NCCL_IB_HCA=",
                             "NCCL_DEBUG=INFO",
                             "RANKING=kept",
                             nullptr};
  const std::vector<std::string> inherited = inherited_env(agent_env);
  CHECK(inherited ==
        std::vector<std::string>{"PATH=/usr/bin", "RAILYARD_JOB_NAME=job1", "NCCL_DEBUG=INFO", "RANKING=kept"});

  const auto env = by_name(rank_env(inherited, assignment(), 0, params()));
  CHECK(env.at("RANK") == std::vector<std::string>{"2"});
  CHECK(env.at("WORLD_SIZE") == std::vector<std::string>{"4"});
  CHECK(env.at("MASTER_ADDR") == std::vector<std::string>{"10.0.0.7"});
  CHECK(env.at("RAILYARD_CONFIG") == std::vector<std::string>{"/tmp/agent/gen-3/config.json"});
  CHECK(env.count("RAILYARD_SHM_PEER_STEPS") == 0);
  CHECK(env.count("RAILYARD_SHM_PEER_COPY") == 0);  // a stale one would make the trainer wait for a record
  CHECK(env.count("RAILYARD_RENDEZVOUS_TOKEN") == 0);
  CHECK(env.count("RAILYARD_RENDEZVOUS_CA") == 0);
  CHECK(env.count("NCCL_IB_HCA") == 0);  // set but empty: unset, NCCL's "choose yourself"
  CHECK(env.at("NCCL_DEBUG") == std::vector<std::string>{"INFO"});
}

TEST_CASE("the generation's configuration carries its place in the world") {
  Assignment a = assignment();
  a.config.layout.emplace().dp = 8;  // the operator's layout is completed, not kept
  const WorkerConfig c = generation_config(a);
  REQUIRE(c.layout.has_value());
  CHECK(c.layout->dp == 2);
  CHECK(c.layout->tp == 2);
  CHECK(c.layout->pp == 1);
  CHECK(c.generation == 3);
  CHECK(c.world_size == 4);
  CHECK(c.restore == std::optional<std::string>("/ckpt/step-120"));
}

TEST_CASE("the worker command is the agent's own, else this binary's train subcommand") {
  CHECK(worker_command({"python", "train.py"}, "/c.json") == std::vector<std::string>{"python", "train.py"});
  const auto self = worker_command({}, "/tmp/agent/gen-3/config.json");
  REQUIRE(self.size() == 4);
  CHECK(!self[0].empty());
  CHECK(self[1] == "train");
  CHECK(self[2] == "--config");
  CHECK(self[3] == "/tmp/agent/gen-3/config.json");
}

TEST_CASE("the ranks get the pod's identity under the job's CA, never the CA's key") {
  namespace tls = railyard::tls;
  const tls::CertKey ca = tls::make_job_ca("ns1", "job1");
  RankEnvParams p = params();
  p.peer_tls = std::make_shared<const tls::PodIdentity>(tls::issue_pod_identity(ca, {"10.0.0.8"}));
  const char* pod_env[] = {"RAILYARD_JOB_CA=stale", "RAILYARD_JOB_CA_KEY=secret", "RAILYARD_PEER_TLS_KEY=stale",
                           "HOME=/home", nullptr};
  const auto env = by_name(rank_env(inherited_env(pod_env), assignment(), 0, p));
  CHECK(env.count("RAILYARD_JOB_CA_KEY") == 0);  // the power to issue certificates stays in the agent
  CHECK(env.count("RAILYARD_JOB_CA") == 0);
  CHECK(env.at("RAILYARD_PEER_TLS_CA") == std::vector<std::string>{ca.cert_pem});
  CHECK(env.at("RAILYARD_PEER_TLS_CERT") == std::vector<std::string>{p.peer_tls->leaf.cert_pem});
  CHECK(env.at("RAILYARD_PEER_TLS_KEY") == std::vector<std::string>{p.peer_tls->leaf.key_pem});
  CHECK(env.at("HOME") == std::vector<std::string>{"/home"});
  // Without an identity (an operator without job CAs): none of the three.
  const auto plain = by_name(rank_env(inherited_env(pod_env), assignment(), 0, params()));
  CHECK(plain.count("RAILYARD_PEER_TLS_CA") == 0);
  CHECK(plain.count("RAILYARD_PEER_TLS_KEY") == 0);
}

TEST_CASE("the agent issues its pod's leaf from RAILYARD_JOB_CA and names a malformed one") {
  namespace tls = railyard::tls;
  using railyard::worker::pod_identity;
  ::unsetenv("RAILYARD_JOB_CA");
  ::unsetenv("RAILYARD_JOB_CA_KEY");
  CHECK(pod_identity("10.0.0.8") == nullptr);
  const tls::CertKey ca = tls::make_job_ca("ns1", "job1");
  ::setenv("RAILYARD_JOB_CA", ca.cert_pem.c_str(), 1);
  CHECK_THROWS_WITH_AS(pod_identity("10.0.0.8"), doctest::Contains("only one is set"), railyard::ConfigError);
  ::setenv("RAILYARD_JOB_CA_KEY", ca.key_pem.c_str(), 1);
  auto id = pod_identity("10.0.0.8");
  REQUIRE(id != nullptr);
  CHECK(id->ca_pem == ca.cert_pem);
  CHECK(tls::usable(id->leaf, ca.cert_pem, std::chrono::hours(24)));
  ::setenv("RAILYARD_JOB_CA_KEY", tls::make_job_ca("ns1", "job2").key_pem.c_str(), 1);
  CHECK_THROWS_WITH_AS(pod_identity("10.0.0.8"), doctest::Contains("RAILYARD_JOB_CA_KEY"), railyard::ConfigError);
  ::setenv("RAILYARD_JOB_CA", "not PEM", 1);
  CHECK_THROWS_WITH_AS(pod_identity("10.0.0.8"), doctest::Contains("RAILYARD_JOB_CA (secretKeyRef"),
                       railyard::ConfigError);
  ::unsetenv("RAILYARD_JOB_CA");
  ::unsetenv("RAILYARD_JOB_CA_KEY");
}

TEST_CASE("stable names: MASTER_ADDR and the hostfile's hosts are the pods' DNS names, else their IPs") {
  using railyard::worker::world_hosts;
  Assignment a = assignment();
  a.addresses = {"10.0.0.7", "10.0.0.8"};
  const std::string domain = "job1.ns1.svc.cluster.local";
  auto w = world_hosts(a, domain, true);
  CHECK(w.names);
  CHECK(w.master == "job1-0.job1.ns1.svc.cluster.local");
  CHECK(w.hosts == std::vector<std::string>{"job1-0.job1.ns1.svc.cluster.local", "job1-1.job1.ns1.svc.cluster.local"});
  // No domain (spec.program.addresses IP, the built-in trainer), or the names did not resolve in time: the IPs.
  for (const auto& ip : {world_hosts(a, "", true), world_hosts(a, domain, false)}) {
    CHECK_FALSE(ip.names);
    CHECK(ip.master == "10.0.0.7");
    CHECK(ip.hosts == std::vector<std::string>{"10.0.0.7", "10.0.0.8"});
  }
  // IPv6 is an address too.
  a.addresses = {"fd00::7", "10.0.0.8"};
  CHECK(world_hosts(a, "", false).hosts == std::vector<std::string>{"fd00::7", "10.0.0.8"});
  // An address that is not one (from an agent that sent anything as its pod_ip), or none from an older service: no
  // hostfile at all rather than a line that carries it; MASTER_ADDR stays the service's.
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"10.0.0.7", "10.0.0.8\nevil slots=99"},
                                              std::vector<std::string>{"10.0.0.7", ""}, std::vector<std::string>{}}) {
    a.addresses = bad;
    const auto w2 = world_hosts(a, "", false);
    CHECK(w2.hosts.empty());
    CHECK(w2.master == "10.0.0.7");
  }
}

TEST_CASE("the ranks get MASTER_ADDR as a name and RAILYARD_HOSTFILE; an inherited one never outlives its generation") {
  RankEnvParams p = params();
  p.master_addr = "job1-0.job1.ns1.svc.cluster.local";
  p.hostfile = "/tmp/agent/gen-3/hostfile";
  const char* pod_env[] = {"RAILYARD_HOSTFILE=/stale/hostfile", "MASTER_ADDR=10.9.9.9", nullptr};
  const auto env = by_name(rank_env(inherited_env(pod_env), assignment(), 0, p));
  CHECK(env.at("MASTER_ADDR") == std::vector<std::string>{"job1-0.job1.ns1.svc.cluster.local"});
  CHECK(env.at("RAILYARD_HOSTFILE") == std::vector<std::string>{"/tmp/agent/gen-3/hostfile"});
  // Without names or a hostfile: the assignment's master and no RAILYARD_HOSTFILE (not the inherited one either).
  const auto plain = by_name(rank_env(inherited_env(pod_env), assignment(), 0, params()));
  CHECK(plain.at("MASTER_ADDR") == std::vector<std::string>{"10.0.0.7"});
  CHECK(plain.count("RAILYARD_HOSTFILE") == 0);
}

TEST_CASE("the agent's wait for names: resolved to the wanted address, or false at the limit or when stopped") {
  using railyard::worker::NameWant;
  using railyard::worker::resolve_addresses;
  using railyard::worker::unresolved;
  using railyard::worker::wait_for_names;
  // localhost comes from /etc/hosts: no DNS server is involved, as in every test here.
  const auto local = resolve_addresses("localhost");
  REQUIRE(std::find(local.begin(), local.end(), "127.0.0.1") != local.end());
  CHECK(wait_for_names({{"localhost", "127.0.0.1"}}, std::chrono::milliseconds(0), nullptr));
  CHECK(wait_for_names({{"localhost", ""}}, std::chrono::milliseconds(0), nullptr));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(wait_for_names({{"localhost", "127.0.0.1"}, {"localhost", "10.255.0.9"}}, std::chrono::milliseconds(600),
                             nullptr));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited >= 0.6);
  CHECK(waited < 5);
  CHECK(unresolved({{"localhost", "127.0.0.1"}, {"localhost", "10.255.0.9"}}) ==
        std::vector<std::string>{"localhost (got " + [&] {
          std::string s;
          for (const auto& x : local) s += (s.empty() ? "" : ", ") + x;
          return s;
        }() + ", want 10.255.0.9)"});
  // A stop (SIGTERM to the agent) ends the wait at once.
  const auto t1 = std::chrono::steady_clock::now();
  CHECK_FALSE(wait_for_names({{"localhost", "10.255.0.9"}}, std::chrono::seconds(30), [] { return true; }));
  CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::seconds(2));
  CHECK(resolve_addresses("").empty());
}

TEST_CASE("flash checkpoints: the module's folder leads PYTHONPATH in both modes, the image's entries follow") {
  RankEnvParams p = params();
  p.python_path = "/tmp/agent/python";
  // The image's (or the template's) own PYTHONPATH stays, after the module's folder, and is set once.
  const auto env = by_name(rank_env({"PYTHONPATH=/app/lib:/opt/x", "HOME=/h"}, assignment(), 0, p));
  CHECK(env.at("PYTHONPATH") == std::vector<std::string>{"/tmp/agent/python:/app/lib:/opt/x"});
  const auto tr = by_name(torchrun_env({"PYTHONPATH=/app/lib"}, assignment(), p));
  CHECK(tr.at("PYTHONPATH") == std::vector<std::string>{"/tmp/agent/python:/app/lib"});
  CHECK(by_name(rank_env({"PYTHONPATH="}, assignment(), 0, p)).at("PYTHONPATH") ==
        std::vector<std::string>{"/tmp/agent/python"});
  // Without the module (the built-in trainer), PYTHONPATH is the inherited one, untouched.
  const auto plain = by_name(rank_env({"PYTHONPATH=/app/lib"}, assignment(), 0, params()));
  CHECK(plain.at("PYTHONPATH") == std::vector<std::string>{"/app/lib"});
  CHECK(by_name(rank_env({}, assignment(), 0, params())).count("PYTHONPATH") == 0);
}

TEST_CASE("flash checkpoints: the module the agent carries reads the variables the operator and the agent set") {
  const std::string module = kFlashModuleSource;
  REQUIRE(module.size() > 1000);
  for (const char* name : {railyard::flash::kCheckpointDirEnv, railyard::flash::kIntervalEnv,
                           railyard::flash::kMemoryIntervalEnv, railyard::flash::kKeepEnv,
                           railyard::flash::kShmPrefixEnv, railyard::flash::kPeerStepsEnv,
                           railyard::flash::kGenerationEnv}) {
    INFO(name);
    CHECK(module.find(std::string("\"") + name + "\"") != std::string::npos);
  }
  // The agent sets the segment prefix and the peer steps under exactly these names.
  RankEnvParams p = params();
  p.peer_steps = {7};
  const auto env = by_name(rank_env({}, assignment(), 0, p));
  CHECK(env.count(railyard::flash::kShmPrefixEnv) == 1);
  CHECK(env.count(railyard::flash::kPeerStepsEnv) == 1);
  CHECK(env.count(railyard::flash::kGenerationEnv) == 1);
}
