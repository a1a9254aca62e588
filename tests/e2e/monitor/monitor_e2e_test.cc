// E2E: a real Prometheus (deploy/local/lib/prometheus.sh, own temp dir and port) scrapes fake workers; a TrainingJob
// lives on the shared local cluster; railyard-monitor, querying that Prometheus, must turn a frozen rank (SIGSTOP)
// into exactly one restart-request per generation, naming the rank and the evidence, survive its own restart, and
// take Alertmanager webhooks only with the bearer token.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/kube/client.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) throw railyard::Error(std::string("environment variable ") + name + " is not set (run through ctest)");
  return v;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// A child process, stopped by pid (SIGCONT first, in case the test froze it) when it goes out of scope.
class Child {
 public:
  Child(std::vector<std::string> argv, const std::string& log) {
    std::vector<char*> args;
    for (auto& s : argv) args.push_back(s.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE_MESSAGE(rc == 0, "cannot start " << argv[0]);
  }
  ~Child() { stop(SIGKILL); }
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  void stop(int sig = SIGTERM) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = -1;
};

bool wait_until(double seconds, const std::function<bool()>& pred) {
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return pred();
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Env {
  std::string src = env("RAILYARD_SOURCE_DIR"), bin = env("RAILYARD_BIN_DIR"), state = env("RAILYARD_E2E_STATE_DIR");
  fs::path tmp;
  Env() {
    char t[] = "/tmp/railyard-monitor-e2e-XXXXXX";
    REQUIRE(mkdtemp(t));
    tmp = t;
  }
  // Declared first in the test, so it goes last: after Prometheus and the workers have stopped.
  ~Env() {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  int sh(const std::string& cmd) const { return std::system(("bash -c '" + cmd + "'").c_str()); }
};

class Workers {
 public:
  // `extra[r]`: more flags for rank r (e.g. --slow-factor 3, --nan-at-step 40). Lock step unless `independent`.
  Workers(const Env& e, const std::string& ns, const std::string& job, int generation, int world,
          std::map<int, std::vector<std::string>> extra = {}, bool independent = false) {
    fs::path dir = e.tmp / (job + "-gen" + std::to_string(generation));
    fs::create_directories(dir / "barrier");
    for (int r = 0; r < world; ++r) {
      std::string pf = (dir / ("port" + std::to_string(r))).string();
      std::vector<std::string> argv{e.bin + "/railyard-test-fake-worker",
                                    "--namespace",
                                    ns,
                                    "--job",
                                    job,
                                    "--rank",
                                    std::to_string(r),
                                    "--world",
                                    std::to_string(world),
                                    "--node",
                                    "sim-node-" + std::to_string(r),
                                    "--generation",
                                    std::to_string(generation),
                                    "--step-seconds",
                                    "0.2",
                                    "--port-file",
                                    pf};
      if (!independent) argv.insert(argv.end(), {"--barrier-dir", (dir / "barrier").string()});
      argv.insert(argv.end(), extra[r].begin(), extra[r].end());
      procs_.push_back(
          std::make_unique<Child>(argv, (e.tmp / (job + "-worker" + std::to_string(r) + ".log")).string()));
      REQUIRE(wait_until(10, [&] { return fs::exists(pf); }));
      ports.push_back(std::stoi(read_all(pf)));
    }
    // The file-SD list: the pods' metadata as target labels, as Kubernetes discovery gives them (no rank: the
    // process serves it, and the monitor checks it against the pod's place in the world).
    json targets = json::array();
    for (int r = 0; r < world; ++r)
      targets.push_back({{"targets", {"127.0.0.1:" + std::to_string(ports[r])}},
                         {"labels",
                          {{"namespace", ns},
                           {"trainingjob", job},
                           {"pod", job + "-worker-" + std::to_string(r)},
                           {"node", "sim-node-" + std::to_string(r)}}}});
    { std::ofstream(dir / "targets.json") << targets.dump(); }
    REQUIRE(e.sh("bash " + e.src + "/deploy/local/lib/prometheus.sh write-targets " + (e.tmp / "prom").string() +
                 " workers \"$(cat " + (dir / "targets.json").string() + ")\"") == 0);
  }
  Child& rank(int r) { return *procs_.at(r); }
  std::vector<int> ports;

 private:
  std::vector<std::unique_ptr<Child>> procs_;
};

json query(const std::string& prom, const std::string& q) {
  auto origin = prom;
  httplib::Client cli(origin);
  auto res = cli.Get("/api/v1/query?query=" + railyard::kube::url_encode(q));
  if (!res || res->status != 200) return json::array();
  return json::parse(res->body)["data"]["result"];
}

json restart_request(railyard::kube::Client& c, const std::string& ns, const std::string& name) {
  auto job = c.get(railyard::kube::resources::trainingjobs, ns, name);
  auto ann = job["metadata"].value("annotations", json::object());
  if (!ann.contains("railyard.dev/restart-request")) return nullptr;
  return json::parse(ann["railyard.dev/restart-request"].get<std::string>());
}

// Creates TrainingJob `name`: the tiny preset, `replicas` ranks, 100000 steps of data that is never read (no operator
// runs here: the tests play its part), and `failure_policy` unless it is empty.
void create_tiny_job(railyard::kube::Client& c, const std::string& ns, const std::string& name, int replicas,
                     const json& failure_policy = json::object()) {
  json spec = {{"replicas", replicas},
               {"model", {{"preset", "tiny"}}},
               {"data", {{"train", "/tmp/none_*.bin"}}},
               {"training", {{"steps", 100000}}}};
  if (!failure_policy.empty()) spec["failurePolicy"] = failure_policy;
  c.create(railyard::kube::resources::trainingjobs, ns,
           {{"apiVersion", "railyard.dev/v1alpha1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", name}}},
            {"spec", spec}});
}

// SIGSTOPs `proc` and waits `seconds` at most for the job's restart request: the request, and how many seconds after
// the SIGSTOP it came.
std::pair<json, double> freeze_until_request(Child& proc, railyard::kube::Client& c, const std::string& ns,
                                             const std::string& name, double seconds) {
  const auto frozen_at = Clock::now();
  proc.signal(SIGSTOP);
  json req;
  REQUIRE(wait_until(seconds, [&] { return !(req = restart_request(c, ns, name)).is_null(); }));
  return {req, std::chrono::duration<double>(Clock::now() - frozen_at).count()};
}

// The monitor (its /metrics at `mcli`) dropped at least `at_least` series that were not the job's own.
void check_rejected_series(httplib::Client& mcli, double at_least) {
  auto m = mcli.Get("/metrics");
  REQUIRE(m);
  const std::string key = "\nrailyard_monitor_rejected_series_total ";
  auto at = m->body.find(key);
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(m->body.substr(at + key.size())) >= at_least);
}

