#include "operator/rendezvous/rendezvous.h"

#include <httplib.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "common/error.h"
#include "common/log.h"
#include "common/log_tail.h"
#include "common/rendezvous_protocol.h"
#include "operator/rendezvous/request_pool.h"
#include "operator/rendezvous/silence.h"

namespace railyard::op {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace st = rdzv::status;

constexpr const char* kComponent = "rendezvous";
// Job::exits key of a pod reported silent (once per generation); -1 is an agent restart, >= 0 a local rank.
constexpr int kSilentMark = -2;
// How often the service looks for silent pods, and the gap in its own ticks that counts as its own stall (a paused
// or starved operator heard nobody meanwhile; silences are counted from when it ran again).
constexpr auto kWatchTick = std::chrono::milliseconds(100);
constexpr auto kOwnStall = std::chrono::milliseconds(1000);

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

bool tokens_equal(const std::string& a, const std::string& b) {
  // Length is not secret (tokens have a fixed length); the content comparison is constant time.
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// Whether fd is a listening socket bound to `port`.
bool is_listener_on(int fd, int port) {
  if (fd < 0) return false;
  int listening = 0;
  socklen_t len = sizeof listening;
  sockaddr_storage addr{};
  socklen_t alen = sizeof addr;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) return false;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) return false;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port) == port;
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port) == port;
  return false;
}

// "a, b, c"; past rdzv::kMaxPodsNamed names, "a, b, ... (N in all)": a message stays short for a world of thousands.
std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < rdzv::kMaxPodsNamed; ++i) out += (out.empty() ? "" : ", ") + names[i];
  if (names.size() > rdzv::kMaxPodsNamed) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

rdzv::Layout layout_of(const GenerationSpec& spec, int world) {
  rdzv::Layout l;
  l.dp = world;
  if (!spec.config.layout) return l;
  const WorkerConfig::Layout& j = *spec.config.layout;
  auto get = [&](const char* k, const std::optional<int>& v) {
    if (!v || *v < 1) {
      throw std::invalid_argument(std::string("GenerationSpec.config.layout.") + k +
                                  " must be a positive integer (layout is {dp, tp, pp})");
    }
    return *v;
  };
  l.dp = get("dp", j.dp);
  l.tp = get("tp", j.tp);
  l.pp = get("pp", j.pp);
  if (static_cast<int64_t>(l.dp) * l.tp * l.pp != world) {
    throw std::invalid_argument("GenerationSpec.config.layout: dp*tp*pp = " + std::to_string(l.dp * l.tp * l.pp) +
                                " but the world has " + std::to_string(world) +
                                " ranks (pods x procs_per_pod): make them equal");
  }
  return l;
}

void validate(const GenerationSpec& spec) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("GenerationSpec." + m); };
  auto slash = spec.job_key.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == spec.job_key.size()) {
    bad("job_key must be \"namespace/name\", got \"" + spec.job_key + "\"");
  }
  if (spec.generation < 1) bad("generation must be >= 1");
  if (spec.pods.empty()) bad("pods must name at least one pod");
  std::unordered_set<std::string> seen;
  for (const auto& p : spec.pods) {
    if (p.empty()) bad("pods must not contain an empty name");
    if (!seen.insert(p).second) bad("pods lists \"" + p + "\" twice");
  }
  if (spec.procs_per_pod < 1 || spec.procs_per_pod > 4096) bad("procs_per_pod must be in [1, 4096]");
  if (spec.token.empty()) bad("token must not be empty");
}

struct Member {
  std::string uid;  // the pod UID it joined with ("" from an agent that predates fencing)
  std::string ip;
  int store_port = 0;
  int peer_port = 0;
  std::string agent_id;
  Clock::time_point wait_start;
  bool window_open = false;  // a 408 closes the window; the next join opens a new one
};

struct Job {
  GenerationSpec spec;
  bool closed = false;
  rdzv::Layout layout;
  std::string restore;
  std::map<std::string, int> index;  // pod -> replica index
  std::map<std::string, Member> joined;
  bool complete = false;
  std::string master_addr;
  int master_port = 0;
  std::set<std::pair<std::string, int>> exits;  // (pod, local_rank) already delivered; local_rank -1 = agent restart
  int ranks_ok = 0;
  std::map<int, rdzv::ProgressReport> progress;  // by global rank
  // The first step any rank of this generation reported, and when it arrived: where recovery ends.
  int64_t first_step = 0;
  std::chrono::system_clock::time_point first_step_at{};
  // The highest step any rank reported, and when it arrived: where a failed generation last made progress.
  int64_t last_step = 0;
  std::chrono::system_clock::time_point last_step_at{};
  bool timeout_reported = false;

  // The assignment's fields shared by every pod, serialized once when the world completes (ready_reply): with N pods
  // each assignment lists N pods, peers and addresses, and N agents ask for one.
  std::shared_ptr<const std::string> shared_assignment;

  int world() const { return static_cast<int>(spec.pods.size()) * spec.procs_per_pod; }
  // The pods that have not joined, in pod order; at most `limit` of them.
  std::vector<std::string> missing(size_t limit = SIZE_MAX) const {
    std::vector<std::string> out;
    for (const auto& p : spec.pods) {
      if (out.size() >= limit) break;
      if (!joined.count(p)) out.push_back(p);
    }
    return out;
  }
  size_t missing_count() const { return spec.pods.size() - joined.size(); }  // joined holds members only
  std::vector<std::string> joined_names() const {
    std::vector<std::string> out;
    for (const auto& p : spec.pods)
      if (joined.count(p)) out.push_back(p);
    return out;
  }
};

