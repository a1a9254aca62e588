// railyard-node-agent against the real local cluster: the fixture started the agent with --nodes 4.
// Env: KUBECONFIG (admin), RAILYARD_E2E_STATE_DIR (node-agent/ holds the agent's state), RAILYARD_BIN_DIR.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/kube/client.h"
#include "tests/ctest_env.h"

namespace fs = std::filesystem;
using namespace railyard::kube;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::string env(const char* name) { return railyard::test::fixture_env(name, "e2e_cluster"); }

Client& admin() {
  static Client c(load_kubeconfig(env("KUBECONFIG")));
  return c;
}

std::string agent_state() { return env("RAILYARD_E2E_STATE_DIR") + "/node-agent"; }
std::string agent_bin() { return env("RAILYARD_BIN_DIR") + "/railyard-node-agent"; }

// Polls `pred` every 100 ms until it holds or `timeout` passes.
bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return pred();
}

struct CliResult {
  int rc = -1;
  std::string out;
};

// Runs the agent's CLI with --state-dir, capturing stdout+stderr.
CliResult cli(const std::string& args) {
  std::string cmd = agent_bin() + " " + args + " --state-dir " + agent_state() + " 2>&1";
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string random_suffix() {
  static std::mt19937_64 rng(std::random_device{}());
  const char* alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string s;
  for (int i = 0; i < 6; ++i) s += alphabet[rng() % 36];
  return s;
}

// A fresh namespace per test, deleted (with everything in it) afterwards.
struct TestNamespace {
  std::string name;
  std::string dir;  // a scratch dir the pods' scripts write markers into
  explicit TestNamespace(const std::string& prefix) : name(prefix + "-" + random_suffix()) {
    admin().create(resources::namespaces, "",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}});
    dir = (fs::temp_directory_path() / ("na-e2e-" + name)).string();
    fs::create_directories(dir);
  }
  ~TestNamespace() {
    try {
      DeleteOptions o;
      o.propagation_policy = "Background";
      admin().remove(resources::namespaces, "", name, o);
      // Pods may still write into `dir` until their processes are gone (only tests that use it wait).
      if (!fs::is_empty(dir)) wait_for([&] { return admin().list(resources::pods, name)["items"].empty(); }, 15s);
    } catch (const std::exception&) {
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::vector<Json> sim_nodes() {
  ListOptions o;
  o.label_selector = "railyard.dev/simulated=true";
  auto items = admin().list(resources::nodes, "", o)["items"];
  std::vector<Json> out(items.begin(), items.end());
  std::sort(out.begin(), out.end(), [](const Json& a, const Json& b) { return name_of(a) < name_of(b); });
  return out;
}

std::string ready_status(const Json& node) {
  for (const auto& c : node["status"].value("conditions", Json::array())) {
    if (c.value("type", "") == "Ready") return c.value("status", "");
  }
  return "";
}

// The first simulated node (tests run pods there) and the last (node-down takes it away).
std::string first_node() { return name_of(sim_nodes().front()); }

Json pod_manifest(const std::string& name, const std::string& node, const std::string& script,
                  const std::string& restart_policy = "Never") {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}}},
          {"spec",
           {{"nodeName", node},
            {"restartPolicy", restart_policy},
            {"terminationGracePeriodSeconds", 10},
            {"containers", Json::array({{{"name", "main"}, {"image", "none"}, {"command", {"sh", "-c", script}}}})}}}};
}

Json get_pod(const TestNamespace& ns, const std::string& name) { return admin().get(resources::pods, ns.name, name); }

std::string phase_of(const TestNamespace& ns, const std::string& name) {
  auto p = admin().try_get(resources::pods, ns.name, name);
  return p ? (*p)["status"].value("phase", "") : "<gone>";
}

bool wait_phase(const TestNamespace& ns, const std::string& name, const std::string& phase,
                std::chrono::milliseconds timeout = 20s) {
  return wait_for([&] { return phase_of(ns, name) == phase; }, timeout);
}