// The CRD installed and a fresh namespace on the shared local cluster, deleted when the test ends.
struct TestNamespace {
  std::unique_ptr<railyard::kube::Client> client;
  std::string ns;
  TestNamespace(const Env& e, const std::string& prefix)
      : client(std::make_unique<railyard::kube::Client>(railyard::kube::load_kubeconfig(e.state + "/kubeconfig"))),
        ns(prefix + "-" + std::to_string(getpid())) {
    REQUIRE(e.sh("eval \"$(bash " + e.src + "/deploy/local/cluster.sh env --state-dir " + e.state +
                 ")\" && kubectl apply -f " + e.src +
                 "/deploy/crds/trainingjobs.railyard.dev.yaml >/dev/null && kubectl wait --for=condition=Established "
                 "--timeout=60s crd/trainingjobs.railyard.dev >/dev/null") == 0);
    client->create(railyard::kube::resources::namespaces, "",
                   {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  }
  ~TestNamespace() {
    try {
      client->remove(railyard::kube::resources::namespaces, "", ns);
    } catch (...) {
    }
  }
};

// A real Prometheus (deploy/local/lib/prometheus.sh, the rules loaded) in the test's directory, stopped by pid.
// A pod that serves whatever it likes (python3 -m http.server over a directory with a `metrics` file): here, the
// series of another job's rank, with that job's namespace, trainingjob, pod and node labels.
struct Spoofer {
  int port = free_port();
  std::unique_ptr<Child> server;
  Spoofer(const Env& e, const std::string& victim_ns, const std::string& victim, int rank, const std::string& pod) {
    fs::path dir = e.tmp / ("spoof-" + std::to_string(port));
    fs::create_directories(dir);
    const std::string labels = "{namespace=\"" + victim_ns + "\",trainingjob=\"" + victim + "\",pod=\"" + pod +
                               "\",node=\"evil-node\",rank=\"" + std::to_string(rank) + "\",generation=\"0\"}";
    // A NaN loss restarts the job at once; a rank stuck at step 1 would be the stall rule's "furthest behind".
    std::ofstream(dir / "metrics") << "railyard_worker_nonfinite_total" << labels << " 7\nrailyard_worker_loss"
                                   << labels << " NaN\nrailyard_worker_step" << labels << " 1\n";
    server =
        std::make_unique<Child>(std::vector<std::string>{"/usr/bin/python3", "-m", "http.server", std::to_string(port),
                                                         "--bind", "127.0.0.1", "--directory", dir.string()},
                                (e.tmp / "spoofer.log").string());
    REQUIRE(wait_until(10, [&] { return static_cast<bool>(httplib::Client("127.0.0.1", port).Get("/metrics")); }));
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
};

struct Prometheus {
  const Env& e;
  std::string dir, url;
  explicit Prometheus(const Env& env) : e(env), dir((env.tmp / "prom").string()) {
    REQUIRE(e.sh("bash " + e.src + "/deploy/local/lib/prometheus.sh up " + dir) == 0);
    std::string env_text = read_all(fs::path(dir) / "prometheus" / "prometheus.env");
    auto at = env_text.find("PROMETHEUS_URL=");
    REQUIRE(at != std::string::npos);
    url = env_text.substr(at + 15, env_text.find('\n', at) - at - 15);
    MESSAGE("prometheus at " << url);
  }
  ~Prometheus() { e.sh("bash " + e.src + "/deploy/local/lib/prometheus.sh down " + dir); }
};

}  // namespace

TEST_CASE("monitor against a real Prometheus: stall -> one restart request per generation; webhook with token") {
  Env e;
  // The CRD, a namespace, a TrainingJob (no operator runs here: the test plays its part by bumping the generation).
  TestNamespace tns(e, "monitor-e2e");
  auto& c = *tns.client;
  const std::string ns = tns.ns, name = "gpt";
  create_tiny_job(c, ns, name, 2, {{"hangTimeoutSeconds", 60}, {"excludeFailedNodes", true}});

  // Prometheus, through the same script cluster.sh uses.
  Prometheus prometheus(e);
  const std::string prom = prometheus.url;

  auto workers = std::make_unique<Workers>(e, ns, name, 0, 2);
  // Both ranks stepping, as Prometheus sees them (file-SD pick-up takes up to ~6 s).
  REQUIRE(wait_until(30, [&] {
    auto r = query(prom, "railyard_worker_step{namespace=\"" + ns + "\"} > 5");
    return r.size() == 2;
  }));

  // Spoofers (issue #40: metrics cannot be spoofed across jobs), registered like pods, with their own pods'
  // metadata: a pod of another namespace serving rank 1 of gpt with gpt's labels; a pod of gpt's namespace that is
  // not in gpt's world; gpt's own pod 0 serving rank 1 (not one of its ranks) on a second port. Each serves a NaN
  // loss for gpt: if any of them spoke for gpt, the job would be restarted (NonFiniteLoss) in the healthy window
  // below. Under honor_labels true the first one's served namespace and pod would win.
  Spoofer spoof(e, ns, name, 1, "gpt-worker-1");
  const json spoof_targets = {
      {{"targets", {spoof.address()}},
       {"labels",
        {{"namespace", ns + "-evil"}, {"trainingjob", name}, {"pod", "gpt-worker-1"}, {"node", "evil-node"}}}},
      {{"targets", {spoof.address()}},
       {"labels", {{"namespace", ns}, {"trainingjob", name}, {"pod", "intruder"}, {"node", "evil-node"}}}},
      {{"targets", {spoof.address()}},
       {"labels", {{"namespace", ns}, {"trainingjob", name}, {"pod", "gpt-worker-0"}, {"node", "sim-node-0"}}}}};
  { std::ofstream(e.tmp / "spoof.json") << spoof_targets.dump(); }
  REQUIRE(e.sh("bash " + e.src + "/deploy/local/lib/prometheus.sh write-targets " + prometheus.dir + " spoof \"$(cat " +
               (e.tmp / "spoof.json").string() + ")\"") == 0);
  // Prometheus scrapes all three, and keeps the served identity only as exported_* labels.
  REQUIRE_MESSAGE(wait_until(30,
                             [&] {
                               return query(prom, "railyard_worker_nonfinite_total{exported_namespace=\"" + ns +
                                                      "\",exported_node=\"evil-node\"}")
                                          .size() == 3;
                             }),
                  "the spoofers' series are not in Prometheus under exported_namespace/exported_node: "
                      << query(prom, "railyard_worker_nonfinite_total").dump());
  CHECK(query(prom, "railyard_worker_nonfinite_total{namespace=\"" + ns + "-evil\",trainingjob=\"" + name + "\"}")
            .size() == 1);

  std::string token = "s3cret-" + std::to_string(getpid());
  { std::ofstream(e.tmp / "token") << token << "\n"; }
  int mport = free_port();
  auto start_monitor = [&] {
    return std::make_unique<Child>(
        std::vector<std::string>{e.bin + "/railyard-monitor", "--kubeconfig", e.state + "/kubeconfig",
                                 "--prometheus-url", prom, "--interval", "1", "--listen",
                                 "127.0.0.1:" + std::to_string(mport), "--webhook-token-file",
                                 (e.tmp / "token").string(), "--namespace", ns},
        (e.tmp / "monitor.log").string());
  };
  auto monitor = start_monitor();
  httplib::Client mcli("127.0.0.1", mport);
  REQUIRE(wait_until(15, [&] {
    auto r = mcli.Get("/healthz");
    return r && r->status == 200;
  }));
  // Healthy for a while: no request, though the spoofers serve a NaN loss for gpt all along; the monitor saw and
  // dropped their series.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  CHECK_MESSAGE(restart_request(c, ns, name).is_null(),
                "restarted by a spoofer? " << restart_request(c, ns, name).dump());
  check_rejected_series(mcli, 3);

  // Freeze rank 1: rank 0 stops at the next barrier but keeps serving metrics.
  json req;
  double detect_s = 0;
  std::tie(req, detect_s) = freeze_until_request(workers->rank(1), c, ns, name, 40);
  MESSAGE("stall detected " << detect_s << " s after SIGSTOP: " << req.dump());
  CHECK(req["rule"] == "stall");
  CHECK(req["reason"] == "Hang");
  CHECK(req["rank"] == 1);
  CHECK(req["node"] == "sim-node-1");
  CHECK(req["generation"] == 0);
  CHECK(req["detector"] == "monitor");
  CHECK(req["evidence"].get<std::string>().find("no step progress") != std::string::npos);
  // Bound: the default 6 s threshold (max(2 x 0.2 s, 6 s)) + 1 s scrape + 1 s evaluation + API round trips; and
  // never before the threshold.
  CHECK(detect_s < 6 + 4);
  CHECK(detect_s > 5.5);
  auto job = c.get(railyard::kube::resources::trainingjobs, ns, name);
  CHECK(job["metadata"]["annotations"].value("railyard.dev/exclude-nodes", "") == "sim-node-1");
  CHECK(job["metadata"]["annotations"].value("railyard.dev/restart-detector", "") == "monitor");
  // The Warning event follows the annotation (best effort, after the patch).
  bool event = wait_until(10, [&] {
    json events = c.list(railyard::kube::resources::events, ns);
    for (auto& ev : events["items"])
      if (ev["involvedObject"].value("name", "") == name && ev.value("reason", "") == "Hang" &&
          ev.value("type", "") == "Warning")
        return true;
    return false;
  });
  CHECK_MESSAGE(event, "no Warning event 'Hang'; monitor log:\n" << read_all(e.tmp / "monitor.log"));

  // Exactly once in this generation, also across a monitor restart (the annotation is read back).
  std::string first_time = req["time"];
  std::this_thread::sleep_for(std::chrono::seconds(4));
  CHECK(restart_request(c, ns, name)["time"] == first_time);
  auto metrics = mcli.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("railyard_monitor_verdicts_total{rule=\"stall\"} 1\n") != std::string::npos);
  // The monitor's exposition passes promtool's lint, like every /metrics endpoint must.
  { std::ofstream(e.tmp / "monitor.metrics") << metrics->body; }
  CHECK(std::system(("promtool check metrics < " + (e.tmp / "monitor.metrics").string()).c_str()) == 0);
  monitor->stop(SIGTERM);
  monitor = start_monitor();
  REQUIRE(wait_until(15, [&] {
    auto r = mcli.Get("/healthz");
    return r && r->status == 200;
  }));
  std::this_thread::sleep_for(std::chrono::seconds(5));
  CHECK(restart_request(c, ns, name)["time"] == first_time);
  metrics = mcli.Get("/metrics");
  REQUIRE(metrics);
  CHECK(metrics->body.find("railyard_monitor_verdicts_total{rule=") == std::string::npos);
  CHECK(metrics->body.find("railyard_monitor_evaluations_total 0\n") == std::string::npos);