struct Reply {
  Reply() = default;
  Reply(int c, json b) : code(c), body(std::move(b)) {}
  Reply(int c, std::shared_ptr<const std::string> serialized) : code(c), raw(std::move(serialized)) {}
  int code = 200;
  json body;
  std::shared_ptr<const std::string> raw;  // set: the body, already serialized (an assignment: ready_reply)
};

Reply error_reply(int code, const char* status, const std::string& message) {
  return {code, {{"status", status}, {"error", message}}};
}

}  // namespace

struct RendezvousService::Impl {
  RendezvousOptions opts;
  std::unique_ptr<httplib::Server> server;  // an httplib::SSLServer unless TLS is off
  std::thread thread;
  std::atomic<bool> listen_returned{false};
  int port = 0;
  int listen_fd = -1;  // the server's listening socket (set_socket_options), for its backlog

  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::map<std::string, Job> jobs;
  // Job key -> pod name -> the UID that holds the name now (set_pod_uids); kept across generations.
  std::map<std::string, std::map<std::string, std::string>> holders;
  // Job key -> UIDs that held a name once and no longer do: fenced for good.
  std::map<std::string, std::set<std::string>> retired;
  // Job key -> pod name -> what was last heard from the pod (UID) holding it, across generations: who fell silent.
  struct HeardFrom {
    std::string uid;
    Clock::time_point last{};
    int in_flight = 0;
    int64_t heartbeat_ms = 0;
  };
  std::map<std::string, std::map<std::string, HeardFrom>> heard;
  // Job key -> when a survivor last reported that its collective lost a peer (kExitPeerLost): a pod not heard since
  // then is judged silent sooner (silence.h).
  std::map<std::string, Clock::time_point> peer_lost;
  Clock::time_point service_resumed{};  // the end of the service's own last stall (watch)
  std::condition_variable watch_cv;
  std::thread watcher;  // runs watch() when opts.silence_after > 0

  // Under mu: a request of the pod that holds its name (a fenced or unknown UID, or none, says nothing). in_flight:
  // +1 as a long-poll starts, -1 as it ends.
  void hear(const rdzv::JobRef& ref, int in_flight = 0, int64_t heartbeat_ms = -1) {
    if (ref.uid.empty() || holder_of(ref) != Holder::kYes) return;
    HeardFrom& h = heard[ref.key()][ref.pod];
    if (h.uid != ref.uid) h = HeardFrom{ref.uid};
    h.last = Clock::now();
    h.in_flight = std::max(0, h.in_flight + in_flight);
    if (heartbeat_ms >= 0) h.heartbeat_ms = heartbeat_ms;
  }
  // A request held open (a long-poll) is heard for as long as it is held. Lives inside the request's lock.
  struct Listening {
    Impl& s;
    rdzv::JobRef ref;
    Listening(Impl& impl, const rdzv::JobRef& r, int64_t heartbeat_ms = -1) : s(impl), ref(r) {
      s.hear(ref, +1, heartbeat_ms);
    }
    ~Listening() { s.hear(ref, -1); }
    Listening(const Listening&) = delete;
    Listening& operator=(const Listening&) = delete;
  };

  // Under mu. Returns whether anything changed.
  bool replace_holders(const std::string& key, const std::map<std::string, std::string>& uids) {
    auto& h = holders[key];
    auto& gone = retired[key];
    for (const auto& [pod, uid] : h) {
      auto now = uids.find(pod);
      if (now == uids.end() || now->second != uid) gone.insert(uid);
    }
    std::map<std::string, std::string> next;
    for (const auto& [pod, uid] : uids)
      if (!gone.count(uid)) next.emplace(pod, uid);  // a stale cache naming a replaced pod again
    if (next == h) return false;
    h = std::move(next);
    return true;
  }

  enum class Holder { kYes, kUnknown, kFenced };
  // Whether the pod that sent `ref` is the one that holds its name now.
  Holder holder_of(const rdzv::JobRef& ref) const {
    // An agent that predates fencing, or a job whose operator tells no UIDs: known by name alone.
    if (ref.uid.empty()) return Holder::kYes;
    auto j = holders.find(ref.key());
    if (j == holders.end()) return Holder::kYes;
    // Fenced only once the operator has seen the name pass to another pod (or its pod deleted). A UID it was never
    // told of is a replacement created a moment ago (its agent can be quicker than the operator's next reconcile):
    // it retries, even while the name's holder is still the pod it replaces.
    if (auto r = retired.find(ref.key()); r != retired.end() && r->second.count(ref.uid)) return Holder::kFenced;
    auto p = j->second.find(ref.pod);
    return p != j->second.end() && p->second == ref.uid ? Holder::kYes : Holder::kUnknown;
  }

  Reply fenced_reply(const rdzv::JobRef& ref, const char* what) {
    const auto& h = holders.at(ref.key());
    const auto holder = h.find(ref.pod);
    const std::string now = holder == h.end() ? std::string("none") : holder->second;
    log::warn(kComponent, "refused a pod that no longer holds its name",
              {{"job", ref.key()}, {"pod", ref.pod}, {"uid", ref.uid}, {"holder", now}, {"request", what}});
    return error_reply(409, st::kFenced,
                       "pod " + ref.pod + " with uid " + ref.uid + " was replaced (the name is now held by uid " + now +
                           "): this pod is a leftover of a lost node or partition and must stop");
  }

