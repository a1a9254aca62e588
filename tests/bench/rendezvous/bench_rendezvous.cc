// The rendezvous service with a world of N agents (issue 44 item 4): how long after the last agent's first join does
// every agent hold its assignment, and what the service process costs meanwhile (threads, peak RSS, CPU).
//
// Two processes, so that each has its own descriptor limit (N connections on each side): the child serves
// RendezvousService with one generation of N pods; the parent is the load generator, N threads that each speak the
// agent's protocol with the agent's own RendezvousClient (join with the agent's long-poll hold, re-join on "waiting",
// as worker/agent/pod_agent.cc does). The agents are released together (a gang whose pods all start at once).
//
//   bench_rendezvous [--agents N] [--tls on|off] [--join-wait-ms 2000] [--threads 64] [--max-threads 0]
//                    [--silence-seconds 4] [--parse on|off] [--rounds R]
// --parse off: the agents send the same join requests with a plain HTTP client and read each reply without parsing
// it (an assignment lists every pod: on this 2-core machine N agents parsing N such lists in one process measure the
// load generator, not the service; on a cluster each agent parses its own on its own node).
// Prints one line per round and the median and spread of "after last join" (docs/benchmarks.md "Rendezvous").
#include <httplib.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/rendezvous_protocol.h"
#include "common/tls/pki.h"
#include "operator/rendezvous/rendezvous.h"
#include "operator/rendezvous/silence.h"
#include "tests/bench/process_stats.h"
#include "worker/agent/rendezvous_client.h"

