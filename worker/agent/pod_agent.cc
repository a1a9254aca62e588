#include "worker/agent/pod_agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "checkpoint/shm_store.h"
#include "common/error.h"
#include "common/log.h"
#include "common/metrics/job_labels.h"
#include "common/metrics/metrics.h"
#include "worker/agent/output_watch.h"
#include "worker/agent/peer_copy.h"
#include "worker/agent/rank_exporter.h"
#include "worker/agent/rendezvous_client.h"

extern char** environ;

namespace railyard::worker {
namespace {

using Clock = std::chrono::steady_clock;
using Outcome = RendezvousClient::Outcome;
constexpr const char* kComponent = "agent";

std::string required_env(const char* name, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    throw ConfigError(std::string(name) + " is not set: it must hold " + what +
                      " (the operator sets it in the pod spec; see docs/rendezvous.md)");
  }
  return v;
}

int64_t int_env(const char* name, int64_t fallback, int64_t min, int64_t max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < min || x > max) {
    throw ConfigError(std::string(name) + "=\"" + v + "\" must be an integer in [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  }
  return x;
}

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string random_id() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

// A port that is free on ip right now, offered to the service as the bootstrap store port in case this pod gets
// rank 0. 0 when ip is not local (the service then falls back to its fixed port).
int free_port(const std::string& ip) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  int port = 0;
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1 &&
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    socklen_t len = sizeof a;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

struct Worker {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int exit_code = -1;
  int signal = 0;
  std::string progress_file;
  int64_t last_step = -1;
};

enum class After { Rejoin, Exit };

// The agent's own series (docs/rendezvous.md "Agent metrics"). Labels namespace, job, pod, node: bounded by the job's
// pods. Served only when RAILYARD_AGENT_METRICS_PORT is set, on the pod IP like the worker's metrics.
struct AgentMetrics {
  metrics::Registry registry;
  metrics::Labels labels;
  metrics::Gauge& generation;
  metrics::Counter& generations;
  metrics::Histogram& rendezvous_wait;
  metrics::Counter& worker_starts;
  metrics::Family<metrics::Counter>& worker_exits;
  metrics::Counter& unreachable;
  metrics::Histogram& peer_copy_seconds;
  metrics::Counter& peer_copy_bytes;
  metrics::Counter& peer_copy_errors;
  std::unique_ptr<metrics::Exposer> exposer;

  explicit AgentMetrics(const AgentConfig& c)
      : labels{{metrics::kNamespaceLabel, c.ns}, {metrics::kTrainingJobLabel, c.job}, {"pod", c.pod}, {"node", c.node}},
        generation(registry.gauge("railyard_agent_generation", "Generation this agent's workers run in (0: none).")
                       .add(labels)),
        generations(registry
                        .counter("railyard_agent_generations_total",
                                 "Generations this agent joined; every one after the first is an in-place restart.")
                        .add(labels)),
        rendezvous_wait(registry
                            .histogram("railyard_agent_rendezvous_wait_seconds",
                                       "From the first join request of a round to the assignment.",
                                       metrics::exponential_buckets(0.05, 2, 14))
                            .add(labels)),
        worker_starts(
            registry.counter("railyard_agent_worker_starts_total", "Worker processes this agent started.").add(labels)),
        worker_exits(registry.counter("railyard_agent_worker_exits_total",
                                      "Worker process exits by outcome (succeeded, failed, signaled).")),
        unreachable(registry
                        .counter("railyard_agent_rendezvous_errors_total",
                                 "Requests to the rendezvous service that failed (unreachable, 5xx).")
                        .add(labels)),
        peer_copy_seconds(registry
                              .histogram("railyard_agent_peer_copy_seconds",
                                         "Time to send one in-memory snapshot slot to the peer pod (off the training "
                                         "path).",
                                         metrics::exponential_buckets(0.001, 2, 16))
                              .add(labels)),
        peer_copy_bytes(
            registry.counter("railyard_agent_peer_copy_bytes_total", "Bytes of snapshot slots sent to the peer pod.")
                .add(labels)),
        peer_copy_errors(registry
                             .counter("railyard_agent_peer_copy_errors_total",
                                      "Peer copies that failed (peer unreachable or refusing, slot overwritten while "
                                      "sent); each is retried.")
                             .add(labels)) {
    for (const char* outcome : {"succeeded", "failed", "signaled"}) worker_exits.add(with_outcome(outcome));
    if (c.metrics_port >= 0) exposer = std::make_unique<metrics::Exposer>(registry, c.pod_ip, c.metrics_port);
  }

  metrics::Labels with_outcome(const char* outcome) const {
    metrics::Labels l = labels;
    l["outcome"] = outcome;
    return l;
  }
};

class AgentRun {
 public:
  AgentRun(const AgentConfig& cfg, const std::atomic<int>& stop)
      : cfg_(cfg),
        stop_(stop),
        client_(cfg.rendezvous_addr, cfg.token, client_options(cfg.rendezvous_ca)),
        agent_id_(random_id()),
        shm_pod_prefix_(shm_pod_prefix(cfg)),
        shm_prefix_(shm_pod_prefix_ + agent_id_),
        metrics_(cfg) {
    // Segments of an earlier agent of a pod with this name (one killed before it could clean up): never read by
    // this agent's workers, whose names carry this agent's id.
    if (int n = ckpt::ShmStore::remove_prefix(shm_pod_prefix_); n > 0) {
      log::info(kComponent, "removed leftover in-memory checkpoint segments of an earlier agent of this pod",
                {{"count", std::to_string(n)}, {"prefix", shm_pod_prefix_}});
    }
    if (cfg.peer_port >= 0) {
      const peer::Auth auth{cfg.ns + "/" + cfg.job, peer_copy_token(cfg.token, cfg.ns, cfg.job)};
      try {
        peer_server_ = std::make_unique<peer::PeerServer>(cfg.pod_ip, cfg.peer_port, auth, shm_prefix_);
        log::info(kComponent, "serving peer copies of the in-memory checkpoint tier",
                  {{"address", cfg.pod_ip + ":" + std::to_string(peer_server_->port())}});
      } catch (const std::exception& e) {
        // Not fatal: the job trains without the peer copy (a lost node then restores from storage).
        log::warn(kComponent, std::string("no peer copy: ") + e.what());
      }
      peer_sender_ = std::make_unique<peer::PeerSender>(
          auth, std::chrono::milliseconds(5), [this](const peer::CopyResult& r, const std::string& error) {
            if (!error.empty()) {
              metrics_.peer_copy_errors.increment();
              return;
            }
            metrics_.peer_copy_seconds.observe(r.seconds);
            metrics_.peer_copy_bytes.increment(static_cast<double>(r.bytes));
            peer_copies_.fetch_add(1);
            peer_copy_seconds_sum_.store(peer_copy_seconds_sum_.load() + r.seconds);  // only this thread writes
            if (peer_copy_seconds_max_.load() < r.seconds) peer_copy_seconds_max_.store(r.seconds);
            log::write(peer_first_logged_.exchange(true) ? log::Level::Debug : log::Level::Info, kComponent,
                       "peer copy sent",
                       {{"rank", std::to_string(r.rank)},
                        {"step", std::to_string(r.step)},
                        {"bytes", std::to_string(r.bytes)},
                        {"seconds", std::to_string(r.seconds)}});
          });
    }
    if (metrics_.exposer) {
      log::info(kComponent, "serving metrics",
                {{"address", cfg.pod_ip + ":" + std::to_string(metrics_.exposer->port()) + "/metrics"}});
    }
    if (cfg.rank_metrics_port >= 0) {
      // The ranks serve no metrics themselves (a program): the agent serves theirs, from progress and output.
      ranks_out_ = std::make_unique<RankExporter>(
          cfg.pod_ip, cfg.rank_metrics_port, cfg.procs_per_pod,
          metrics::Labels{
              {metrics::kNamespaceLabel, cfg.ns}, {metrics::kTrainingJobLabel, cfg.job}, {"node", cfg.node}});
      output_ = std::make_unique<OutputWatch>(cfg.procs_per_pod);
      log::info(kComponent, "serving the ranks' metrics from their progress and output",
                {{"address", cfg.pod_ip + ":" + std::to_string(ranks_out_->port(0)) + "/metrics"},
                 {"ranks", std::to_string(cfg.procs_per_pod)}});
    }
  }

  int run() {
    log::info(kComponent, "starting",
              {{"job", cfg_.ns + "/" + cfg_.job},
               {"pod", cfg_.pod},
               {"pod_ip", cfg_.pod_ip},
               {"rendezvous", cfg_.rendezvous_addr},
               {"tls", client_.tls() ? "on" : "off"},
               {"procs", std::to_string(cfg_.procs_per_pod)},
               {"agent_id", agent_id_}});
    std::string last_notice;
    std::optional<Clock::time_point> round_start;  // first join request since the last generation ended
    // The service answers unknown_job for a job it has not opened and for a wrong token alike (it does not tell which
    // job names exist), so an unknown job is retried for as long as an unreachable service, then ends the agent.
    bool unknown = false;
    Clock::time_point unknown_since{};
    while (true) {
      if (!round_start) round_start = Clock::now();
      if (int s = stop_.load()) {
        log::info(kComponent, "stopping on signal before workers started", {{"signal", std::to_string(s)}});
        return 128 + s;
      }
      rdzv::JoinRequest req;
      req.ref = ref();
      req.generation = last_generation_;
      req.local_procs = cfg_.procs_per_pod;
      req.pod_ip = cfg_.pod_ip;
      req.store_port = free_port(cfg_.pod_ip);
      req.agent_id = agent_id_;
      req.wait_ms = cfg_.join_wait.count();
      req.peer_port = peer_server_ ? peer_server_->port() : 0;
      RendezvousClient::Result r;
      try {
        r = client_.join(req);
      } catch (const ConfigError& e) {
        log::error(kComponent, e.what());
        return kAgentConfigError;
      } catch (const RendezvousUnavailable& e) {
        metrics_.unreachable.increment();
        if (unreachable_for_too_long(e.what())) return kAgentUnreachable;
        sleep_interruptible(std::chrono::milliseconds(1000));
        continue;
      }
      unreachable_since_.reset();
      if (r.outcome != Outcome::UnknownJob) unknown = false;
      auto notice = [&](const std::string& what, log::Level level) {
        // Said once per situation, not on every poll.
        if (what == last_notice) return;
        last_notice = what;
        log::write(level, kComponent, what);
      };
      switch (r.outcome) {
        case Outcome::Ready: {
          last_notice.clear();
          metrics_.rendezvous_wait.observe(std::chrono::duration<double>(Clock::now() - *round_start).count());
          round_start.reset();
          auto [after, code] = run_generation(r.assignment);
          if (after == After::Exit) return code;
          continue;
        }
        case Outcome::Waiting: {
          std::string missing;
          for (const auto& m : r.missing) missing += (missing.empty() ? "" : ",") + m;
          notice("waiting for generation " + std::to_string(r.generation) + " to complete; missing pods: " + missing,
                 log::Level::Info);
          continue;
        }
        case Outcome::Superseded:
          continue;
        case Outcome::Timeout:
          log::error(kComponent, "join timed out, retrying: " + r.message);
          last_notice.clear();
          sleep_interruptible(std::chrono::milliseconds(1000));
          continue;
        case Outcome::UnknownJob: {
          if (!unknown) {
            unknown = true;
            unknown_since = Clock::now();
          }
          if (Clock::now() - unknown_since >= cfg_.unreachable_limit) {
            log::error(kComponent,
                       "rendezvous service refused the token or does not know the job for longer than "
                       "RAILYARD_AGENT_UNREACHABLE_SECONDS; giving up: " +
                           r.message);
            return kAgentConfigError;
          }
          notice(r.message, log::Level::Warn);
          sleep_interruptible(std::chrono::milliseconds(1000));
          continue;
        }
        case Outcome::NotMember:
        case Outcome::Started:
          notice(r.message, log::Level::Warn);
          sleep_interruptible(std::chrono::milliseconds(1000));
          continue;
        case Outcome::Closed:
          log::info(kComponent, "job closed by the operator; exiting",
                    {{"local_workers_succeeded", last_all_ok_ ? "true" : "false"}});
          return last_all_ok_ ? kAgentSucceeded : kAgentFailed;
        default:
          log::warn(kComponent, std::string("unexpected join answer: ") + to_string(r.outcome));
          sleep_interruptible(std::chrono::milliseconds(1000));
      }
    }
  }

 private:
  static RendezvousClientOptions client_options(const std::string& ca_pem) {
    RendezvousClientOptions o;
    o.ca_pem = ca_pem;
    o.connect_timeout = std::chrono::milliseconds(3000);
    o.read_timeout = std::chrono::milliseconds(5000);
    o.max_attempts = 3;
    return o;
  }

  rdzv::JobRef ref() const { return {cfg_.ns, cfg_.job, cfg_.pod}; }

  void sleep_interruptible(std::chrono::milliseconds d) {
    auto until = Clock::now() + d;
    while (Clock::now() < until && stop_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  bool unreachable_for_too_long(const std::string& why) {
    auto now = Clock::now();
    if (!unreachable_since_) unreachable_since_ = now;
    auto gone = std::chrono::duration_cast<std::chrono::milliseconds>(now - *unreachable_since_);
    if (gone >= cfg_.unreachable_limit) {
      log::error(kComponent, "rendezvous service unreachable for too long; giving up",
                 {{"seconds", std::to_string(gone.count() / 1000)}, {"error", why}});
      return true;
    }
    log::warn(kComponent, "rendezvous service unreachable; retrying", {{"error", why}});
    return false;
  }

  std::string generation_dir(int64_t gen) const { return cfg_.work_dir + "/gen-" + std::to_string(gen); }

  void spawn(const rdzv::Assignment& a) {
    const std::string dir = generation_dir(a.generation);
    std::filesystem::create_directories(dir);
    // The operator's configuration, completed with this generation's place in the world.
    WorkerConfig config = a.config;
    WorkerConfig::Layout& layout = config.layout ? *config.layout : config.layout.emplace();
    layout.dp = a.layout.dp;
    layout.tp = a.layout.tp;
    layout.pp = a.layout.pp;
    config.restore = a.restore;
    config.generation = a.generation;
    config.world_size = a.world_size;
    const std::string config_path = dir + "/config.json";
    write_file_atomic(config_path, to_json(config).dump(2) + "\n");

    std::vector<std::string> command = cfg_.command;
    if (command.empty()) {
      std::error_code ec;
      auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
      command = {ec ? std::string("railyard-worker") : self.string(), "train", "--config", config_path};
    }

    // Everything the child needs is built before fork: between fork and exec only async-signal-safe calls.
    static const std::set<std::string> kOverridden = {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "RAILYARD_GENERATION",
        "RAILYARD_CONFIG",
        "RAILYARD_RESTORE",
        "RAILYARD_POD_INDEX",
        "RAILYARD_NUM_PODS",
        "RAILYARD_DP",
        "RAILYARD_TP",
        "RAILYARD_PP",
        "RAILYARD_PROGRESS_FILE",
        "RAILYARD_SHM_PREFIX",
        "RAILYARD_SHM_PEER_STEPS",
        "RAILYARD_STORE_TOKEN",
        "RAILYARD_RENDEZVOUS_CA",
        "RAILYARD_RENDEZVOUS_TOKEN"  // workers never talk to the service: keep the secret in the agent
    };
    const std::string generation_store_token = store_token(cfg_.token, cfg_.ns, cfg_.job, a.generation);
    std::vector<std::string> base_env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv = *e;
      if (kOverridden.count(kv.substr(0, kv.find('=')))) continue;
      // NCCL_* from the downward API read as empty when the Binding had no value for them (operator nccl_env.h):
      // unset, not empty, is NCCL's "choose yourself".
      if (kv.rfind("NCCL_", 0) == 0 && kv.back() == '=') continue;
      base_env.push_back(std::move(kv));
    }
    const std::string exec_error = "railyard agent: cannot exec the worker command \"" + command.front() +
                                   "\" (not found or not executable); exit code 127\n";
    std::vector<char*> argv;
    for (auto& s : command) argv.push_back(s.data());
    argv.push_back(nullptr);

    // The job's failurePolicy.maxRestarts, as the operator passes it to program pods (0 when not told).
    const char* mr = std::getenv("RAILYARD_MAX_RESTARTS");
    const std::string max_restarts = mr != nullptr && *mr != '\0' ? mr : "0";
    workers_.clear();
    if (ranks_out_) ranks_out_->start_generation(a.generation, a.ranks, unix_now());
    for (int l = 0; l < a.local_world_size; ++l) {
      Worker w;
      w.local_rank = l;
      w.global_rank = a.ranks[l];
      w.progress_file = dir + "/progress-" + std::to_string(l) + ".json";
      // A pod re-created with the same name gets the same work dir: never forward a previous run's progress.
      std::error_code rm_ec;
      std::filesystem::remove(w.progress_file, rm_ec);
      std::vector<std::string> env = base_env;
      auto add = [&](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
      add("RANK", std::to_string(w.global_rank));
      add("LOCAL_RANK", std::to_string(l));
      add("WORLD_SIZE", std::to_string(a.world_size));
      add("LOCAL_WORLD_SIZE", std::to_string(a.local_world_size));
      add("GROUP_RANK", std::to_string(a.pod_index));
      // The rest of what torch.distributed.run gives a script (one role, "default"), so an unmodified torchrun
      // script runs: a restart count of generation - 1 (every restart or resize opens a generation).
      add("GROUP_WORLD_SIZE", std::to_string(a.num_pods));
      add("ROLE_RANK", std::to_string(w.global_rank));
      add("ROLE_WORLD_SIZE", std::to_string(a.world_size));
      add("ROLE_NAME", "default");
      add("TORCHELASTIC_RESTART_COUNT", std::to_string(std::max<int64_t>(0, a.generation - 1)));
      add("TORCHELASTIC_MAX_RESTARTS", max_restarts);
      add("TORCHELASTIC_RUN_ID", cfg_.ns + "_" + cfg_.job);
      add("TORCHELASTIC_USE_AGENT_STORE", "False");
      add("MASTER_ADDR", a.master_addr);
      add("MASTER_PORT", std::to_string(a.master_port));
      add("RAILYARD_GENERATION", std::to_string(a.generation));
      add("RAILYARD_CONFIG", config_path);
      add("RAILYARD_RESTORE", a.restore);
      add("RAILYARD_POD_INDEX", std::to_string(a.pod_index));
      add("RAILYARD_NUM_PODS", std::to_string(a.num_pods));
      add("RAILYARD_DP", std::to_string(a.layout.dp));
      add("RAILYARD_TP", std::to_string(a.layout.tp));
      add("RAILYARD_PP", std::to_string(a.layout.pp));
      add("RAILYARD_PROGRESS_FILE", w.progress_file);
      add("RAILYARD_SHM_PREFIX", shm_prefix_);
      if (auto it = peer_steps_.find(w.global_rank); it != peer_steps_.end()) {
        std::string steps;
        for (int64_t st : it->second) {
          if (!steps.empty()) steps += ',';
          steps += std::to_string(st);
        }
        add("RAILYARD_SHM_PEER_STEPS", steps);
      }
      add("RAILYARD_STORE_TOKEN", generation_store_token);
      std::vector<char*> envp;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      const pid_t parent = ::getpid();
      const OutputWatch::ChildEnds ends = output_ ? output_->open(l) : OutputWatch::ChildEnds{};

      pid_t pid = ::fork();
      if (pid < 0) throw Error(std::string("agent: fork failed: ") + std::strerror(errno));
      if (pid == 0) {
        ::setpgid(0, 0);  // own group: signals reach the whole worker tree, and the pod's group signal does not
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a killed agent
        if (::getppid() != parent) ::_exit(127);
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::signal(SIGPIPE, SIG_DFL);
        if (ends.out >= 0 && (::dup2(ends.out, 1) < 0 || ::dup2(ends.err, 2) < 0)) ::_exit(127);
        ::execvpe(argv[0], argv.data(), envp.data());
        (void)!::write(2, exec_error.data(), exec_error.size());
        ::_exit(127);
      }
      if (ends.out >= 0) {
        ::close(ends.out);  // the child holds them now: EOF on the read end once it and its children are gone
        ::close(ends.err);
      }
      ::setpgid(pid, pid);
      w.pid = pid;
      w.running = true;
      workers_.push_back(w);
      metrics_.worker_starts.increment();
      log::info(kComponent, "worker started",
                {{"generation", std::to_string(a.generation)},
                 {"rank", std::to_string(w.global_rank)},
                 {"local_rank", std::to_string(l)},
                 {"pid", std::to_string(pid)}});
    }
  }

  void record_exit(Worker& w, int status, const char* reason) {
    w.running = false;
    if (WIFEXITED(status)) {
      w.exit_code = WEXITSTATUS(status);
      w.signal = 0;
    } else if (WIFSIGNALED(status)) {
      w.exit_code = -1;
      w.signal = WTERMSIG(status);
    }
    metrics_.worker_exits
        .add(metrics_.with_outcome(w.signal != 0      ? "signaled"
                                   : w.exit_code == 0 ? "succeeded"
                                                      : "failed"))
        .increment();
    log::info(kComponent, "worker exited",
              {{"generation", std::to_string(generation_)},
               {"rank", std::to_string(w.global_rank)},
               {"exit_code", std::to_string(w.exit_code)},
               {"signal", std::to_string(w.signal)}});
    if (reason != nullptr) {
      pending_.push_back({ref(), generation_, w.local_rank, w.exit_code, w.signal, reason});
    }
  }

  void reap(const char* reason) {
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid) record_exit(w, status, reason);
    }
  }

  bool any_running() const {
    for (const auto& w : workers_)
      if (w.running) return true;
    return false;
  }

  // Signals every worker's group, waits up to the grace period, then SIGKILLs what is left. reason: the exit
  // reason reported to the service, or nullptr to report nothing (the generation is already superseded).
  void stop_workers(int sig, const char* reason) {
    for (auto& w : workers_)
      if (w.running) {
        ::kill(-w.pid, sig);
        // A stopped (hung, SIGSTOPped) worker cannot act on the signal until it runs again: continue it, so it
        // saves its step and exits within the grace instead of waiting for SIGKILL.
        if (sig != SIGKILL) ::kill(-w.pid, SIGCONT);
      }
    auto until = Clock::now() + cfg_.grace;
    while (any_running() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      reap(reason);
    }
    for (auto& w : workers_) {
      ::kill(-w.pid, SIGKILL);  // also orphans left in the group by a worker that already exited
      if (!w.running) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, 0) == w.pid) record_exit(w, status, reason);
    }
  }