  std::mutex handler_mu;
  std::function<void(const WorkerExit&)> on_exit;
  std::function<void(const JoinTimeout&)> on_timeout;

  // Events produced under `mu`, delivered after it is released.
  struct Events {
    std::vector<WorkerExit> exits;
    std::vector<JoinTimeout> timeouts;
  };

  void deliver(const Events& ev) {
    std::function<void(const WorkerExit&)> ex;
    std::function<void(const JoinTimeout&)> to;
    {
      std::lock_guard<std::mutex> l(handler_mu);
      ex = on_exit;
      to = on_timeout;
    }
    for (const auto& e : ev.exits) {
      if (!ex) continue;
      try {
        ex(e);
      } catch (const std::exception& err) {
        log::error(kComponent, "exit handler threw", {{"job", e.job_key}, {"error", err.what()}});
      }
    }
    for (const auto& t : ev.timeouts) {
      if (!to) continue;
      try {
        to(t);
      } catch (const std::exception& err) {
        log::error(kComponent, "join timeout handler threw", {{"job", t.job_key}, {"error", err.what()}});
      }
    }
  }

  // Under mu: the pods of running or forming generations that fell silent (silence.h), each reported once per
  // generation as a "silent" exit.
  void find_silent(Clock::time_point now, Events& ev) {
    for (auto& [key, job] : jobs) {
      if (job.closed || job.ranks_ok == job.world()) continue;
      auto heard_of = heard.find(key);
      auto holders_of = holders.find(key);
      if (heard_of == heard.end() || holders_of == holders.end()) continue;
      // Linear in the job's pods and exits (a tick must stay cheap for a gang of thousands).
      std::set<std::string> exited;
      for (const auto& [pod, rank] : job.exits)
        if (rank != kSilentMark) exited.insert(pod);
      std::vector<silence::Heard> pods;
      for (const std::string& pod : job.spec.pods) {
        auto h = heard_of->second.find(pod);
        if (h == heard_of->second.end()) continue;
        silence::Heard x;
        x.pod = pod;
        x.uid = h->second.uid;
        if (auto holder = holders_of->second.find(pod); holder != holders_of->second.end())
          x.holder_uid = holder->second;
        x.last = h->second.last;
        x.in_flight = h->second.in_flight;
        x.heartbeat_ms = h->second.heartbeat_ms;
        x.exited = exited.count(pod) > 0;
        pods.push_back(std::move(x));
      }
      const auto lost = peer_lost.find(key);
      const Clock::time_point lost_at = lost == peer_lost.end() ? Clock::time_point{} : lost->second;
      for (const silence::Silent& q : silence::find_silent(pods, now, service_resumed, opts.silence_after, lost_at)) {
        if (!job.exits.insert({q.pod, kSilentMark}).second) continue;
        char quiet[32], peer[32];
        std::snprintf(quiet, sizeof quiet, "%.1f", q.seconds);
        std::snprintf(peer, sizeof peer, "%.1f", q.peer_seconds);
        const std::string msg = "no request from the agent of pod " + q.pod + " (uid " + q.uid + ") for " + quiet +
                                " s although it promised one every " +
                                std::to_string(heard_of->second[q.pod].heartbeat_ms) + " ms, while pod " +
                                q.heard_peer + " was heard " + peer + " s ago" +
                                (q.corroborated ? " and a survivor reported losing a peer since" : "") +
                                ": the pod, its node or its network is frozen or gone";
        log::warn(kComponent, "a pod fell silent",
                  {{"job", key},
                   {"generation", std::to_string(job.spec.generation)},
                   {"pod", q.pod},
                   {"uid", q.uid},
                   {"silent_seconds", quiet},
                   {"heard_peer", q.heard_peer},
                   {"after_peer_lost", q.corroborated ? "true" : "false"}});
        WorkerExit e;
        e.job_key = key;
        e.generation = job.spec.generation;
        e.pod = q.pod;
        e.exit_code = 0;
        e.reason = kExitSilent;
        e.message = msg;
        e.uid = q.uid;
        e.onset = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                  std::chrono::duration<double>(now - q.last).count();
        ev.exits.push_back(std::move(e));
      }
    }
  }
  void watch() {
    std::unique_lock<std::mutex> lock(mu);
    Clock::time_point last_tick = Clock::now();
    while (!stopping) {
      watch_cv.wait_for(lock, kWatchTick);
      if (stopping) break;
      const auto now = Clock::now();
      if (now - last_tick > kOwnStall) service_resumed = now;
      last_tick = now;
      Events ev;
      find_silent(now, ev);
      if (!ev.exits.empty()) {
        lock.unlock();
        deliver(ev);
        lock.lock();
      }
    }
  }

  // Under mu. The 200 join reply of `pod` in the complete world of `job`: its own fields (status, pod_index, ranks),
  // then the ones every pod shares, serialized once per generation (Job::shared_assignment; the world's members no
  // longer change once it is complete). The same JSON as rdzv::to_json(assignment(job, pod)).
  Reply ready_reply(Job& job, const std::string& pod) const {
    if (!job.shared_assignment) {
      json shared = rdzv::to_json(assignment(job, pod));
      for (const char* k : {"status", "pod_index", "ranks"}) shared.erase(k);
      job.shared_assignment = std::make_shared<const std::string>(shared.dump());
    }
    const rdzv::Assignment own = assignment(job, pod, false);
    std::string body = json{{"status", st::kReady}, {"pod_index", own.pod_index}, {"ranks", own.ranks}}.dump();
    body.back() = ',';                       // "{own...}" -> "{own...,"
    body.append(*job.shared_assignment, 1);  // + "shared...}" (never empty: it holds the generation)
    return {200, std::make_shared<const std::string>(std::move(body))};
  }