namespace {

using Clock = std::chrono::steady_clock;
using railyard::op::GenerationSpec;
using railyard::op::RendezvousOptions;
using railyard::op::RendezvousService;
using railyard::worker::RendezvousClient;
using railyard::worker::RendezvousClientOptions;
using Outcome = RendezvousClient::Outcome;
namespace rdzv = railyard::rdzv;
namespace tls = railyard::tls;

const std::string kToken(64, 'b');
const std::string kJob = "bench/world";

struct Args {
  int agents = 1000;
  bool tls = false;
  int join_wait_ms = 2000;     // the agent's default (worker/agent/agent_config.h join_wait)
  int threads = 64;            // RendezvousOptions::threads default
  int max_threads = 0;         // 0: the service's default
  double silence_seconds = 4;  // the operator's --agent-silence-seconds default: its watcher runs as in the operator
  bool parse = true;
  int rounds = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--agents")
      a.agents = std::stoi(v);
    else if (k == "--tls")
      a.tls = v == "on";
    else if (k == "--join-wait-ms")
      a.join_wait_ms = std::stoi(v);
    else if (k == "--threads")
      a.threads = std::stoi(v);
    else if (k == "--max-threads")
      a.max_threads = std::stoi(v);
    else if (k == "--rounds")
      a.rounds = std::stoi(v);
    else if (k == "--silence-seconds")
      a.silence_seconds = std::stod(v);
    else if (k == "--parse")
      a.parse = v == "on";
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

std::string pod(int i) { return "world-worker-" + std::to_string(i); }

using railyard::bench::cpu_seconds;
using railyard::bench::status_kib;

// The child: serves one generation of N pods until its stdin (the parent's pipe) closes, sampling its thread count;
// then prints "threads_peak rss_peak_kib cpu_s" on the report pipe.
[[noreturn]] void serve(const Args& a, const tls::CertKey& serving, int port_fd, int stop_fd, int report_fd) {
  RendezvousOptions o;
  o.threads = a.threads;
  if (a.max_threads > 0) o.max_threads = a.max_threads;
  o.silence_after = std::chrono::milliseconds(static_cast<int64_t>(a.silence_seconds * 1000));
  if (a.tls) o.serving = serving;
  const double cpu0 = cpu_seconds();
  RendezvousService svc("127.0.0.1", 0, o);
  GenerationSpec g;
  g.job_key = kJob;
  g.generation = 1;
  g.token = kToken;
  std::map<std::string, std::string> uids;
  for (int i = 0; i < a.agents; ++i) {
    g.pods.push_back(pod(i));
    uids[pod(i)] = "uid-" + std::to_string(i);
  }
  g.pod_uids = uids;
  svc.open_generation(g);
  const int port = svc.port();
  if (write(port_fd, &port, sizeof port) != sizeof port) std::_Exit(3);
  std::atomic<bool> done{false};
  std::atomic<long> threads_peak{0};
  std::thread sampler([&] {
    while (!done) {
      threads_peak = std::max(threads_peak.load(), status_kib("Threads:"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  char c;
  while (read(stop_fd, &c, 1) > 0) {
  }
  done = true;
  sampler.join();
  char line[128];
  const int n = std::snprintf(line, sizeof line, "%ld %ld %.2f\n", threads_peak.load(), status_kib("VmHWM:"),
                              cpu_seconds() - cpu0);
  if (write(report_fd, line, static_cast<size_t>(n)) != n) std::_Exit(3);
  std::_Exit(0);
}

struct Agent {
  Clock::time_point first_join{};  // when its first join was sent
  Clock::time_point ready{};       // when it held its assignment
  int requests = 0;
  bool ok = false;
  std::string error;
};

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> l(mu);
      open = true;
    }
    cv.notify_all();
  }
};

struct AgentThread {
  const Args* a;
  int index;
  int port;
  const std::string* ca_pem;
  Gate* gate;
  Agent* out;
};

void* run_agent(void* p) {
  auto& t = *static_cast<AgentThread*>(p);
  RendezvousClientOptions o;
  o.ca_pem = t.a->tls ? *t.ca_pem : "";
  o.max_attempts = 8;  // a burst of N connects may meet a full listen queue: retried like the agent's own client
  RendezvousClient client("127.0.0.1:" + std::to_string(t.port), kToken, o);
  rdzv::JoinRequest req;
  req.ref = rdzv::JobRef("bench", "world", pod(t.index), "uid-" + std::to_string(t.index));
  req.pod_ip = "127.0.0.1";
  req.store_port = 20000 + t.index % 1000;
  req.agent_id = "agent-" + std::to_string(t.index);
  req.wait_ms = t.a->join_wait_ms;
  req.heartbeat_ms = 500;
  t.gate->wait();
  t.out->first_join = Clock::now();
  if (!t.a->parse) {
    // The same request on the wire; the reply's status code and status field read, the body not parsed.
    httplib::Client raw("127.0.0.1", t.port);
    raw.set_connection_timeout(std::chrono::seconds(30));
    raw.set_read_timeout(std::chrono::seconds(60));
    const std::string body = rdzv::to_json(req).dump();
    const httplib::Headers auth = {{"Authorization", "Bearer " + kToken}};
    for (int attempt = 0; attempt < 100; ++attempt) {
      ++t.out->requests;
      auto res = raw.Post(rdzv::kJoinPath, auth, body, "application/json");
      if (!res) continue;  // a refused or reset connection: retried as the agent's client does
      if (res->status == 200 && res->body.find("\"status\":\"ready\"") != std::string::npos) {
        t.out->ready = Clock::now();
        t.out->ok = true;
        return nullptr;
      }
      if (res->status != 202) {
        t.out->error = "HTTP " + std::to_string(res->status) + ": " + res->body.substr(0, 200);
        return nullptr;
      }
    }
    t.out->error = "no assignment after 100 requests";
    return nullptr;
  }
  try {
    while (true) {
      ++t.out->requests;
      RendezvousClient::Result r = client.join(req);
      if (r.outcome == Outcome::Ready) {
        t.out->ready = Clock::now();
        t.out->ok = true;
        break;
      }
      if (r.outcome != Outcome::Waiting) {
        t.out->error = std::string(railyard::worker::to_string(r.outcome)) + ": " + r.message;
        break;
      }
    }
  } catch (const std::exception& e) {
    t.out->error = e.what();
  }
  return nullptr;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Round {
  double after_last_join = 0, total = 0, joins_spread = 0, server_cpu = 0;
  long threads_peak = 0, rss_peak_kib = 0;
  int failed = 0;
  double mean_requests = 0;
};

Round one_round(const Args& a, const tls::CertKey& ca, const tls::CertKey& serving) {
  int port_pipe[2], stop_pipe[2], report_pipe[2];
  if (pipe(port_pipe) || pipe(stop_pipe) || pipe(report_pipe)) throw std::runtime_error("pipe");
  const pid_t child = fork();
  if (child == 0) {
    close(port_pipe[0]);
    close(stop_pipe[1]);
    close(report_pipe[0]);
    serve(a, serving, port_pipe[1], stop_pipe[0], report_pipe[1]);
  }
  close(port_pipe[1]);
  close(stop_pipe[0]);
  close(report_pipe[1]);
  int port = 0;
  if (read(port_pipe[0], &port, sizeof port) != sizeof port) throw std::runtime_error("the service did not start");

  std::vector<Agent> agents(a.agents);
  std::vector<AgentThread> args(a.agents);
  std::vector<pthread_t> threads(a.agents);
  Gate gate;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (int i = 0; i < a.agents; ++i) {
    args[i] = {&a, i, port, &ca.cert_pem, &gate, &agents[i]};
    if (pthread_create(&threads[i], &attr, run_agent, &args[i]) != 0)
      throw std::runtime_error("cannot start agent thread " + std::to_string(i));
  }
  pthread_attr_destroy(&attr);
  gate.release();
  for (pthread_t t : threads) pthread_join(t, nullptr);
  close(stop_pipe[1]);
  char buf[128] = {};
  const ssize_t got = read(report_pipe[0], buf, sizeof buf - 1);
  waitpid(child, nullptr, 0);
  close(port_pipe[0]);
  close(report_pipe[0]);

  Round r;
  if (got > 0) std::sscanf(buf, "%ld %ld %lf", &r.threads_peak, &r.rss_peak_kib, &r.server_cpu);
  Clock::time_point first = Clock::time_point::max(), last_join{}, last_ready{};
  long requests = 0;
  for (const Agent& ag : agents) {
    first = std::min(first, ag.first_join);
    last_join = std::max(last_join, ag.first_join);
    requests += ag.requests;
    if (!ag.ok) {
      if (r.failed++ < 3) std::fprintf(stderr, "agent failed: %s\n", ag.error.c_str());
      continue;
    }
    last_ready = std::max(last_ready, ag.ready);
  }
  r.after_last_join = seconds(last_ready - last_join);
  r.total = seconds(last_ready - first);
  r.joins_spread = seconds(last_join - first);
  r.mean_requests = static_cast<double>(requests) / a.agents;
  return r;
}

// The silence watcher's rule over one job of N pods, as the service's 100 ms tick calls it (under its lock): the
// records copied into the rule's input and the rule applied, median of 51 ticks.
double silence_tick_ms(int n) {
  namespace silence = railyard::op::silence;
  const auto now = Clock::now();
  std::vector<silence::Heard> held(n);
  for (int i = 0; i < n; ++i)
    held[i] = {pod(i),
               "uid-" + std::to_string(i),
               "uid-" + std::to_string(i),
               now - std::chrono::milliseconds(i % 900),
               0,
               500,
               false};
  std::vector<double> ms;
  size_t found = 0;
  for (int t = 0; t < 51; ++t) {
    const auto start = Clock::now();
    std::vector<silence::Heard> copy = held;  // the service builds this from its records on every tick
    found += silence::find_silent(copy, now, now - std::chrono::seconds(60), std::chrono::milliseconds(4000)).size();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  if (found != 0) std::fprintf(stderr, "silence rule: %zu unexpected silent pods\n", found);
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!a.parse && a.tls) {
    std::fprintf(stderr, "--parse off speaks plain HTTP: use it with --tls off\n");
    return 2;
  }
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_cur < static_cast<rlim_t>(a.agents) + 256) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, static_cast<rlim_t>(a.agents) + 1024);
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  const tls::CertKey ca = tls::make_ca("bench-ca", std::chrono::hours(2));
  const tls::CertKey serving = tls::issue_server_cert(ca, {"127.0.0.1"}, std::chrono::hours(2));
  std::printf(
      "rendezvous bench: %d agents, tls %s, join hold %d ms, service threads %d (max %s), silence %.1f s, "
      "replies %s, nofile %lu\n",
      a.agents, a.tls ? "on" : "off", a.join_wait_ms, a.threads,
      a.max_threads > 0 ? std::to_string(a.max_threads).c_str() : "default", a.silence_seconds,
      a.parse ? "parsed by the agent's client" : "read, not parsed", static_cast<unsigned long>(nofile.rlim_cur));
  std::printf("silence rule over %d pods: %.3f ms per 100 ms tick (median of 51)\n", a.agents,
              silence_tick_ms(a.agents));
  std::vector<double> after;
  int failed = 0;
  for (int round = 1; round <= a.rounds; ++round) {
    const Round r = one_round(a, ca, serving);
    std::printf(
        "round %d: after last join %.3f s, first join to last assignment %.3f s, joins spread %.3f s, "
        "requests/agent %.2f, service: threads peak %ld, RSS peak %ld MiB, CPU %.2f s, failed agents %d\n",
        round, r.after_last_join, r.total, r.joins_spread, r.mean_requests, r.threads_peak, r.rss_peak_kib / 1024,
        r.server_cpu, r.failed);
    std::fflush(stdout);
    after.push_back(r.after_last_join);
    failed += r.failed;
  }
  std::sort(after.begin(), after.end());
  std::printf("after last join: median %.3f s, min %.3f s, max %.3f s over %d rounds\n", after[after.size() / 2],
              after.front(), after.back(), a.rounds);
  return failed == 0 ? 0 : 1;
}