  // Sends queued exit reports; keeps those that could not be delivered. Stops at the first unreachable answer so
  // that a dead service costs one call's retries, not one per report.
  void flush_reports() {
    std::vector<rdzv::ExitReport> keep;
    bool reachable = true;
    for (const auto& rep : pending_) {
      if (!reachable) {
        keep.push_back(rep);
        continue;
      }
      try {
        auto r = client_.report_exit(rep);
        if (r.outcome == Outcome::UnknownJob) keep.push_back(rep);  // delivered once the job is re-opened
      } catch (const RendezvousUnavailable& e) {
        log::warn(kComponent, "exit report not delivered yet", {{"error", e.what()}});
        keep.push_back(rep);
        reachable = false;
      } catch (const ConfigError& e) {
        log::error(kComponent, std::string("exit report refused: ") + e.what());
      }
    }
    pending_ = std::move(keep);
  }

  void forward_progress() {
    for (auto& w : workers_) {
      if (output_ && ranks_out_) ranks_out_->on_output(w.local_rank, output_->last_output(w.local_rank));
      std::ifstream in(w.progress_file);
      if (!in) continue;
      std::optional<ProgressRecord> p = parse_progress(std::string(std::istreambuf_iterator<char>(in), {}));
      if (!p || p->step == w.last_step) continue;
      if (ranks_out_) {
        struct stat st {};
        const double written = ::stat(w.progress_file.c_str(), &st) == 0
                                   ? static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9
                                   : unix_now();
        ranks_out_->on_progress(w.local_rank, *p, written);
      }
      if (p->has_loss && !std::isfinite(p->loss)) {
        // Not a number the job's status can show: the monitor's non-finite rule acts on it (from the series above).
        w.last_step = p->step;
        continue;
      }
      rdzv::ProgressReport rep;
      rep.ref = ref();
      rep.generation = generation_;
      rep.local_rank = w.local_rank;
      rep.step = p->step;
      rep.loss = p->has_loss ? p->loss : 0.0;
      rep.tokens_per_second = p->tokens_per_second;
      try {
        client_.report_progress(rep);
        w.last_step = p->step;
      } catch (const std::exception& e) {
        log::debug(kComponent, "progress report failed", {{"error", e.what()}});
      }
    }
  }