  // The whole assignment of `pod`; with all = false only its own fields (pod_index, ranks) and the counts.
  rdzv::Assignment assignment(const Job& job, const std::string& pod, bool all = true) const {
    rdzv::Assignment a;
    a.generation = job.spec.generation;
    a.world_size = job.world();
    a.num_pods = static_cast<int>(job.spec.pods.size());
    a.pod_index = job.index.at(pod);
    a.local_world_size = job.spec.procs_per_pod;
    for (int l = 0; l < a.local_world_size; ++l) a.ranks.push_back(a.pod_index * a.local_world_size + l);
    if (!all) return a;
    a.layout = job.layout;
    a.master_addr = job.master_addr;
    a.master_port = job.master_port;
    a.restore = job.restore;
    a.pods = job.spec.pods;
    for (const auto& p : job.spec.pods) {
      auto m = job.joined.find(p);
      a.peers.push_back(m != job.joined.end() && m->second.peer_port > 0
                            ? m->second.ip + ":" + std::to_string(m->second.peer_port)
                            : std::string());
      a.addresses.push_back(m != job.joined.end() ? m->second.ip : std::string());
    }
    a.config = job.spec.config;
    return a;
  }

  // Looks up the job and checks the token; on failure returns the reply to send. An unknown job and a wrong token get
  // the same status and body (built only from the request), so the service tells nobody without a job's token which
  // job names exist. It is 404 unknown_job for both because agents must keep retrying an unknown job while the
  // operator (re)opens it; an agent with a wrong token gives up after RAILYARD_AGENT_UNREACHABLE_SECONDS with exit 2.
  std::optional<Reply> authorize(const std::string& key, const std::string& token, Job** out) {
    auto it = jobs.find(key);
    // Compare against something even for an unknown job so both paths do the same work.
    static const std::string kNoToken(64, '\0');  // the length of random_token()
    const bool ok = tokens_equal(token, it == jobs.end() ? kNoToken : it->second.spec.token) && it != jobs.end();
    if (!ok) {
      return error_reply(404, st::kUnknownJob,
                         "no open generation of job " + key +
                             " for this token: retry while the operator opens the job; if it persists, "
                             "RAILYARD_RENDEZVOUS_TOKEN must come from the job's Secret " +
                             key.substr(key.find('/') + 1) + "-rendezvous (key token)");
    }
    *out = &it->second;
    return std::nullopt;
  }

  // authorize, then hears the pod and checks that this replica holds the job, the job is open at the report's
  // generation and the pod is one of its members. Exit and progress reports take the same checks; one that fails
  // them is answered 200 stale, not an error.
  std::optional<Reply> authorize_current(const rdzv::JobRef& ref, int64_t generation, const std::string& token,
                                         Job** out) {
    if (auto r = authorize(ref.key(), token, out)) return r;
    hear(ref);
    const Job& job = **out;
    if (job.closed || job.spec.generation != generation || !job.index.count(ref.pod) ||
        holder_of(ref) != Holder::kYes) {
      return Reply{200, {{"status", st::kStale}, {"generation", job.spec.generation}}};
    }
    return std::nullopt;
  }

  Reply join(const rdzv::JoinRequest& req, const std::string& token, Events& ev) {
    std::unique_lock<std::mutex> lock(mu);
    Job* job = nullptr;
    if (auto r = authorize(req.ref.key(), token, &job)) return *r;
    const Listening listening(*this, req.ref, req.heartbeat_ms);
    if (job->closed) return error_reply(410, st::kClosed, "job " + req.ref.key() + " was closed by the operator");
    const int64_t gen = job->spec.generation;
    if (auto r = refuse_join(req, *job, gen)) return *r;
    if (job->complete) return join_started(req, *job, gen, ev);

    const auto now = Clock::now();
    const Member& m = record_join(req, *job, now);
    if (job->joined.size() == job->spec.pods.size()) return complete_world(req, *job, gen);

    const auto hold = std::min<int64_t>(req.wait_ms, opts.max_poll.count());
    const auto hold_until = now + std::chrono::milliseconds(hold);
    const auto deadline = m.wait_start + opts.join_timeout;
    return wait_for_world(lock, req, gen, deadline, hold_until, ev);
  }