Json terminated_state(const Json& pod) {
  auto cs = pod["status"].value("containerStatuses", Json::array());
  if (cs.empty()) return Json::object();
  return cs[0]["state"].value("terminated", Json::object());
}

}  // namespace

TEST_CASE("nodes are registered Ready with topology labels, capacity and a fresh lease") {
  auto nodes = sim_nodes();
  REQUIRE(nodes.size() >= 4);
  for (const auto& n : nodes) {
    CAPTURE(name_of(n));
    CHECK(ready_status(n) == "True");
    const auto& l = n["metadata"]["labels"];
    CHECK(l.value("railyard.dev/gpu-type", "") == "H100");
    CHECK(l.value("railyard.dev/rails", "") == "8");
    CHECK(!l.value("railyard.dev/unit", "").empty());
    CHECK(!l.value("railyard.dev/leaf", "").empty());
    CHECK(!l.value("railyard.dev/spine", "").empty());
    CHECK(l.value("kubernetes.io/hostname", "") == name_of(n));
    CHECK(n["status"]["capacity"].value("nvidia.com/gpu", "") == "8");
    CHECK(n["status"]["allocatable"].value("nvidia.com/gpu", "") == "8");
    CHECK(n["status"]["addresses"][0].value("address", "") == "127.0.0.1");
    // Renewed every second. A test before this one may have restarted the API server (kube_e2e_tests does), and
    // the agent's renewals then resume after its retry backoff: wait up to 20 s for a renewal, then require it fresh.
    // The lease itself may not exist yet when this runs first: cluster.sh up waits for Ready nodes, and the agent
    // creates each node's lease just after registering it (about 100 ms later); a missing lease is an old one.
    auto age = [&]() -> std::chrono::system_clock::duration {
      auto lease = admin().try_get(resources::leases, "kube-node-lease", name_of(n));
      if (!lease) return std::chrono::hours(24);
      return std::chrono::system_clock::now() - parse_rfc3339((*lease)["spec"].value("renewTime", ""));
    };
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    auto a = age();
    while (a >= 5s && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(250ms);
      a = age();
    }
    CHECK(a < 5s);
  }
  CHECK(name_of(nodes[0]) == "rynode-u0-n0");
}

TEST_CASE("exit codes become Succeeded / Failed with containerStatuses; each pod has its own loopback IP") {
  TestNamespace ns("na-exit");
  std::string node = first_node();
  admin().create(resources::pods, ns.name, pod_manifest("fail", node, "exit 3"));
  admin().create(resources::pods, ns.name, pod_manifest("ok", node, "echo hello from $HOSTNAME; exit 0"));
  REQUIRE(wait_phase(ns, "fail", "Failed"));
  REQUIRE(wait_phase(ns, "ok", "Succeeded"));
  auto fail = get_pod(ns, "fail");
  auto t = terminated_state(fail);
  CHECK(t.value("exitCode", -1) == 3);
  CHECK(t.value("reason", "") == "Error");
  CHECK(!t.value("finishedAt", "").empty());
  auto ok = get_pod(ns, "ok");
  CHECK(terminated_state(ok).value("exitCode", -1) == 0);
  CHECK(terminated_state(ok).value("reason", "") == "Completed");
  std::string ip1 = fail["status"].value("podIP", ""), ip2 = ok["status"].value("podIP", "");
  CHECK(ip1.rfind("127.", 0) == 0);
  CHECK(ip1 != "127.0.0.1");
  CHECK(ip1 != ip2);
  CHECK(ok["status"].value("hostIP", "") == "127.0.0.1");
  CHECK(ok["status"]["podIPs"][0].value("ip", "") == ip2);
  std::string log = agent_state() + "/pods/" + ns.name + "_ok/main.log";
  CHECK(slurp(log).find("hello from ok") != std::string::npos);
}