  // Generation 1 (the operator's part): new workers; this time rank 0 freezes.
  workers.reset();
  c.patch(railyard::kube::resources::trainingjobs, ns, name, {{"status", {{"generation", 1}}}},
          railyard::kube::PatchType::Merge, "status");
  workers = std::make_unique<Workers>(e, ns, name, 1, 2);
  REQUIRE(wait_until(30, [&] {
    return query(prom, "railyard_worker_step{namespace=\"" + ns + "\",generation=\"1\"} > 5").size() == 2;
  }));
  auto frozen_at = Clock::now();
  workers->rank(0).signal(SIGSTOP);
  REQUIRE(wait_until(40, [&] {
    req = restart_request(c, ns, name);
    return req["generation"] == 1;
  }));
  detect_s = std::chrono::duration<double>(Clock::now() - frozen_at).count();
  MESSAGE("generation 1: detected " << detect_s << " s after SIGSTOP: " << req.dump());
  CHECK(req["rank"] == 0);
  CHECK(req["node"] == "sim-node-0");
  CHECK(detect_s < 6 + 4);
  job = c.get(railyard::kube::resources::trainingjobs, ns, name);
  CHECK(job["metadata"]["annotations"].value("railyard.dev/exclude-nodes", "") == "sim-node-1,sim-node-0");