  // Under mu. The reply refusing a join of `req` to generation `gen` of `job`: a pod that is not a member, a process
  // count the generation does not run, a pod that no longer (or not yet) holds its name; nullopt when it may join.
  std::optional<Reply> refuse_join(const rdzv::JoinRequest& req, const Job& job, int64_t gen) {
    if (!job.index.count(req.ref.pod)) {
      Reply r = error_reply(409, st::kNotMember,
                            "pod " + req.ref.pod + " is not part of generation " + std::to_string(gen) + " of job " +
                                req.ref.key() + " (pods: " + join_names(job.spec.pods) +
                                "); wait for the operator to open a generation with it");
      r.body["generation"] = gen;
      return r;
    }
    if (req.local_procs != job.spec.procs_per_pod) {
      return error_reply(
          400, st::kError,
          "field 'local_procs' is " + std::to_string(req.local_procs) + " but generation " + std::to_string(gen) +
              " runs " + std::to_string(job.spec.procs_per_pod) +
              " processes per pod: set RAILYARD_PROCS_PER_POD=" + std::to_string(job.spec.procs_per_pod));
    }
    switch (holder_of(req.ref)) {
      case Holder::kFenced:
        return fenced_reply(req.ref, "join");
      case Holder::kUnknown: {
        Reply r = error_reply(409, st::kNotMember,
                              "pod " + req.ref.pod + " with uid " + req.ref.uid +
                                  " is not yet known to the operator as the holder of that name; retry");
        r.body["generation"] = gen;
        return r;
      }
      case Holder::kYes:
        break;
    }
    return std::nullopt;
  }

  // Under mu. A join to a generation that already started: the same agent gets its assignment again; another agent
  // on the pod is an agent restart, reported once as an exit of the pod (local rank -1).
  Reply join_started(const rdzv::JoinRequest& req, Job& job, int64_t gen, Events& ev) {
    const Member& m = job.joined.at(req.ref.pod);
    if (m.agent_id == req.agent_id) return ready_reply(job, req.ref.pod);
    if (job.exits.insert({req.ref.pod, -1}).second) {
      ev.exits.push_back({req.ref.key(), gen, req.ref.pod, -1, -1, -1, 0, "agent_restarted"});
    }
    Reply r = error_reply(409, st::kStarted,
                          "generation " + std::to_string(gen) + " of job " + req.ref.key() +
                              " already started with another agent on pod " + req.ref.pod +
                              "; wait for the operator to open a new generation");
    r.body["generation"] = gen;
    return r;
  }

  // Under mu. Records the pod as joined; another agent, or the first join after a 408, opens a new wait window.
  const Member& record_join(const rdzv::JoinRequest& req, Job& job, Clock::time_point now) {
    Member& m = job.joined[req.ref.pod];
    if (m.agent_id != req.agent_id || !m.window_open) {
      m.wait_start = now;
      m.window_open = true;
    }
    m.agent_id = req.agent_id;
    m.uid = req.ref.uid;
    m.ip = req.pod_ip;
    m.store_port = req.store_port;
    m.peer_port = req.peer_port;
    return m;
  }

  // Under mu. Every pod has joined: the world is complete, its master is the first pod's store; wakes the waiters.
  Reply complete_world(const rdzv::JoinRequest& req, Job& job, int64_t gen) {
    job.complete = true;
    const Member& zero = job.joined.at(job.spec.pods.front());
    job.master_addr = zero.ip;
    job.master_port = zero.store_port > 0
                          ? zero.store_port
                          : opts.default_store_port_base + static_cast<int>(fnv1a(req.ref.key()) % 1000);
    log::info(kComponent, "world complete",
              {{"job", req.ref.key()},
               {"generation", std::to_string(gen)},
               {"world_size", std::to_string(job.world())},
               {"master", job.master_addr + ":" + std::to_string(job.master_port)}});
    cv.notify_all();
    return ready_reply(job, req.ref.pod);
  }

  // `lock` holds mu, released only while waiting on cv. Waits for generation `gen` to complete: the assignment, or
  // 408 at `deadline`, 202 (still waiting) at `hold_until`, or what changed meanwhile (the job closed, forgotten,
  // superseded, this pod fenced, the world started without this agent, the service stopping).
  Reply wait_for_world(std::unique_lock<std::mutex>& lock, const rdzv::JoinRequest& req, int64_t gen,
                       Clock::time_point deadline, Clock::time_point hold_until, Events& ev) {
    const std::string key = req.ref.key();
    const std::string pod = req.ref.pod;
    const std::string agent_id = req.agent_id;
    while (true) {
      auto it = jobs.find(key);
      if (stopping) return error_reply(503, st::kError, "rendezvous service is shutting down: retry");
      if (it == jobs.end()) return error_reply(404, st::kUnknownJob, "job " + key + " was forgotten: retry");
      Job& j = it->second;
      if (j.closed) return error_reply(410, st::kClosed, "job " + key + " was closed by the operator");
      // The operator may have seen this pod replaced while it waited (set_pod_uids).
      if (holder_of(req.ref) == Holder::kFenced) return fenced_reply(req.ref, "join");
      if (j.spec.generation != gen) {
        Reply r = error_reply(409, st::kSuperseded,
                              "generation " + std::to_string(gen) + " was superseded by generation " +
                                  std::to_string(j.spec.generation) + ": join again");
        r.body["generation"] = j.spec.generation;
        return r;
      }
      if (j.complete) {
        auto mit = j.joined.find(pod);
        if (mit != j.joined.end() && mit->second.agent_id == agent_id) return ready_reply(j, pod);
        return error_reply(409, st::kStarted, "generation started without this agent: wait for a new generation");
      }
      const auto t = Clock::now();
      if (t >= deadline) return join_timeout(j, key, pod, gen, ev);
      if (t >= hold_until) {
        return {202,
                {{"status", st::kWaiting},
                 {"generation", gen},
                 {"missing", j.missing(rdzv::kMaxPodsNamed)},
                 {rdzv::kMissingCountKey, j.missing_count()},
                 {"joined", j.joined.size()},
                 {"expected", j.spec.pods.size()}}};
      }
      cv.wait_until(lock, std::min(deadline, hold_until));
    }
  }

