#include "worker/agent/pod_agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "checkpoint/shm_store.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/flash_checkpoint.h"
#include "common/log.h"
#include "common/metrics/job_labels.h"
#include "common/pod_env.h"
#include "common/torchrun.h"
#include "worker/agent/agent_metrics.h"
#include "worker/agent/flash_module.h"
#include "worker/agent/heartbeat.h"
#include "worker/agent/name_wait.h"
#include "worker/agent/output_watch.h"
#include "worker/agent/peer_ring.h"
#include "worker/agent/rank_env.h"
#include "worker/agent/rank_exporter.h"
#include "worker/agent/rendezvous_client.h"
#include "worker/agent/torchrun_launch.h"
#include "worker/agent/worker_group.h"
#include "worker/agent/worker_reports.h"

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

// Seconds as a decimal number in [0, max] (0 turns the feature off); unset: fallback.
double seconds_env(const char* name, double fallback, double max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !(x >= 0 && x <= max)) {
    throw ConfigError(std::string(name) + "=\"" + v + "\" must be a number of seconds in [0, " +
                      std::to_string(static_cast<int>(max)) + "] (0 turns it off)");
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

// A port that is free right now, offered to the service as the bootstrap store port in case this pod gets rank 0. 0
// when ip is not local (the service then falls back to its fixed port).
int free_port(const std::string& ip) {
  // The store binds every address (PyTorch's TCPStore: 0.0.0.0 and [::]) a moment later, after the worker started.
  // A port from the kernel's ephemeral range can be taken meanwhile by any outgoing connection of the pod (the
  // agent's own requests, peer copies), and the store then fails with EADDRINUSE (seen 2026-12-07 in
  // agent_process_test, where agents share one network namespace). So: a free port outside that range
  // (net.ipv4.ip_local_port_range; 32768-60999 by default), which only an explicit bind can take; 0 when none is
  // found.
  {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    const bool local = ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1 &&
                       ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (!local) return 0;
  }
  int eph_lo = 32768, eph_hi = 60999;
  if (std::ifstream r("/proc/sys/net/ipv4/ip_local_port_range"); r) {
    int lo = 0, hi = 0;
    if (r >> lo >> hi && lo >= 1024 && hi >= lo && hi <= 65535) eph_lo = lo, eph_hi = hi;
  }
  // [first, last] outside the ephemeral range, above the well-known ports, below the service's own fallback store
  // ports (29500 + a hash below 1000, PyTorch's habit) and Kubernetes' NodePort range (30000-32767, which kube-proxy
  // redirects on a node's addresses).
  std::vector<std::pair<int, int>> ranges;
  if (std::min(eph_lo - 1, 28999) >= 10000) ranges.push_back({10000, std::min(eph_lo - 1, 28999)});
  if (eph_hi + 1 <= 65535) ranges.push_back({eph_hi + 1, 65535});
  if (ranges.empty()) return 0;
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 64; ++attempt) {
    const auto& [first, last] = ranges[rng() % ranges.size()];
    const int port = first + static_cast<int>(rng() % static_cast<unsigned>(last - first + 1));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return port;
  }
  return 0;
}

enum class After { Rejoin, Exit };