  // Alertmanager webhook: refused without the token, deduplicated within a generation, accepted in the next.
  json alert = {{"version", "4"},
                {"status", "firing"},
                {"receiver", "railyard"},
                {"groupKey", "{}:{alertname=\"GpuXidError\"}"},
                {"alerts",
                 {{{"status", "firing"},
                   {"labels", {{"alertname", "GpuXidError"}, {"namespace", ns}, {"trainingjob", name}, {"rank", "1"}}},
                   {"annotations", {{"summary", "XID 79 on rank 1"}}},
                   {"startsAt", "2026-11-22T03:00:00Z"}}}}};
  auto post = [&](const std::string& auth, const std::string& body) {
    httplib::Headers h;
    if (!auth.empty()) h.emplace("Authorization", auth);
    auto r = mcli.Post("/webhook/alertmanager", h, body, "application/json");
    REQUIRE(r);
    return std::make_pair(r->status, r->body);
  };
  CHECK(post("", alert.dump()).first == 401);
  CHECK(post("Bearer wrong", alert.dump()).first == 401);
  auto [code, body] = post("Bearer " + token, alert.dump());
  CHECK(code == 200);
  CHECK(json::parse(body)["duplicates"] == 1);  // generation 1 already has a request
  c.patch(railyard::kube::resources::trainingjobs, ns, name, {{"status", {{"generation", 2}}}},
          railyard::kube::PatchType::Merge, "status");
  std::tie(code, body) = post("Bearer " + token, alert.dump());
  CHECK(code == 200);
  CHECK(json::parse(body)["accepted"] == 1);
  req = restart_request(c, ns, name);
  CHECK(req["generation"] == 2);
  CHECK(req["reason"] == "GpuXidError");
  CHECK(req["source"] == "alertmanager");
  CHECK(req["rank"] == 1);
  CHECK(req["evidence"] == "XID 79 on rank 1");
  CHECK(req["onset"] == "2026-11-22T03:00:00Z");
  std::tie(code, body) = post("Bearer " + token, alert.dump());
  CHECK(json::parse(body)["duplicates"] == 1);
  CHECK(restart_request(c, ns, name)["time"] == req["time"]);
  alert["version"] = "3";
  std::tie(code, body) = post("Bearer " + token, alert.dump());
  CHECK(code == 400);
  CHECK(body.find("'version' is \\\"3\\\"") != std::string::npos);