  // Under mu. The pod's wait window closed at its deadline: 408 naming the missing pods; the join timeout event goes
  // out once per generation.
  Reply join_timeout(Job& j, const std::string& key, const std::string& pod, int64_t gen, Events& ev) {
    auto missing = j.missing();
    auto mit = j.joined.find(pod);
    if (mit != j.joined.end()) mit->second.window_open = false;
    const std::string msg = "generation " + std::to_string(gen) + " of job " + key + " did not complete within " +
                            std::to_string(opts.join_timeout.count()) + " ms: missing pods " + join_names(missing);
    log::warn(kComponent, "join timed out", {{"job", key}, {"pod", pod}, {"missing", join_names(missing)}});
    if (!j.timeout_reported) {
      j.timeout_reported = true;
      ev.timeouts.push_back({key, gen, missing, j.joined_names()});
    }
    Reply r = error_reply(408, st::kTimeout, msg);
    if (missing.size() > rdzv::kMaxPodsNamed) missing.resize(rdzv::kMaxPodsNamed);
    r.body["missing"] = missing;
    r.body[rdzv::kMissingCountKey] = j.missing_count();
    r.body["generation"] = gen;
    return r;
  }

  Reply status(const rdzv::StatusRequest& req, const std::string& token) {
    std::unique_lock<std::mutex> lock(mu);
    Job* job = nullptr;
    if (auto r = authorize(req.ref.key(), token, &job)) return *r;
    const Listening listening(*this, req.ref);
    const std::string key = req.ref.key();
    const auto hold_until =
        Clock::now() + std::chrono::milliseconds(std::min<int64_t>(req.wait_ms, opts.max_poll.count()));
    while (true) {
      auto it = jobs.find(key);
      if (it == jobs.end()) return error_reply(404, st::kUnknownJob, "job " + key + " was forgotten: retry");
      const Job& j = it->second;
      const char* s = nullptr;
      if (holder_of(req.ref) == Holder::kFenced) {
        fenced_reply(req.ref, "status");  // logs it
        s = st::kFenced;
      } else if (j.closed) {
        s = st::kClosed;
      } else if (j.spec.generation != req.generation) {
        s = st::kSuperseded;
      } else if (!j.complete) {
        s = st::kWaiting;
      } else if (j.ranks_ok == j.world()) {
        s = st::kDone;
      } else {
        s = st::kRunning;
      }
      if (s != st::kRunning || stopping || Clock::now() >= hold_until) {
        return {200, {{"status", s}, {"generation", j.spec.generation}}};
      }
      cv.wait_until(lock, hold_until);
    }
  }

  Reply exit(const rdzv::ExitReport& req, const std::string& token, Events& ev) {
    std::lock_guard<std::mutex> lock(mu);
    Job* job = nullptr;
    if (auto r = authorize_current(req.ref, req.generation, token, &job)) return *r;
    if (req.local_rank >= job->spec.procs_per_pod) {
      return error_reply(400, st::kError,
                         "field 'local_rank' is " + std::to_string(req.local_rank) + " but the generation runs " +
                             std::to_string(job->spec.procs_per_pod) + " processes per pod");
    }
    if (!job->exits.insert({req.ref.pod, req.local_rank}).second) {
      return {200, {{"status", st::kDuplicate}, {"generation", job->spec.generation}}};
    }
    const int global = job->index.at(req.ref.pod) * job->spec.procs_per_pod + req.local_rank;
    if (req.exit_code == 0 && req.signal == 0 && req.reason == rdzv::kExitExited) ++job->ranks_ok;
    if (req.exit_code == rdzv::kExitPeerLost && req.signal == 0) peer_lost[req.ref.key()] = Clock::now();
    log::info(kComponent, "worker exit",
              {{"job", req.ref.key()},
               {"generation", std::to_string(req.generation)},
               {"pod", req.ref.pod},
               {"rank", std::to_string(global)},
               {"exit_code", std::to_string(req.exit_code)},
               {"signal", std::to_string(req.signal)},
               {"reason", req.reason}});
    // The message is a tenant's text: sanitized here as well, whatever the agent did (never trusted to be UTF-8).
    ev.exits.push_back({req.ref.key(), req.generation, req.ref.pod, req.local_rank, global, req.exit_code, req.signal,
                        req.reason, sanitize_message(req.message, rdzv::kMaxExitMessageBytes, true), req.onset});
    cv.notify_all();
    return {200, {{"status", st::kRecorded}, {"generation", job->spec.generation}}};
  }

  Reply progress_report(const rdzv::ProgressReport& req, const std::string& token) {
    std::lock_guard<std::mutex> lock(mu);
    Job* job = nullptr;
    if (auto r = authorize_current(req.ref, req.generation, token, &job)) return *r;
    if (req.local_rank >= job->spec.procs_per_pod) {
      return error_reply(400, st::kError, "field 'local_rank' is out of range for the generation's processes per pod");
    }
    const int global = job->index.at(req.ref.pod) * job->spec.procs_per_pod + req.local_rank;
    job->progress[global] = req;
    if (job->first_step == 0 && req.step > 0) {
      job->first_step = req.step;
      job->first_step_at = std::chrono::system_clock::now();
    }
    if (req.step > job->last_step) {
      job->last_step = req.step;
      job->last_step_at = std::chrono::system_clock::now();
    }
    return {200, {{"status", st::kRecorded}, {"generation", job->spec.generation}}};
  }