  bool all_ok() const {
    if (workers_.empty()) return false;
    for (const auto& w : workers_)
      if (w.running || w.exit_code != 0 || w.signal != 0) return false;
    return true;
  }

  std::pair<After, int> finish(int sig, const char* reason, After after, int code) {
    stop_workers(sig, reason);
    if (reason != nullptr) flush_reports();
    return {after, code};
  }

  std::pair<After, int> run_generation(const rdzv::Assignment& a) {
    generation_ = a.generation;
    last_generation_ = a.generation;
    pending_.clear();
    metrics_.generation.set(static_cast<double>(a.generation));
    metrics_.generations.increment();
    log::info(kComponent, "joined",
              {{"generation", std::to_string(a.generation)},
               {"world_size", std::to_string(a.world_size)},
               {"pod_index", std::to_string(a.pod_index)},
               {"first_rank", std::to_string(a.ranks.front())},
               {"master", a.master_addr + ":" + std::to_string(a.master_port)}});
    set_up_peer_copy(a);
    try {
      spawn(a);
      ran_workers_ = true;
    } catch (const std::exception& e) {
      log::error(kComponent, std::string("cannot start workers: ") + e.what());
      return finish(SIGKILL, nullptr, After::Exit, kAgentConfigError);
    }
    auto next_poll = Clock::now();
    bool said_forgotten = false;
    while (true) {
      if (int s = stop_.load()) {
        log::info(kComponent, "forwarding signal to workers", {{"signal", std::to_string(s)}});
        return finish(s, rdzv::kExitStopped, After::Exit, 128 + s);
      }
      reap(rdzv::kExitExited);
      // A worker's last steps (the final loss) may have been written after the last poll: forward them before its
      // exit, so the job's status never ends on a stale step or loss.
      if (!pending_.empty()) forward_progress();
      if (!pending_.empty()) flush_reports();
      last_all_ok_ = all_ok();
      if (Clock::now() < next_poll) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      next_poll = Clock::now() + cfg_.poll_interval;
      forward_progress();
      RendezvousClient::Result r;
      try {
        r = client_.status({ref(), generation_, 0});
      } catch (const ConfigError& e) {
        log::error(kComponent, e.what());
        return finish(SIGTERM, nullptr, After::Exit, kAgentConfigError);
      } catch (const RendezvousUnavailable& e) {
        metrics_.unreachable.increment();
        if (unreachable_for_too_long(e.what())) return finish(SIGTERM, nullptr, After::Exit, kAgentUnreachable);
        continue;
      }
      unreachable_since_.reset();
      switch (r.outcome) {
        case Outcome::Running:
          said_forgotten = false;
          break;
        case Outcome::Done:
          if (last_all_ok_) {
            log::info(kComponent, "job done; all local workers succeeded");
            return {After::Exit, kAgentSucceeded};
          }
          break;
        case Outcome::Superseded:
          log::info(kComponent, "generation superseded; stopping workers and re-joining",
                    {{"generation", std::to_string(generation_)}, {"new_generation", std::to_string(r.generation)}});
          return finish(SIGTERM, nullptr, After::Rejoin, 0);
        case Outcome::Closed:
          log::info(kComponent, "job closed by the operator", {{"local_workers_succeeded", last_all_ok_ ? "1" : "0"}});
          return finish(SIGTERM, nullptr, After::Exit, last_all_ok_ ? kAgentSucceeded : kAgentFailed);
        case Outcome::UnknownJob:
          if (!said_forgotten) {
            log::warn(kComponent, "rendezvous service forgot the job (operator restarting?); workers keep running");
            said_forgotten = true;
          }
          break;
        case Outcome::Waiting: {
          // The operator re-opened this generation after a restart: re-attach with the running assignment.
          rdzv::JoinRequest req{ref(),
                                generation_,
                                cfg_.procs_per_pod,
                                cfg_.pod_ip,
                                a.master_port,
                                agent_id_,
                                0,
                                peer_server_ ? peer_server_->port() : 0};
          try {
            auto j = client_.join(req);
            if (j.outcome == Outcome::Ready) {
              const auto& b = j.assignment;
              if (b.ranks == a.ranks && b.world_size == a.world_size && b.master_addr == a.master_addr &&
                  b.master_port == a.master_port) {
                log::info(kComponent, "re-attached to the re-opened generation");
              } else {
                log::info(kComponent, "re-opened generation has another world; restarting workers");
                return finish(SIGTERM, nullptr, After::Rejoin, 0);
              }
            } else if (j.outcome == Outcome::Superseded || j.outcome == Outcome::Started ||
                       j.outcome == Outcome::NotMember) {
              return finish(SIGTERM, nullptr, After::Rejoin, 0);
            }
          } catch (const ConfigError& e) {
            log::error(kComponent, e.what());
            return finish(SIGTERM, nullptr, After::Exit, kAgentConfigError);
          } catch (const RendezvousUnavailable&) {
          }
          break;
        }
        default:
          break;
      }
    }
  }