  monitor->stop(SIGTERM);
  workers.reset();
}

TEST_CASE("embedded mode: the monitor scrapes the job's pods itself (pod IP + railyard.dev/metrics-port)") {
  Env e;
  TestNamespace tns(e, "monitor-emb");
  auto& c = *tns.client;
  const std::string ns = tns.ns, name = "emb";
  create_tiny_job(c, ns, name, 2);
  // Workers without Prometheus: the prometheus dir only receives an unused target list.
  fs::create_directories(e.tmp / "prom");
  Workers workers(e, ns, name, 0, 2);
  // The pods the operator would have made, as a kubelet would report them: Running, with an IP and the port.
  for (int r = 0; r < 2; ++r) {
    std::string pod = name + "-worker-" + std::to_string(r);
    c.create(railyard::kube::resources::pods, ns,
             {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", pod},
                {"labels", {{"railyard.dev/job", name}, {"railyard.dev/replica-index", std::to_string(r)}}},
                {"annotations", {{"railyard.dev/metrics-port", std::to_string(workers.ports[r])}}}}},
              {"spec", {{"containers", {{{"name", "worker"}, {"image", "railyard/none"}}}}}}});
    c.patch(railyard::kube::resources::pods, ns, pod, {{"status", {{"phase", "Running"}, {"podIP", "127.0.0.1"}}}},
            railyard::kube::PatchType::Merge, "status");
  }
  // A pod of the namespace labelled as emb's but not in its world, serving a NaN loss as emb's rank 0 with emb's
  // own pod and node labels: the monitor takes the identity from the Pod object and drops its series.
  Spoofer spoof(e, ns, name, 0, "emb-worker-0");
  c.create(railyard::kube::resources::pods, ns,
           {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata",
             {{"name", "intruder"},
              {"labels", {{"railyard.dev/job", name}}},
              {"annotations", {{"railyard.dev/metrics-port", std::to_string(spoof.port)}}}}},
            {"spec", {{"containers", {{{"name", "worker"}, {"image", "railyard/none"}}}}}}});
  c.patch(railyard::kube::resources::pods, ns, "intruder", {{"status", {{"phase", "Running"}, {"podIP", "127.0.0.1"}}}},
          railyard::kube::PatchType::Merge, "status");
  int mport = free_port();
  Child monitor({e.bin + "/railyard-monitor", "--kubeconfig", e.state + "/kubeconfig", "--interval", "1", "--listen",
                 "127.0.0.1:" + std::to_string(mport), "--namespace", ns},
                (e.tmp / "monitor.log").string());
  httplib::Client mcli("127.0.0.1", mport);
  // Scraped: the monitor reads the workers' series.
  REQUIRE(wait_until(20, [&] {
    auto r = mcli.Get("/metrics");
    if (!r) return false;
    auto at = r->body.find("\nrailyard_monitor_series ");
    // Two ranks' full expositions (7 contract series each, histogram buckets on top) plus a synthesized `up` each.
    return at != std::string::npos && std::stod(r->body.substr(at + 25)) >= 2 * 8;
  }));
  std::this_thread::sleep_for(std::chrono::seconds(3));
  CHECK_MESSAGE(restart_request(c, ns, name).is_null(),
                "restarted by the intruder? " << restart_request(c, ns, name).dump());
  check_rejected_series(mcli, 3);
  const auto [req, detect_s] = freeze_until_request(workers.rank(1), c, ns, name, 40);
  MESSAGE("embedded mode: detected " << detect_s << " s after SIGSTOP: " << req.dump());
  CHECK(req["rule"] == "stall");
  CHECK(req["rank"] == 1);
  // The node is the Pod object's (spec.nodeName), not the sim-node-1 the worker serves: these test pods are bound
  // to no node (a node name the cluster lacks would get them garbage-collected), so none is blamed or excluded.
  CHECK(req["node"] == "");
  CHECK(c.get(railyard::kube::resources::trainingjobs, ns, name)["metadata"]["annotations"].value(
            "railyard.dev/exclude-nodes", "") == "");
  // 6 s threshold + scrape timeouts of the frozen target (2 s each) + 1 s interval.
  CHECK(detect_s > 5.5);
  CHECK(detect_s < 6 + 6);
  monitor.stop(SIGTERM);
}