  // Shared request plumbing: token header, JSON body, typed parse, reply, event delivery.
  template <typename Parse, typename Handle>
  void route(const char* path, Parse parse, Handle handle) {
    server->Post(path, [this, parse, handle](const httplib::Request& req, httplib::Response& res) {
      Reply reply;
      Events ev;
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      if (auth.size() <= prefix.size() || auth.compare(0, prefix.size(), prefix) != 0) {
        reply = error_reply(401, st::kError,
                            "missing 'Authorization: Bearer <token>' header: set RAILYARD_RENDEZVOUS_TOKEN from the "
                            "job's Secret <job>-rendezvous");
        res.set_header("WWW-Authenticate", "Bearer");
      } else {
        const std::string token = auth.substr(prefix.size());
        json body = json::parse(req.body, nullptr, false);
        if (body.is_discarded()) {
          reply = error_reply(400, st::kError, "request body is not valid JSON");
        } else {
          try {
            reply = handle(parse(body), token, ev);
          } catch (const rdzv::ProtocolError& e) {
            reply = error_reply(400, st::kError, e.what());
          } catch (const std::exception& e) {
            log::error(kComponent, "request failed", {{"path", req.path}, {"error", e.what()}});
            reply = error_reply(500, st::kError, std::string("internal error: ") + e.what());
          }
        }
      }
      res.status = reply.code;
      res.set_content(reply.raw ? *reply.raw : reply.body.dump(), "application/json");
      deliver(ev);
    });
  }
};

RendezvousService::RendezvousService(std::string host, int port, RendezvousOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.opts = options;
  if (options.serving.cert_pem.empty()) {
    s.server = std::make_unique<httplib::Server>();
  } else {
    tls::X509Ptr cert = tls::read_cert(options.serving.cert_pem, "rendezvous server certificate");
    tls::PkeyPtr key = tls::read_key(options.serving.key_pem, "rendezvous server key");
    auto ssl = std::make_unique<httplib::SSLServer>(cert.get(), key.get());  // takes its own references
    if (!ssl->is_valid())
      throw ConfigError("rendezvous: the server certificate and key do not match or are unusable: " +
                        tls::openssl_error());
    // TLS 1.3 only, like the job's own store and peer copies: every agent is ours and speaks it.
    if (SSL_CTX_set_min_proto_version(ssl->ssl_context(), TLS1_3_VERSION) != 1)
      throw ConfigError("rendezvous: cannot require TLS 1.3: " + tls::openssl_error());
    s.server = std::move(ssl);
  }
  RequestPoolOptions pool;
  pool.core = static_cast<size_t>(std::max(4, options.threads));
  pool.max = std::max(pool.core, static_cast<size_t>(std::max(0, options.max_threads)));
  s.server->new_task_queue = [pool] { return new RequestPool(pool); };
  // cpp-httplib listens with a backlog of 5: a gang of thousands connecting at once would overflow it, and each
  // dropped SYN costs its agent a 1 s retransmit. The socket is remembered here and listen() is called again on it
  // after the bind with a large backlog (Linux takes a second listen() as a new backlog).
  s.server->set_socket_options([&s](int sock) {
    httplib::default_socket_options(sock);
    s.listen_fd = sock;  // the last one offered is the one that bound (an address that failed is closed)
  });
  // Agents open one connection per call; a short keep-alive stops idle connections from pinning workers.
  s.server->set_keep_alive_timeout(1);
  s.server->set_read_timeout(10, 0);
  s.server->set_write_timeout(10, 0);
  s.server->set_payload_max_length(1 << 20);

  s.route(rdzv::kJoinPath, rdzv::parse_join_request,
          [&s](const rdzv::JoinRequest& r, const std::string& t, Impl::Events& ev) { return s.join(r, t, ev); });
  s.route(rdzv::kStatusPath, rdzv::parse_status_request,
          [&s](const rdzv::StatusRequest& r, const std::string& t, Impl::Events&) { return s.status(r, t); });
  s.route(rdzv::kExitPath, rdzv::parse_exit_report,
          [&s](const rdzv::ExitReport& r, const std::string& t, Impl::Events& ev) { return s.exit(r, t, ev); });
  s.route(rdzv::kProgressPath, rdzv::parse_progress_report,
          [&s](const rdzv::ProgressReport& r, const std::string& t, Impl::Events&) { return s.progress_report(r, t); });
  s.server->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    json b = {{"status", st::kError},
              {"error", "no such endpoint " + req.method + " " + req.path +
                            " (endpoints: POST /v1/join, /v1/status, /v1/exit, /v1/progress)"}};
    res.set_content(b.dump(), "application/json");
  });

  if (port == 0) {
    s.port = s.server->bind_to_any_port(host);
    if (s.port <= 0) throw Error("rendezvous: cannot bind " + host + " on any port");
  } else {
    if (!s.server->bind_to_port(host, port)) {
      throw Error("rendezvous: cannot bind " + host + ":" + std::to_string(port) +
                  " (port in use? choose another with --rendezvous-port)");
    }
    s.port = port;
  }
  // The kernel caps the backlog at net.core.somaxconn (4096 by default): asking for more lets hosts that raised it use
  // it. Only on the socket that listens on our port: anything else keeps cpp-httplib's backlog.
  if (is_listener_on(s.listen_fd, s.port)) ::listen(s.listen_fd, 65535);
  s.thread = std::thread([&s] {
    s.server->listen_after_bind();
    s.listen_returned = true;
  });
  // Server::stop() is a no-op until the accept loop runs, so a destructor racing the start would hang in join().
  while (!s.server->is_running() && !s.listen_returned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!s.server->is_running()) {
    s.thread.join();
    throw Error("rendezvous: server on " + host + ":" + std::to_string(s.port) + " stopped at once");
  }
  if (options.silence_after.count() > 0) s.watcher = std::thread([&s] { s.watch(); });
  log::info(
      kComponent, "serving",
      {{"address", host + ":" + std::to_string(s.port)}, {"tls", options.serving.cert_pem.empty() ? "off" : "on"}});
}