  // The peer copy (docs/checkpointing.md "The peer copy"). A replacement pod (this agent never ran workers, and the
  // generation restores) first fetches its ranks' copies from the other pods, the ring's next pod first (it held this
  // pod index's copies), into its own slots; then every agent streams its ranks' slots to the next pod in the ring.
  void set_up_peer_copy(const rdzv::Assignment& a) {
    peer_steps_.clear();
    const bool on =
        peer_sender_ && a.config.memory_tier_on() && a.num_pods > 1 && static_cast<int>(a.peers.size()) == a.num_pods;
    if (!on) {
      if (peer_sender_) peer_sender_->set({}, "");
      return;
    }
    const peer::Auth auth{cfg_.ns + "/" + cfg_.job, peer_copy_token(cfg_.token, cfg_.ns, cfg_.job)};
    if (!ran_workers_ && !a.restore.empty()) {
      const auto t0 = Clock::now();
      for (int rank : a.ranks) {
        const std::string base = shm_prefix_ + "-r" + std::to_string(rank);
        std::string why_all;
        for (int k = 1; k < a.num_pods; ++k) {
          const int i = (a.pod_index + k) % a.num_pods;
          if (a.peers[i].empty()) continue;
          std::string why;
          auto steps = peer::fetch(a.peers[i], auth, rank, base, &why);
          if (!steps.empty()) {
            peer_steps_[rank] = steps;
            std::string list;
            for (int64_t st : steps) {
              if (!list.empty()) list += ',';
              list += std::to_string(st);
            }
            log::info(kComponent, "fetched the peer copies of a rank",
                      {{"rank", std::to_string(rank)},
                       {"from", a.pods[i]},
                       {"steps", list},
                       {"seconds", std::to_string(std::chrono::duration<double>(Clock::now() - t0).count())}});
            break;
          }
          if (!why_all.empty()) why_all += "; ";
          why_all += a.pods[i] + ": " + why;
        }
        if (!peer_steps_.count(rank)) {
          log::info(kComponent, "no peer copy of a rank: its workers restore from storage",
                    {{"rank", std::to_string(rank)}, {"why", why_all}});
        }
      }
    }
    peer_first_logged_ = false;
    std::map<int, std::string> ranks;
    for (int rank : a.ranks) ranks[rank] = shm_prefix_ + "-r" + std::to_string(rank);
    peer_sender_->set(std::move(ranks), a.peers[(a.pod_index + 1) % a.num_pods]);
  }