TEST_CASE("straggler and NaN loss over Prometheus: the fake workers' test knobs turn into verdicts") {
  Env e;
  TestNamespace tns(e, "monitor-knobs");
  auto& c = *tns.client;
  const std::string ns = tns.ns;
  for (const char* name : {"slow", "nan"}) create_tiny_job(c, ns, name, 3, {{"stragglerFactor", 2.0}});
  Prometheus prometheus(e);
  const std::string prom = prometheus.url, prom_dir = prometheus.dir;
  // "slow": independent ranks, rank 2 takes 3x as long per step. "nan": rank 1's loss turns NaN at step 60.
  // Each Workers writes the whole target list, so the second list is written under another name.
  Workers slow(e, ns, "slow", 0, 3, {{2, {"--slow-factor", "3"}}}, true);
  fs::rename(fs::path(prom_dir) / "prometheus" / "targets" / "workers.json",
             fs::path(prom_dir) / "prometheus" / "targets" / "slow.json");
  Workers nan(e, ns, "nan", 0, 3, {{1, {"--nan-at-step", "60"}}});
  REQUIRE(
      wait_until(30, [&] { return query(prom, "railyard_worker_step{namespace=\"" + ns + "\"} > 2").size() == 6; }));
  int mport = free_port();
  Child monitor(
      {e.bin + "/railyard-monitor", "--kubeconfig", e.state + "/kubeconfig", "--prometheus-url", prom, "--interval",
       "1", "--straggler-window", "5", "--listen", "127.0.0.1:" + std::to_string(mport), "--namespace", ns},
      (e.tmp / "monitor.log").string());
  json slow_req, nan_req;
  REQUIRE(wait_until(60, [&] {
    if (slow_req.is_null()) slow_req = restart_request(c, ns, "slow");
    if (nan_req.is_null()) nan_req = restart_request(c, ns, "nan");
    return !slow_req.is_null() && !nan_req.is_null();
  }));
  MESSAGE("straggler: " << slow_req.dump());
  MESSAGE("nan: " << nan_req.dump());
  CHECK(slow_req["rule"] == "straggler");
  CHECK(slow_req["reason"] == "Straggler");
  CHECK(slow_req["rank"] == 2);
  CHECK(slow_req["node"] == "sim-node-2");
  CHECK(nan_req["rule"] == "nonfinite");
  CHECK(nan_req["reason"] == "NonFiniteLoss");
  CHECK(nan_req["rank"] == 1);
  // A NaN is not the node's fault; a straggler's node is excluded (excludeFailedNodes defaults to true).
  auto nan_job = c.get(railyard::kube::resources::trainingjobs, ns, "nan");
  CHECK(nan_job["metadata"]["annotations"].value("railyard.dev/exclude-nodes", "") == "");
  auto slow_job = c.get(railyard::kube::resources::trainingjobs, ns, "slow");
  CHECK(slow_job["metadata"]["annotations"].value("railyard.dev/exclude-nodes", "") == "sim-node-2");
  monitor.stop(SIGTERM);
}