// The coordinator of one agent: joins the rendezvous, runs each generation (its workers through WorkerGroup, its
// reports through WorkerReports, its peer copy through PeerRing) and decides what comes after it (re-join or exit).
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
    if (cfg.peer_port >= 0) peer_ = std::make_unique<PeerRing>(cfg, shm_prefix_, metrics_);
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
      log::info(kComponent, "serving the ranks' metrics from their progress and output",
                {{"address", cfg.pod_ip + ":" + std::to_string(ranks_out_->port(0)) + "/metrics"},
                 {"ranks", std::to_string(cfg.procs_per_pod)}});
    }
    // Every rank's output passes through the agent: a failed rank's last lines go with its exit report. A torchrun
    // writes a failure summary naming the failed rank: a longer tail keeps all of it.
    output_ = cfg.torchrun ? std::make_unique<OutputWatch>(cfg.procs_per_pod, 40, 8192)
                           : std::make_unique<OutputWatch>(cfg.procs_per_pod);
    reports_.emplace(client_, ref(), ranks_out_.get(), output_.get());
    if (!cfg.torchrun) reports_->watch_hangs(cfg.hang);
    workers_.emplace(cfg.grace, metrics_, output_.get(),
                     [this](const Worker& w, const char* reason) { reports_->exited(w, reason); });
    if (cfg.torchrun) {
      reports_->set_torchrun(cfg.procs_per_pod);
      output_->set_marker(kTorchrunFailedMarker);
      workers_->set_end_process_tree(true);
      // torchrun's ranks outlive a killed torchrun unless someone ends them (torch >= 2 starts them in sessions of
      // their own): as their subreaper the agent finds them as its own children once torchrun is gone.
      if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
        log::warn(kComponent, std::string("prctl(PR_SET_CHILD_SUBREAPER) failed: ") + std::strerror(errno));
    }
  }

  int run() {
    log::info(kComponent, "starting",
              {{"job", cfg_.ns + "/" + cfg_.job},
               {"pod", cfg_.pod},
               {"pod_uid", cfg_.pod_uid},
               {"pod_ip", cfg_.pod_ip},
               {"rendezvous", cfg_.rendezvous_addr},
               {"tls", client_.tls() ? "on" : "off"},
               {"procs", std::to_string(cfg_.procs_per_pod)},
               {"agent_id", agent_id_}});
    // The beat that tells the service this pod is alive while the loops below are busy elsewhere (join, stopping
    // workers, peer copies): a status poll for the generation it last knew, its answer ignored (the loops act on
    // their own polls). Stops with run().
    const Heartbeat beat(cfg_.poll_interval, [this] {
      // Only while the loops are silent: a request of theirs in flight, or one that ended within the period, is heard
      // already (no extra load on the service while training).
      if (speaking_.load() > 0 || steady_ms() - spoke_at_ms_.load() < cfg_.poll_interval.count()) return;
      try {
        client_.status({ref(), beat_generation_.load(), 0});
      } catch (const std::exception&) {
        // Unreachable or refused: the main loop sees the same on its own requests and acts on it.
      }
    });
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
      RendezvousClient::Result r;
      try {
        r = speak([&] {
          return client_.join(join_request(last_generation_, free_port(cfg_.pod_ip), cfg_.join_wait.count()));
        });
      } catch (const ConfigError& e) {
        log::error(kComponent, e.what());
        return kAgentConfigError;
      } catch (const RendezvousUnavailable& e) {
        metrics_.unreachable.increment();
        if (unreachable_for_too_long(e.what(), cfg_.unreachable_limit)) return kAgentUnreachable;
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
          if (r.missing_count > r.missing.size()) missing += ",... (" + std::to_string(r.missing_count) + " in all)";
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
          if (Clock::now() - unknown_since >= cfg_.unknown_job_limit) {
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
        case Outcome::Fenced:
          log::error(kComponent, "fenced: " + r.message);
          return kAgentFenced;
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

  rdzv::JobRef ref() const { return {cfg_.ns, cfg_.job, cfg_.pod, cfg_.pod_uid}; }

  static int64_t steady_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  }
  // A request of the main loop: the heartbeat stays quiet while it is in flight and for a period after.
  template <typename Call>
  auto speak(Call call) -> decltype(call()) {
    struct Speaking {
      AgentRun& a;
      explicit Speaking(AgentRun& run) : a(run) {
        ++a.speaking_;
        a.spoke_at_ms_ = steady_ms();
      }
      ~Speaking() {
        a.spoke_at_ms_ = steady_ms();
        --a.speaking_;
      }
    } speaking(*this);
    return call();
  }

  // store_port: offered for the bootstrap store should this pod get rank 0. wait_ms: the long-poll hold.
  rdzv::JoinRequest join_request(int64_t generation, int store_port, int64_t wait_ms) const {
    rdzv::JoinRequest req;
    req.ref = ref();
    req.generation = generation;
    req.local_procs = cfg_.procs_per_pod;
    req.pod_ip = cfg_.pod_ip;
    req.store_port = store_port;
    req.agent_id = agent_id_;
    req.wait_ms = wait_ms;
    req.peer_port = peer_ ? peer_->port() : 0;
    req.heartbeat_ms = cfg_.poll_interval.count();
    return req;
  }

  void sleep_interruptible(std::chrono::milliseconds d) {
    auto until = Clock::now() + d;
    while (Clock::now() < until && stop_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // limit 0: never too long.
  bool unreachable_for_too_long(const std::string& why, std::chrono::milliseconds limit) {
    auto now = Clock::now();
    if (!unreachable_since_) unreachable_since_ = now;
    auto gone = std::chrono::duration_cast<std::chrono::milliseconds>(now - *unreachable_since_);
    if (limit.count() > 0 && gone >= limit) {
      log::error(kComponent, "rendezvous service unreachable for too long; giving up",
                 {{"seconds", std::to_string(gone.count() / 1000)}, {"error", why}});
      return true;
    }
    log::warn(kComponent, "rendezvous service unreachable; retrying", {{"error", why}});
    return false;
  }

  std::string generation_dir(int64_t gen) const { return cfg_.work_dir + "/gen-" + std::to_string(gen); }

  // Stable names (common/stable_names.h): with a pod domain, whether this pod's DNS name and the master's answer with
  // their IPs of this generation (waiting up to dns_wait for the cluster DNS to catch up). A pod's record appears a
  // moment after its IP, and a replaced pod's name can still answer with its predecessor's IP: a rank that met
  // either would fail to bootstrap. When they do not answer in time the generation runs on pod IPs, and says so.
  bool names_resolve(const rdzv::Assignment& a) {
    if (cfg_.pod_domain.empty() || a.pods.empty()) return false;
    std::vector<NameWant> want = {{names::pod_fqdn(a.pods.at(a.pod_index), cfg_.pod_domain), cfg_.pod_ip}};
    if (a.pod_index != 0) want.push_back({names::pod_fqdn(a.pods.front(), cfg_.pod_domain), a.master_addr});
    const auto t0 = Clock::now();
    if (wait_for_names(want, cfg_.dns_wait, [this] { return stop_.load() != 0; })) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      log::info(kComponent, "the pods' DNS names resolve",
                {{"domain", cfg_.pod_domain}, {"waited_ms", std::to_string(ms)}});
      return true;
    }
    std::string missing;
    for (const std::string& m : unresolved(want)) missing += (missing.empty() ? "" : "; ") + m;
    log::warn(kComponent,
              "the pods' DNS names do not resolve to their IPs: this generation uses pod IPs (MASTER_ADDR, hostfile); "
              "check the cluster DNS, or set spec.program.addresses IP",
              {{"unresolved", missing}, {"waited_s", std::to_string(cfg_.dns_wait.count() / 1000)}});
    return false;
  }

  // A program's ranks find the flash checkpoint module (docs/programs.md "Flash checkpoints") on their PYTHONPATH: the
  // agent carries its text and writes it next to its own files, so the image needs nothing installed and the module
  // always matches the agent that reads its slots. Returns the folder, or "" (with a warning) when it cannot be
  // written: the job runs on, and `import railyard_flash` fails in the program, naming the module.
  std::string deliver_flash_module() {
    const std::string dir = cfg_.work_dir + "/python";
    try {
      std::filesystem::create_directories(dir);
      write_file_atomic(dir + "/" + flash::kModuleFile, kFlashModuleSource);
      return dir;
    } catch (const std::exception& e) {
      log::warn(kComponent, "cannot write the flash checkpoint module for the ranks", {{"error", e.what()}});
      return "";
    }
  }

  // Writes the generation's configuration, then starts its workers, each with the environment of its rank.
  void spawn(const rdzv::Assignment& a) {
    const std::string dir = generation_dir(a.generation);
    std::filesystem::create_directories(dir);
    const std::string config_path = dir + "/config.json";
    write_file_atomic(config_path, to_json(generation_config(a)).dump(2) + "\n");
    std::vector<std::string> command = worker_command(cfg_.command, config_path);

    RankEnvParams params;
    params.run_id = cfg_.ns + "_" + cfg_.job;
    // The job's failurePolicy.maxRestarts, as the operator passes it to program pods (0 when not told).
    const char* mr = std::getenv(pod_env::kMaxRestarts);
    params.max_restarts = mr != nullptr && *mr != '\0' ? mr : "0";
    params.config_path = config_path;
    params.shm_prefix = shm_prefix_;
    params.peer_copy = peer_ && peer_->copying();
    params.store_token = store_token(cfg_.token, cfg_.ns, cfg_.job, a.generation);
    params.peer_tls = cfg_.identity;
    const WorldHosts hosts = world_hosts(a, cfg_.pod_domain, names_resolve(a));
    params.master_addr = hosts.master;
    if (!hosts.hosts.empty()) {
      // DeepSpeed's and MPI's hostfile, in rank order (common/stable_names.h): every pod of this generation.
      params.hostfile = dir + "/hostfile";
      write_file_atomic(params.hostfile, names::hostfile_text(hosts.hosts, a.local_world_size));
    }
    params.progress_dir = dir;
    if (!cfg_.command.empty()) params.python_path = deliver_flash_module();
    const std::vector<std::string> inherited = inherited_env(environ);
    std::vector<RankLaunch> launches;
    rank_slots_.clear();
    for (int l = 0; l < a.local_world_size; ++l) {
      RankLaunch r;
      r.local_rank = l;
      r.global_rank = a.ranks[l];
      r.progress_file = dir + "/" + torchrun::progress_file_name(l);
      // A pod re-created with the same name gets the same work dir: never forward a previous run's progress.
      std::error_code rm_ec;
      std::filesystem::remove(r.progress_file, rm_ec);
      params.progress_file = r.progress_file;
      params.peer_steps = peer_ ? peer_->fetched_steps(r.global_rank) : std::vector<int64_t>{};
      if (cfg_.torchrun) {
        // The ranks torchrun will start: their progress files, and their processes once found.
        Worker slot;
        slot.local_rank = l;
        slot.global_rank = r.global_rank;
        slot.progress_file = r.progress_file;
        rank_slots_.push_back(slot);
        if (l == 0) {
          r.env = torchrun_env(inherited, a, params);
          launches.push_back(std::move(r));
        }
        continue;
      }
      r.env = rank_env(inherited, a, l, params);
      launches.push_back(std::move(r));
    }
    if (ranks_out_) ranks_out_->start_generation(a.generation, a.ranks, unix_now());
    workers_->start(a.generation, std::move(command), std::move(launches));
  }

  // The workers whose progress and process state the agent forwards: each rank's process, or under torchrun the ranks
  // it found among torchrun's descendants (by their LOCAL_RANK; not found: no process state, progress still read).
  std::vector<Worker>& progress_sources(bool refresh) {
    if (!cfg_.torchrun) return workers_->workers();
    if (refresh) {
      const Worker* tr = workers_->workers().empty() ? nullptr : &workers_->workers().front();
      const bool running = tr != nullptr && tr->running;
      const std::vector<pid_t> pids =
          running ? find_rank_processes(tr->pid, static_cast<int>(rank_slots_.size())) : std::vector<pid_t>{};
      for (size_t l = 0; l < rank_slots_.size(); ++l) {
        rank_slots_[l].pid = running ? pids[l] : -1;
        rank_slots_[l].running = running && pids[l] > 0;
      }
    }
    return rank_slots_;
  }

  // torchrun mode: a rank failure torchrun announced is reported at once, the first of the generation (torchrun exits
  // only after its exit barrier, when every pod's torchrun is done or 300 s passed).
  void torchrun_failures() {
    for (const std::string& line : output_->take_marked(0)) {
      const auto f = parse_torchrun_failed_line(line);
      if (!f || f->local_rank >= cfg_.procs_per_pod || torchrun_failed_) continue;
      torchrun_failed_ = true;
      log::info(kComponent, "torchrun reports a failed rank",
                {{"generation", std::to_string(generation_)},
                 {"local_rank", std::to_string(f->local_rank)},
                 {"exit_code", std::to_string(f->exit_code)},
                 {"signal", std::to_string(f->signal)}});
      // What torchrun printed up to its line: the rank's own last words (its traceback) come before it.
      std::string words = output_->last_words(0, std::chrono::milliseconds(0));
      if (words.find(kTorchrunFailedMarker) == std::string::npos) words += (words.empty() ? "" : "\n") + line;
      reports_->rank_failed(f->local_rank, f->exit_code, f->signal, std::move(words));
    }
  }

  std::pair<After, int> finish(int sig, const char* reason, After after, int code) {
    if (cfg_.torchrun && sig == SIGTERM && torchrun_failed_ && !workers_->workers().empty()) {
      // A torchrun that saw a rank fail and whose ranks are all gone only waits in its exit barrier, in C++ where
      // Python's SIGTERM handler cannot run: the grace would pass for nothing.
      const Worker& tr = workers_->workers().front();
      const auto ranks = tr.running ? find_rank_processes(tr.pid, cfg_.procs_per_pod) : std::vector<pid_t>{};
      if (std::all_of(ranks.begin(), ranks.end(), [](pid_t p) { return p < 0; })) sig = SIGKILL;
    }
    workers_->stop(sig, reason);
    if (reason != nullptr) reports_->flush();
    return {after, code};
  }

  std::pair<After, int> run_generation(const rdzv::Assignment& a) {
    generation_ = a.generation;
    beat_generation_ = a.generation;
    torchrun_failed_ = false;
    last_generation_ = a.generation;
    reports_->start_generation(a.generation);
    metrics_.generation.set(static_cast<double>(a.generation));
    metrics_.generations.increment();
    log::info(kComponent, "joined",
              {{"generation", std::to_string(a.generation)},
               {"world_size", std::to_string(a.world_size)},
               {"pod_index", std::to_string(a.pod_index)},
               {"first_rank", std::to_string(a.ranks.front())},
               {"master", a.master_addr + ":" + std::to_string(a.master_port)}});
    if (peer_) peer_->set_up(a, !ran_workers_);
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
      workers_->reap(rdzv::kExitExited);
      if (cfg_.torchrun) torchrun_failures();
      // A worker's last steps (the final loss) may have been written after the last poll: forward them before its
      // exit, so the job's status never ends on a stale step or loss.
      if (reports_->pending()) reports_->forward_progress(progress_sources(false));
      if (reports_->pending()) reports_->flush();
      last_all_ok_ = workers_->all_ok();
      if (Clock::now() < next_poll) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      next_poll = Clock::now() + cfg_.poll_interval;
      reports_->forward_progress(progress_sources(true));
      RendezvousClient::Result r;
      try {
        r = speak([&] { return client_.status({ref(), generation_, 0}); });
      } catch (const ConfigError& e) {
        log::error(kComponent, e.what());
        return finish(SIGTERM, nullptr, After::Exit, kAgentConfigError);
      } catch (const RendezvousUnavailable& e) {
        // The workers keep training while the operator (or its leader election) is away: never a reason to stop
        // them (docs/rendezvous.md "When the operator is away"). Their exits are reported when it returns.
        metrics_.unreachable.increment();
        unreachable_for_too_long(e.what(), std::chrono::milliseconds(0));
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
        case Outcome::Fenced:
          // A replacement pod holds this name: these workers are a lost node's leftovers. SIGKILL, no grace: they
          // must not write a checkpoint or report anything more.
          log::error(kComponent, "fenced: " + r.message);
          return finish(SIGKILL, nullptr, After::Exit, kAgentFenced);
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
        case Outcome::Waiting:
          if (auto ended = reattach(a)) return *ended;
          break;
        default:
          break;
      }
    }
  }

  // The operator re-opened this generation after a restart: re-attach with the running assignment. nullopt: the
  // workers keep running (re-attached, or the service is unreachable: asked again at the next poll).
  std::optional<std::pair<After, int>> reattach(const rdzv::Assignment& a) {
    try {
      // The store the running workers use; no long-poll: the generation is running.
      auto j = speak([&] { return client_.join(join_request(generation_, a.master_port, 0)); });
      if (j.outcome == Outcome::Ready) {
        const auto& b = j.assignment;
        if (b.ranks == a.ranks && b.world_size == a.world_size && b.master_addr == a.master_addr &&
            b.master_port == a.master_port) {
          log::info(kComponent, "re-attached to the re-opened generation");
        } else {
          log::info(kComponent, "re-opened generation has another world; restarting workers");
          return finish(SIGTERM, nullptr, After::Rejoin, 0);
        }
      } else if (j.outcome == Outcome::Fenced) {
        log::error(kComponent, "fenced: " + j.message);
        return finish(SIGKILL, nullptr, After::Exit, kAgentFenced);
      } else if (j.outcome == Outcome::Superseded || j.outcome == Outcome::Started || j.outcome == Outcome::NotMember) {
        return finish(SIGTERM, nullptr, After::Rejoin, 0);
      }
    } catch (const ConfigError& e) {
      log::error(kComponent, e.what());
      return finish(SIGTERM, nullptr, After::Exit, kAgentConfigError);
    } catch (const RendezvousUnavailable&) {
    }
    return std::nullopt;
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
    if (peer_) peer_->stop();
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
  int64_t generation_ = 0;
  std::atomic<int64_t> beat_generation_{0};  // generation_, for the heartbeat's thread
  std::atomic<int> speaking_{0};             // requests of the main loop in flight (speak)
  std::atomic<int64_t> spoke_at_ms_{0};      // when one last started or ended (steady_ms)
  int64_t last_generation_ = 0;
  bool last_all_ok_ = false;
  std::optional<Clock::time_point> unreachable_since_;
  AgentMetrics metrics_;
  bool ran_workers_ = false;                 // this agent started workers before (not a replacement pod)
  std::unique_ptr<PeerRing> peer_;           // null when RAILYARD_AGENT_PEER_PORT is -1
  std::unique_ptr<RankExporter> ranks_out_;  // a program's ranks: their series, served by the agent
  std::unique_ptr<OutputWatch> output_;      // the ranks' output: when they last wrote, and their last lines
  std::optional<WorkerReports> reports_;     // set in the constructor, after ranks_out_ and output_
  std::optional<WorkerGroup> workers_;       // likewise
  std::vector<Worker> rank_slots_;           // torchrun mode: the ranks torchrun starts (progress_sources)
  bool torchrun_failed_ = false;             // torchrun mode: this generation's torchrun announced a failed rank
};

}  // namespace

AgentConfig AgentConfig::from_env(std::vector<std::string> command) {
  AgentConfig c;
  c.ns = required_env(pod_env::kJobNamespace, "the TrainingJob's namespace");
  c.job = required_env(pod_env::kJobName, "the TrainingJob's name");
  c.pod = required_env(pod_env::kPodName, "this pod's name (fieldRef metadata.name)");
  c.pod_ip = required_env(pod_env::kPodIp, "this pod's IP (fieldRef status.podIP)");
  c.rendezvous_addr = required_env(pod_env::kRendezvousAddr, "the operator's rendezvous service as host:port");
  c.token = required_env(pod_env::kRendezvousToken, "the job's token (secretKeyRef <job>-rendezvous/token)");
  c.rendezvous_ca = env_or(pod_env::kRendezvousCa, "");
  c.procs_per_pod = static_cast<int>(int_env(pod_env::kProcsPerPod, 1, 1, 4096));
  const std::string launcher = env_or(torchrun::kLauncherEnv, torchrun::kLauncherPerRank);
  if (launcher != torchrun::kLauncherPerRank && launcher != torchrun::kLauncherTorchrun)
    throw ConfigError(std::string(torchrun::kLauncherEnv) + "=\"" + launcher + "\" must be " +
                      torchrun::kLauncherTorchrun + " or " + torchrun::kLauncherPerRank +
                      " (the operator sets it from spec.program.launcher)");
  c.torchrun = launcher == torchrun::kLauncherTorchrun;
  c.command = std::move(command);
  const char* tmp = std::getenv("TMPDIR");
  c.work_dir = env_or(pod_env::kAgentDir,
                      std::string(tmp && *tmp ? tmp : "/tmp") + "/railyard-agent/" + c.ns + "_" + c.job + "_" + c.pod);
  c.poll_interval = std::chrono::milliseconds(int_env(pod_env::kAgentPollMs, 500, 50, 1000));
  c.grace = std::chrono::seconds(int_env(pod_env::kAgentGraceSeconds, 10, 0, 3600));
  c.unreachable_limit = std::chrono::seconds(int_env(pod_env::kAgentUnreachableSeconds, 0, 0, 86400));
  if (c.unreachable_limit.count() > 0) c.unknown_job_limit = c.unreachable_limit;
  c.pod_uid = env_or(rdzv::kPodUidEnv, "");
  if (c.pod_uid.size() > rdzv::kMaxPodUidLength)
    throw ConfigError(std::string(rdzv::kPodUidEnv) + " is longer than " + std::to_string(rdzv::kMaxPodUidLength) +
                      " characters: it must hold the pod's metadata.uid (fieldRef)");
  c.metrics_port = static_cast<int>(int_env(pod_env::kAgentMetricsPort, -1, 0, 65535));
  c.node = env_or(pod_env::kNodeName, "");
  c.peer_port = static_cast<int>(int_env(pod_env::kAgentPeerPort, 0, -1, 65535));
  if (env_or(pod_env::kAgentRankMetrics, "") == "1") {
    c.rank_metrics_port = static_cast<int>(int_env(pod_env::kMetricsPort, -1, 1, 65535 - c.procs_per_pod));
    if (c.rank_metrics_port < 0)
      throw ConfigError("RAILYARD_AGENT_RANK_METRICS=1 needs RAILYARD_METRICS_PORT: the port of local rank 0's series");
  }
  c.identity = pod_identity(c.pod_ip);
  c.pod_domain = env_or(names::kPodDomainEnv, "");
  // The pod's full name (<pod>.<domain>) must be a DNS name: what the operator sets always is.
  if (!c.pod_domain.empty() && !names::is_dns_subdomain(names::pod_fqdn(c.pod, c.pod_domain)))
    throw ConfigError(std::string(names::kPodDomainEnv) + "=\"" + c.pod_domain + "\" with pod " + c.pod +
                      " is not a DNS name of at most 253 characters: it must hold <service>.<namespace>.svc.<cluster "
                      "domain> (the operator sets it; unset it to use pod IPs)");
  c.dns_wait = std::chrono::seconds(int_env(names::kDnsWaitEnv, names::kDefaultDnsWaitSeconds, 0, 3600));
  c.hang.stopped_s = seconds_env(pod_env::kHangStoppedSeconds, c.hang.stopped_s, 86400);
  c.hang.stall_floor_s = seconds_env(pod_env::kHangStallSeconds, c.hang.stall_floor_s, 86400);
  return c;
}

int run_agent(const AgentConfig& config, const std::atomic<int>& stop_signal) {
  AgentRun run(config, stop_signal);
  return run.run();
}

}  // namespace railyard::worker