  // "/railyard-<ns>_<pod>-": the in-memory checkpoint segments of this pod's workers (docs/checkpointing.md).
  static std::string shm_pod_prefix(const AgentConfig& c) {
    std::string s = "/railyard-";
    for (char ch : c.ns + "_" + c.pod)
      s += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-') ? ch : '_';
    return s + "-";
  }

 public:
  // The agent owns its workers' in-memory checkpoint segments: they outlive a worker restarted in place (same agent)
  // and are removed when the agent ends (its pod terminates or the job is done).
  ~AgentRun() {
    // Stop sending and receiving first: nothing may create a segment after the removal below.
    peer_sender_.reset();
    peer_server_.reset();
    if (const uint64_t n = peer_copies_.load(); n > 0) {
      log::info(kComponent, "peer copies sent",
                {{"count", std::to_string(n)},
                 {"mean_seconds", std::to_string(peer_copy_seconds_sum_.load() / static_cast<double>(n))},
                 {"max_seconds", std::to_string(peer_copy_seconds_max_.load())}});
    }
    if (int n = ckpt::ShmStore::remove_prefix(shm_prefix_); n > 0)
      log::info(kComponent, "removed the in-memory checkpoint segments", {{"count", std::to_string(n)}});
  }

 private:
  const AgentConfig& cfg_;
  const std::atomic<int>& stop_;
  RendezvousClient client_;
  std::string agent_id_;
  std::string shm_pod_prefix_;
  std::string shm_prefix_;
  std::vector<Worker> workers_;
  std::vector<rdzv::ExitReport> pending_;
  int64_t generation_ = 0;
  int64_t last_generation_ = 0;
  bool last_all_ok_ = false;
  std::optional<Clock::time_point> unreachable_since_;
  AgentMetrics metrics_;
  bool ran_workers_ = false;                        // this agent started workers before (not a replacement pod)
  std::map<int, std::vector<int64_t>> peer_steps_;  // rank -> steps fetched from a peer for this generation
  std::atomic<uint64_t> peer_copies_{0};
  std::atomic<double> peer_copy_seconds_sum_{0}, peer_copy_seconds_max_{0};
  std::atomic<bool> peer_first_logged_{false};  // the first copy to each new target is logged at info
  std::unique_ptr<peer::PeerServer> peer_server_;
  std::unique_ptr<peer::PeerSender> peer_sender_;
  std::unique_ptr<RankExporter> ranks_out_;  // a program's ranks: their series, served by the agent
  std::unique_ptr<OutputWatch> output_;      // with ranks_out_: the ranks' output, and when they last wrote
};

}  // namespace