TEST_CASE("a real trainer's validation pass is a pause: no restart, no pending stall alert; a freeze still is a hang") {
  Env e;
  TestNamespace tns(e, "monitor-pause");
  auto& c = *tns.client;
  const std::string ns = tns.ns, name = "val";
  create_tiny_job(c, ns, name, 1, {{"hangTimeoutSeconds", 120}});
  Prometheus prometheus(e);
  const std::string prom = prometheus.url;
  REQUIRE(e.sh(e.bin + "/railyard data prepare --input /usr/share/common-licenses/GPL-3 --output " +
               (e.tmp / "data").string() + " >/dev/null") == 0);
  // The tiny model steps in milliseconds; a validation pass of 10000 batches takes over 10 s (about 17 s on a 2-core
  // machine), far past the stall threshold of max(2 x step time, 6 s).
  const int wport = free_port();
  Child worker({"/usr/bin/env",
                "RAILYARD_JOB_NAMESPACE=" + ns,
                "RAILYARD_JOB_NAME=" + name,
                "RAILYARD_GENERATION=0",
                "RAILYARD_NODE_NAME=local",
                e.bin + "/railyard-worker",
                "train",
                "--model",
                "tiny",
                "--data",
                (e.tmp / "data").string(),
                "--steps",
                "100000",
                "--batch",
                "2",
                "--seq",
                "32",
                "--threads",
                "1",
                "--val-every",
                "300",
                "--val-steps",
                "10000",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                std::to_string(wport)},
               (e.tmp / "worker.log").string());
  const json targets = {
      {{"targets", {"127.0.0.1:" + std::to_string(wport)}},
       {"labels", {{"namespace", ns}, {"trainingjob", name}, {"pod", "val-worker-0"}, {"node", "local"}}}}};
  { std::ofstream(e.tmp / "targets.json") << targets.dump(); }
  REQUIRE(e.sh("bash " + e.src + "/deploy/local/lib/prometheus.sh write-targets " + prometheus.dir +
               " worker \"$(cat " + (e.tmp / "targets.json").string() + ")\"") == 0);
  const std::string sel = "{namespace=\"" + ns + "\"}";
  // Past the first validation (at step 0, before any step): stepping, and a step time known to the rules.
  REQUIRE_MESSAGE(wait_until(60, [&] { return !query(prom, "railyard_worker_step" + sel + " > 0").empty(); }),
                  "the worker never stepped; its log:\n"
                      << read_all(e.tmp / "worker.log"));
  int mport = free_port();
  Child monitor({e.bin + "/railyard-monitor", "--kubeconfig", e.state + "/kubeconfig", "--prometheus-url", prom,
                 "--interval", "1", "--listen", "127.0.0.1:" + std::to_string(mport), "--namespace", ns},
                (e.tmp / "monitor.log").string());
  // Two validation passes (at steps 300 and 600) and the steps around them: never a restart request, and the stall
  // alert never even pending.
  auto passes = [&] {
    auto r = query(prom, "max_over_time(railyard_worker_step" + sel + "[10m])");
    return r.empty() ? 0.0 : std::stod(r[0]["value"][1].get<std::string>());
  };
  bool paused_seen = false;
  auto until = Clock::now() + std::chrono::seconds(150);
  while (Clock::now() < until && passes() < 650) {
    if (!query(prom, "railyard_worker_paused" + sel + " == 1").empty()) paused_seen = true;
    REQUIRE_MESSAGE(restart_request(c, ns, name).is_null(), "restart requested during a validation pass; monitor log:\n"
                                                                << read_all(e.tmp / "monitor.log"));
    REQUIRE_MESSAGE(query(prom, "ALERTS{alertname=\"RailyardJobStalled\",namespace=\"" + ns + "\"}").empty(),
                    "the stall alert is pending or firing during a validation pass");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  REQUIRE_MESSAGE(passes() >= 650, "the worker did not get past two validation passes in 150 s");
  CHECK(paused_seen);
  // The passes were long enough to trip the stall rules without the pause: the time without a step went past 10 s.
  auto gap =
      query(prom, "max_over_time((time() - (railyard_worker_last_step_timestamp_seconds" + sel + " > 0))[5m:1s])");
  REQUIRE_FALSE(gap.empty());
  const double gap_s = std::stod(gap[0]["value"][1].get<std::string>());
  MESSAGE("longest time without a step: " << gap_s << " s");
  CHECK(gap_s > 10);
  // The monitor is alive and watching: a frozen trainer is a hang (its target goes down: no pause is read from it).
  const auto [req, frozen_s] = freeze_until_request(worker, c, ns, name, 60);
  MESSAGE("frozen trainer: " << frozen_s << " s to " << req.dump());
  CHECK(req["rule"] == "stall");
  monitor.stop(SIGTERM);
}