TEST_CASE("running pods get distinct IPs, Running status and Ready conditions") {
  TestNamespace ns("na-ips");
  std::string node = first_node();
  for (int i = 0; i < 3; ++i) {
    std::string name = "s";  // appended: see below
    name += std::to_string(i);
    admin().create(resources::pods, ns.name, pod_manifest(name, node, "sleep 60"));
  }
  std::set<std::string> ips;
  for (int i = 0; i < 3; ++i) {
    // Appended, not "s" + to_string(i): GCC 12 reports a false -Wrestrict on that form here (its bug 105329).
    std::string name = "s";
    name += std::to_string(i);
    REQUIRE(wait_phase(ns, name, "Running"));
    auto p = get_pod(ns, name);
    ips.insert(p["status"].value("podIP", ""));
    auto cs = p["status"]["containerStatuses"][0];
    CHECK(cs.value("ready", false));
    CHECK(cs["state"].contains("running"));
    bool ready = false;
    for (const auto& c : p["status"]["conditions"]) ready = ready || (c["type"] == "Ready" && c["status"] == "True");
    CHECK(ready);
  }
  CHECK(ips.size() == 3);
  CHECK(!ips.count("127.0.0.1"));
}

TEST_CASE("env: literal, fieldRef, secretKeyRef, configMapKeyRef and RAILYARD_POD_IP reach the process") {
  TestNamespace ns("na-env");
  std::string node = first_node();
  admin().create(resources::secrets, ns.name,
                 {{"apiVersion", "v1"},
                  {"kind", "Secret"},
                  {"metadata", {{"name", "creds"}}},
                  {"stringData", {{"token", "s3cr3t-value"}}}});
  admin().create(
      resources::configmaps, ns.name,
      {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "cfg"}}}, {"data", {{"lr", "0.25"}}}});
  Json pod = pod_manifest("env", node,
                          "echo \"name=$POD_NAME ns=$POD_NS node=$NODE ip=$POD_IP rip=$RAILYARD_POD_IP token=$TOKEN "
                          "lr=$LR lit=$LIT\"");
  pod["spec"]["containers"][0]["env"] = Json::array({
      {{"name", "LIT"}, {"value", "plain"}},
      {{"name", "POD_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
      {{"name", "POD_NS"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.namespace"}}}}}},
      {{"name", "NODE"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
      {{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
      {{"name", "TOKEN"}, {"valueFrom", {{"secretKeyRef", {{"name", "creds"}, {"key", "token"}}}}}},
      {{"name", "LR"}, {"valueFrom", {{"configMapKeyRef", {{"name", "cfg"}, {"key", "lr"}}}}}},
  });
  admin().create(resources::pods, ns.name, pod);
  REQUIRE(wait_phase(ns, "env", "Succeeded"));
  std::string ip = get_pod(ns, "env")["status"].value("podIP", "");
  std::string log = slurp(agent_state() + "/pods/" + ns.name + "_env/main.log");
  CHECK(log.find("name=env ns=" + ns.name + " node=" + node + " ip=" + ip + " rip=" + ip +
                 " token=s3cr3t-value lr=0.25 lit=plain") != std::string::npos);
}

TEST_CASE("a pod without a command fails with reason NoCommand") {
  TestNamespace ns("na-nocmd");
  Json pod = pod_manifest("img", first_node(), "");
  pod["spec"]["containers"][0].erase("command");
  admin().create(resources::pods, ns.name, pod);
  REQUIRE(wait_phase(ns, "img", "Failed"));
  auto p = get_pod(ns, "img");
  CHECK(p["status"].value("reason", "") == "NoCommand");
  CHECK(terminated_state(p).value("reason", "") == "NoCommand");
}

TEST_CASE("deleting a running pod delivers SIGTERM, then the pod object disappears") {
  TestNamespace ns("na-del");
  std::string marker = ns.dir + "/terminated";
  admin().create(resources::pods, ns.name,
                 pod_manifest("term", first_node(),
                              "trap 'echo got-term > " + marker + "; exit 0' TERM; while :; do sleep 0.2; done"));
  REQUIRE(wait_phase(ns, "term", "Running"));
  std::this_thread::sleep_for(300ms);  // let sh install its trap
  admin().remove(resources::pods, ns.name, "term");
  CHECK(wait_for([&] { return !admin().try_get(resources::pods, ns.name, "term"); }, 15s));
  CHECK(slurp(marker) == "got-term\n");
}

TEST_CASE("deleting a pod that ignores SIGTERM: SIGKILL after the grace period") {
  TestNamespace ns("na-grace");
  Json pod = pod_manifest("stubborn", first_node(), "trap '' TERM; while :; do sleep 0.2; done");
  pod["spec"]["terminationGracePeriodSeconds"] = 2;
  admin().create(resources::pods, ns.name, pod);
  REQUIRE(wait_phase(ns, "stubborn", "Running"));
  auto t0 = Clock::now();
  admin().remove(resources::pods, ns.name, "stubborn");
  REQUIRE(wait_for([&] { return !admin().try_get(resources::pods, ns.name, "stubborn"); }, 15s));
  CHECK(Clock::now() - t0 >= 1500ms);
}

TEST_CASE("kill --signal KILL fails the pod with the signal named; unknown pods are a clear error") {
  TestNamespace ns("na-kill");
  admin().create(resources::pods, ns.name, pod_manifest("victim", first_node(), "sleep 120"));
  REQUIRE(wait_phase(ns, "victim", "Running"));
  auto r = cli("kill " + ns.name + "/victim --signal KILL");
  CHECK(r.rc == 0);
  CHECK(r.out.find("sent SIGKILL to pod " + ns.name + "/victim") != std::string::npos);
  REQUIRE(wait_phase(ns, "victim", "Failed"));
  auto t = terminated_state(get_pod(ns, "victim"));
  CHECK(t.value("exitCode", -1) == 137);
  CHECK(t.value("reason", "") == "Error");
  CHECK(t.value("signal", 0) == 9);
  CHECK(t.value("message", "").find("signal 9") != std::string::npos);

  auto missing = cli("kill " + ns.name + "/nope");
  CHECK(missing.rc != 0);
  CHECK(missing.out.find("no pod " + ns.name + "/nope on this agent's nodes") != std::string::npos);
  auto bad = cli("kill " + ns.name + "/victim --signal BOGUS");
  CHECK(bad.rc != 0);
  CHECK(bad.out.find("BOGUS") != std::string::npos);
}

TEST_CASE("restartPolicy OnFailure restarts a failing process and counts restarts") {
  TestNamespace ns("na-restart");
  admin().create(resources::pods, ns.name, pod_manifest("crashy", first_node(), "sleep 0.2; exit 1", "OnFailure"));
  CHECK(wait_for(
      [&] {
        auto cs = get_pod(ns, "crashy")["status"].value("containerStatuses", Json::array());
        return !cs.empty() && cs[0].value("restartCount", 0) >= 2;
      },
      20s));
  auto cs = get_pod(ns, "crashy")["status"]["containerStatuses"][0];
  CHECK(cs["lastState"]["terminated"].value("exitCode", -1) == 1);
  CHECK(phase_of(ns, "crashy") == "Running");
}

TEST_CASE("freeze stops the process group, thaw resumes it") {
  TestNamespace ns("na-freeze");
  std::string counter = ns.dir + "/counter";
  admin().create(resources::pods, ns.name,
                 pod_manifest("ticker", first_node(),
                              "i=0; while :; do i=$((i+1)); echo $i > " + counter + ".tmp; mv " + counter + ".tmp " +
                                  counter + "; sleep 0.05; done"));
  REQUIRE(wait_phase(ns, "ticker", "Running"));
  REQUIRE(wait_for([&] { return !slurp(counter).empty(); }, 5s));
  auto r = cli("freeze " + ns.name + "/ticker");
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("froze pod") != std::string::npos);
  std::this_thread::sleep_for(300ms);
  std::string frozen_at = slurp(counter);
  std::this_thread::sleep_for(700ms);
  CHECK(slurp(counter) == frozen_at);
  auto status = cli("status --json");
  CHECK(status.rc == 0);
  CHECK(status.out.find("\"frozen\": true") != std::string::npos);
  CHECK(phase_of(ns, "ticker") == "Running");  // a hung process is still Running to Kubernetes
  r = cli("thaw " + ns.name + "/ticker");
  REQUIRE(r.rc == 0);
  CHECK(wait_for([&] { return slurp(counter) != frozen_at; }, 5s));
}

TEST_CASE("node-down: the node turns NotReady and its pods are evicted; node-up makes it Ready again") {
  auto nodes = sim_nodes();
  REQUIRE(nodes.size() >= 2);  // another node stays Ready, or the node controller stops evicting
  std::string node = name_of(nodes.back());
  TestNamespace ns("na-down");
  admin().create(resources::pods, ns.name, pod_manifest("lost", node, "sleep 300"));
  REQUIRE(wait_phase(ns, "lost", "Running"));

  struct BringBack {
    std::string node;
    ~BringBack() { cli("node-up " + node); }
  } guard{node};
  auto r = cli("node-down " + node);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("node " + node + " is down") != std::string::npos);
  CHECK(wait_for([&] { return ready_status(admin().get(resources::nodes, "", node)) == "Unknown"; }, 15s));
  // The unreachable NoExecute taint plus the default 2 s toleration evicts the pod; the agent finishes the delete.
  CHECK(wait_for([&] { return !admin().try_get(resources::pods, ns.name, "lost"); }, 30s));
  auto st = cli("status");
  CHECK(st.out.find(node) != std::string::npos);

  r = cli("node-up " + node);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("is up") != std::string::npos);
  CHECK(wait_for([&] { return ready_status(admin().get(resources::nodes, "", node)) == "True"; }, 15s));
  // And it runs pods again.
  admin().create(resources::pods, ns.name, pod_manifest("after", node, "exit 0"));
  CHECK(wait_phase(ns, "after", "Succeeded"));
}

TEST_CASE("agent restart: a pod whose process died with the old agent is marked Failed (NodeAgentRestarted)") {
  std::string state = env("RAILYARD_E2E_STATE_DIR");
  std::string pid_file = state + "/pids/node-agent.pid";
  REQUIRE_MESSAGE(fs::exists(pid_file), "cluster.sh keeps the agent's pid in " << pid_file);
  TestNamespace ns("na-restart-agent");
  Json pod = pod_manifest("orphan", first_node(), "sleep 300 & wait");
  // Tolerate the unreachable/not-ready taints forever, so the pod outlives the agent's short absence.
  pod["spec"]["tolerations"] = Json::array({{{"operator", "Exists"}, {"effect", "NoExecute"}}});
  admin().create(resources::pods, ns.name, pod);
  REQUIRE(wait_phase(ns, "orphan", "Running"));
  auto st = Json::parse(cli("status --json").out);
  int old_pid = 0;
  for (const auto& p : st["pods"]) {
    if (p["namespace"] == ns.name && p["name"] == "orphan") old_pid = p.value("pid", 0);
  }
  REQUIRE(old_pid > 0);

  // Whatever happens below, the shared cluster gets its agent back (cluster.sh up restarts a dead agent).
  struct Restore {
    std::string cmd;
    ~Restore() { (void)std::system(cmd.c_str()); }
  } restore{"bash " + env("RAILYARD_SOURCE_DIR") + "/deploy/local/cluster.sh up --state-dir " + state +
            " --nodes 4 --node-agent " + agent_bin() + " >/dev/null 2>&1"};
  pid_t agent_pid = std::stoi(slurp(pid_file));
  REQUIRE(::kill(agent_pid, SIGKILL) == 0);  // a crash: no chance to clean up
  // Restart at once, the way cluster.sh starts it (own session, its log, its pid file), so the nodes' leases never
  // lapse: with all nodes NotReady the v1.20 node controller enters master disruption mode, and after it leaves
  // that mode it no longer adds NoExecute taints, which would break evictions for every later test.
  fs::remove(agent_state() + "/control.port");
  std::string start = "cd / && setsid " + agent_bin() + " run --kubeconfig " + state + "/node-agent.kubeconfig" +
                      " --state-dir " + agent_state() + " --nodes 4 </dev/null >>" + state +
                      "/logs/node-agent.log 2>&1 & echo $! > " + pid_file;
  REQUIRE(std::system(start.c_str()) == 0);
  // The pod's main process died with its agent (PR_SET_PDEATHSIG).
  CHECK(wait_for(
      [&] {
        return ::kill(old_pid, 0) != 0 ||
               slurp("/proc/" + std::to_string(old_pid) + "/stat").find(") Z") != std::string::npos;
      },
      5s));
  REQUIRE(wait_for([&] { return cli("status").rc == 0; }, 20s));
  REQUIRE(wait_phase(ns, "orphan", "Failed", 30s));
  auto p = get_pod(ns, "orphan");
  CHECK(p["status"].value("reason", "") == "NodeAgentRestarted");
  CHECK(terminated_state(p).value("reason", "") == "NodeAgentRestarted");
  // The new agent runs new pods.
  admin().create(resources::pods, ns.name, pod_manifest("fresh", first_node(), "exit 0"));
  CHECK(wait_phase(ns, "fresh", "Succeeded"));
}

TEST_CASE("--no-pods: the agent's nodes are Ready, but a pod bound to them gets no process and no status") {
  // A second agent with its own state dir and one node of its own name ("idle-u0-n0"), beside the fixture's agent.
  // The node holds at most one pod and the test's pod is bound to it before the node exists, so no other test's pod
  // can be placed there (it would never start).
  TestNamespace ns("na-no-pods");
  const std::string node = "idle-u0-n0";
  const std::string marker = ns.dir + "/ran";
  admin().create(resources::pods, ns.name, pod_manifest("left-alone", node, "touch " + marker + "; sleep 300"));
  const std::string state = ns.dir + "/agent";
  fs::create_directories(state);
  {
    std::ofstream topo(ns.dir + "/idle.yaml");
    topo << "gpuType: h100-sxm\ngpusPerNode: 8\nnodesPerUnit: 1\nunitsPerLeaf: 1\nleavesPerSpine: 1\nunits: 1\n"
            "cpu: \"4\"\nmemory: 8Gi\npods: 1\nnamePrefix: idle\n";
  }
  const std::string pid_file = ns.dir + "/agent.pid";
  const std::string start = "setsid " + agent_bin() + " run --kubeconfig " + env("RAILYARD_E2E_STATE_DIR") +
                            "/node-agent.kubeconfig --state-dir " + state + " --topology " + ns.dir +
                            "/idle.yaml --lease-interval 1 --no-pods </dev/null >" + ns.dir +
                            "/agent.log 2>&1 & echo $! > " + pid_file;
  REQUIRE(std::system(start.c_str()) == 0);
  struct Stop {
    std::string pid_file, node, ns;
    ~Stop() {
      try {
        ::kill(std::stoi(slurp(pid_file)), SIGTERM);
        // No kubelet finishes this pod's graceful delete: remove it outright, then the node.
        DeleteOptions now;
        now.grace_period_seconds = 0;
        admin().remove(resources::pods, ns, "left-alone", now);
        std::this_thread::sleep_for(500ms);
        admin().remove(resources::nodes, "", node);
      } catch (const std::exception&) {
      }
    }
  } stop{pid_file, node, ns.name};
  REQUIRE_MESSAGE(wait_for(
                      [&] {
                        auto n = admin().try_get(resources::nodes, "", node);
                        return n && ready_status(*n) == "True";
                      },
                      20s),
                  slurp(ns.dir + "/agent.log"));
  // Logged once the nodes are registered, which is when they turn Ready: a moment after.
  CHECK(wait_for([&] { return slurp(ns.dir + "/agent.log").find("pods are left alone") != std::string::npos; }, 5s));
  // A running agent starts a bound pod within a second or two (the cases above); this one must not, at all.
  std::this_thread::sleep_for(4s);
  Json pod = get_pod(ns, "left-alone");
  CHECK(pod["status"].value("phase", "") == "Pending");
  CHECK_FALSE(pod["status"].contains("containerStatuses"));
  CHECK_FALSE(fs::exists(marker));
  auto n = admin().try_get(resources::nodes, "", node);
  REQUIRE(n);
  CHECK(ready_status(*n) == "True");
}