AgentConfig AgentConfig::from_env(std::vector<std::string> command) {
  AgentConfig c;
  c.ns = required_env("RAILYARD_JOB_NAMESPACE", "the TrainingJob's namespace");
  c.job = required_env("RAILYARD_JOB_NAME", "the TrainingJob's name");
  c.pod = required_env("RAILYARD_POD_NAME", "this pod's name (fieldRef metadata.name)");
  c.pod_ip = required_env("RAILYARD_POD_IP", "this pod's IP (fieldRef status.podIP)");
  c.rendezvous_addr = required_env("RAILYARD_RENDEZVOUS_ADDR", "the operator's rendezvous service as host:port");
  c.token = required_env("RAILYARD_RENDEZVOUS_TOKEN", "the job's token (secretKeyRef <job>-rendezvous/token)");
  c.rendezvous_ca = env_or("RAILYARD_RENDEZVOUS_CA", "");
  c.procs_per_pod = static_cast<int>(int_env("RAILYARD_PROCS_PER_POD", 1, 1, 4096));
  c.command = std::move(command);
  const char* tmp = std::getenv("TMPDIR");
  c.work_dir = env_or("RAILYARD_AGENT_DIR",
                      std::string(tmp && *tmp ? tmp : "/tmp") + "/railyard-agent/" + c.ns + "_" + c.job + "_" + c.pod);
  c.poll_interval = std::chrono::milliseconds(int_env("RAILYARD_AGENT_POLL_MS", 500, 50, 1000));
  c.grace = std::chrono::seconds(int_env("RAILYARD_AGENT_GRACE_SECONDS", 10, 0, 3600));
  c.unreachable_limit = std::chrono::seconds(int_env("RAILYARD_AGENT_UNREACHABLE_SECONDS", 600, 1, 86400));
  c.metrics_port = static_cast<int>(int_env("RAILYARD_AGENT_METRICS_PORT", -1, 0, 65535));
  c.node = env_or("RAILYARD_NODE_NAME", "");
  c.peer_port = static_cast<int>(int_env("RAILYARD_AGENT_PEER_PORT", 0, -1, 65535));
  if (env_or("RAILYARD_AGENT_RANK_METRICS", "") == "1") {
    c.rank_metrics_port = static_cast<int>(int_env("RAILYARD_METRICS_PORT", -1, 1, 65535 - c.procs_per_pod));
    if (c.rank_metrics_port < 0)
      throw ConfigError("RAILYARD_AGENT_RANK_METRICS=1 needs RAILYARD_METRICS_PORT: the port of local rank 0's series");
  }
  return c;
}