RendezvousService::~RendezvousService() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->watch_cv.notify_all();
  if (impl_->watcher.joinable()) impl_->watcher.join();
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int RendezvousService::port() const { return impl_->port; }
bool RendezvousService::tls() const { return !impl_->opts.serving.cert_pem.empty(); }

void RendezvousService::open_generation(const GenerationSpec& spec) {
  validate(spec);
  const int world = static_cast<int>(spec.pods.size()) * spec.procs_per_pod;
  rdzv::Layout layout = layout_of(spec, world);
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->jobs.find(spec.job_key);
  if (it != impl_->jobs.end() && !it->second.closed && it->second.spec.generation >= spec.generation) {
    if (it->second.spec.generation > spec.generation) {
      log::warn(kComponent, "ignoring stale generation",
                {{"job", spec.job_key},
                 {"generation", std::to_string(spec.generation)},
                 {"current", std::to_string(it->second.spec.generation)}});
    }
    return;
  }
  if (spec.pod_uids) impl_->replace_holders(spec.job_key, *spec.pod_uids);
  Job job;
  job.spec = spec;
  job.layout = layout;
  job.restore = spec.config.restore.value_or("");
  for (size_t i = 0; i < spec.pods.size(); ++i) job.index[spec.pods[i]] = static_cast<int>(i);
  impl_->jobs[spec.job_key] = std::move(job);
  log::info(kComponent, "generation open",
            {{"job", spec.job_key},
             {"generation", std::to_string(spec.generation)},
             {"pods", std::to_string(spec.pods.size())},
             {"procs_per_pod", std::to_string(spec.procs_per_pod)}});
  impl_->cv.notify_all();
}

void RendezvousService::set_pod_uids(const std::string& job_key, std::map<std::string, std::string> uids) {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (!impl_->replace_holders(job_key, uids)) return;
  const auto& h = impl_->holders[job_key];
  auto it = impl_->jobs.find(job_key);
  if (it != impl_->jobs.end() && !it->second.complete) {
    // A pod that joined the forming world and was replaced since leaves it: the world waits for its replacement.
    auto& joined = it->second.joined;
    for (auto m = joined.begin(); m != joined.end();) {
      auto holder = h.find(m->first);
      if (!m->second.uid.empty() && (holder == h.end() || holder->second != m->second.uid)) {
        log::info(kComponent, "a joined pod was replaced; it leaves the forming world",
                  {{"job", job_key}, {"pod", m->first}, {"uid", m->second.uid}});
        m = joined.erase(m);
      } else {
        ++m;
      }
    }
  }
  impl_->cv.notify_all();
}

void RendezvousService::close_job(const std::string& job_key) {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->jobs.find(job_key);
  if (it == impl_->jobs.end() || it->second.closed) return;
  it->second.closed = true;
  impl_->holders.erase(job_key);
  impl_->retired.erase(job_key);
  impl_->heard.erase(job_key);
  impl_->peer_lost.erase(job_key);
  it->second.joined.clear();
  it->second.progress.clear();
  log::info(kComponent, "job closed", {{"job", job_key}});
  impl_->cv.notify_all();
}

void RendezvousService::set_exit_handler(std::function<void(const WorkerExit&)> handler) {
  std::lock_guard<std::mutex> l(impl_->handler_mu);
  impl_->on_exit = std::move(handler);
}

void RendezvousService::set_join_timeout_handler(std::function<void(const JoinTimeout&)> handler) {
  std::lock_guard<std::mutex> l(impl_->handler_mu);
  impl_->on_timeout = std::move(handler);
}

std::optional<RendezvousService::Progress> RendezvousService::progress(const std::string& job_key) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  auto it = impl_->jobs.find(job_key);
  if (it == impl_->jobs.end() || it->second.closed) return std::nullopt;
  const Job& j = it->second;
  Progress p;
  p.generation = j.spec.generation;
  p.world_size = j.world();
  p.ranks_done = j.ranks_ok;
  p.all_succeeded = j.ranks_ok == j.world();
  p.world_complete = j.complete;
  p.missing = j.missing();
  if (!j.progress.empty()) {
    const auto& r = j.progress.begin()->second;
    p.step = r.step;
    p.loss = r.loss;
    p.tokens_per_second = r.tokens_per_second;
  }
  for (const auto& [rank, r] : j.progress) {
    p.checkpoint_stall_seconds = std::max(p.checkpoint_stall_seconds, r.checkpoint_stall_seconds.value_or(0));
    p.restore_seconds = std::max(p.restore_seconds, r.restore_seconds.value_or(0));
  }
  p.first_step = j.first_step;
  p.first_step_at = j.first_step_at;
  p.last_step_at = j.last_step_at;
  return p;
}

}  // namespace railyard::op