namespace {

// Hex HMAC-SHA256 keyed by the job's rendezvous token: a credential for one purpose, from which the token cannot be
// recovered, so only the derived value ever leaves the agent.
std::string derive_token(const std::string& rendezvous_token, const std::string& msg, const char* what) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), rendezvous_token.data(), static_cast<int>(rendezvous_token.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len) == nullptr) {
    throw Error(std::string("agent: HMAC-SHA256 of the ") + what + " failed (OpenSSL)");
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(hex[mac[i] >> 4]);
    out.push_back(hex[mac[i] & 15]);
  }
  return out;
}

}  // namespace

std::string store_token(const std::string& rendezvous_token, const std::string& ns, const std::string& job,
                        int64_t generation) {
  return derive_token(rendezvous_token,
                      "railyard bootstrap store\n" + ns + "/" + job + "\n" + std::to_string(generation),
                      "bootstrap store token");
}

std::string peer_copy_token(const std::string& rendezvous_token, const std::string& ns, const std::string& job) {
  return derive_token(rendezvous_token, "railyard peer copy\n" + ns + "/" + job, "peer copy token");
}

int run_agent(const AgentConfig& config, const std::atomic<int>& stop_signal) {
  AgentRun run(config, stop_signal);
  return run.run();
}

}  // namespace railyard::worker
