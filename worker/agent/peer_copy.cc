#include "worker/agent/peer_copy.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>

#include "checkpoint/peer_held.h"
#include "checkpoint/shm_store.h"
#include "common/log.h"
#include "common/tls/ca_file.h"

namespace railyard::worker::peer {
namespace {

constexpr const char* kComponent = "agent";
constexpr const char* kJobHeader = "X-Railyard-Job";
constexpr const char* kGenerationHeader = "X-Railyard-Generation";
constexpr size_t kChunk = size_t{1} << 20;  // bytes handed to the socket per provider call

using Clock = std::chrono::steady_clock;

bool same_secret(const std::string& a, const std::string& b) {
  // Constant time in the content; the length of a token is not secret.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

httplib::Headers headers_for(const Auth& auth) {
  return {{"Authorization", "Bearer " + auth.token}, {kJobHeader, auth.job_key}};
}

std::pair<std::string, int> split_addr(const std::string& addr) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0) throw PeerError("peer address '" + addr + "' is not ip:port");
  const int port = std::atoi(addr.c_str() + colon + 1);
  if (port <= 0 || port > 65535) throw PeerError("peer address '" + addr + "' has no valid port");
  return {addr.substr(0, colon), port};
}

// Over TLS when the job has an identity: this pod's leaf as the client certificate, the job's CA as the only trust
// anchor (a CaFile: httplib mixes a CA store handed to it with the system roots), the peer's IP in its leaf's SANs.
struct PeerClient {
  std::unique_ptr<tls::CaFile> ca;  // httplib reads it at the first connection: it lives as long as the client
  std::unique_ptr<httplib::ClientImpl> http;
  httplib::ClientImpl* operator->() const { return http.get(); }
};

PeerClient client_for(const std::string& addr, const Auth& auth) {
  auto [host, port] = split_addr(addr);
  PeerClient c;
  if (auth.tls) {
    tls::X509Ptr cert = tls::read_cert(auth.tls->leaf.cert_pem, "the pod's peer-copy certificate");
    tls::PkeyPtr key = tls::read_key(auth.tls->leaf.key_pem, "the pod's peer-copy key");
    auto ssl = std::make_unique<httplib::SSLClient>(host, port, cert.get(), key.get());  // holds its own references
    SSL_CTX_set_min_proto_version(ssl->ssl_context(), TLS1_3_VERSION);  // as the store; httplib sets no floor
    c.ca = std::make_unique<tls::CaFile>(auth.tls->ca_pem, tls::kJobCaCertEnv);
    ssl->set_ca_cert_path(c.ca->path().c_str());
    ssl->enable_server_certificate_verification(true);
    c.http = std::move(ssl);
  } else {
    c.http = std::make_unique<httplib::ClientImpl>(host, port);
  }
  c->set_connection_timeout(std::chrono::seconds(2));
  c->set_read_timeout(std::chrono::seconds(30));
  c->set_write_timeout(std::chrono::seconds(30));
  return c;
}

std::string describe(const httplib::Result& r, const std::string& addr) {
  if (!r) return "peer " + addr + " unreachable (" + httplib::to_string(r.error()) + ")";
  return "peer " + addr + " answered " + std::to_string(r->status) + ": " + r->body.substr(0, 300);
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

std::string copy_name(const std::string& prefix, int rank, int slot) {
  return prefix + "-peer-r" + std::to_string(rank) + (slot == 0 ? "-a" : "-b");
}

struct PeerServer::Impl {
  Auth auth;
  std::string prefix;
  std::unique_ptr<httplib::Server> server;
  int port = 0;
  std::thread thread;
  std::mutex mu;                         // guards rank_locks
  std::map<int, std::mutex> rank_locks;  // one PUT per remote rank at a time

  std::mutex& lock_of(int rank) {
    std::lock_guard<std::mutex> l(mu);
    return rank_locks[rank];
  }

  // Refuses a request without this job's token (401) or for another job (403). Says nothing about the token.
  bool authorized(const httplib::Request& req, httplib::Response& res) {
    const std::string auth_header = req.get_header_value("Authorization");
    const std::string prefix_bearer = "Bearer ";
    const bool token_ok =
        auth_header.rfind(prefix_bearer, 0) == 0 && same_secret(auth_header.substr(prefix_bearer.size()), auth.token);
    if (!token_ok) {
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("peer copy: missing or wrong token for job " + auth.job_key + "\n", "text/plain");
      log::warn(kComponent, "peer copy: refused a request with a missing or wrong token",
                {{"remote", req.remote_addr}, {"path", req.path}});
      return false;
    }
    if (req.get_header_value(kJobHeader) != auth.job_key) {
      res.status = 403;
      res.set_content("peer copy: this agent keeps copies of job " + auth.job_key + " only\n", "text/plain");
      return false;
    }
    return true;
  }

  // Refuses (409) a copy from a generation older than this agent's: its sender was superseded (fenced by the
  // rendezvous, or about to be) and its slot may be older than the copy it would replace. A copy without the header
  // comes from no generation at all and is refused too once this agent is in one.
  bool current(const httplib::Request& req, httplib::Response& res) {
    const int64_t mine = auth.generation ? auth.generation->load() : 0;
    if (mine <= 0) return true;
    const std::string g = req.get_header_value(kGenerationHeader);
    char* end = nullptr;
    const long long theirs = g.empty() ? -1 : std::strtoll(g.c_str(), &end, 10);
    if (!g.empty() && end && *end == '\0' && theirs >= mine) return true;
    res.status = 409;
    res.set_content("peer copy from generation " + (g.empty() ? std::string("(none)") : g.substr(0, 20)) +
                        " refused: this pod is in generation " + std::to_string(mine) +
                        "; the sender was superseded and must stop\n",
                    "text/plain");
    log::warn(
        kComponent, "peer copy: refused a copy from a superseded generation",
        {{"remote", req.remote_addr}, {"their_generation", g.substr(0, 20)}, {"generation", std::to_string(mine)}});
    return false;
  }

  static std::vector<int64_t> steps_of(const std::string& prefix, int rank) {
    std::vector<int64_t> steps;
    for (int s = 0; s < 2; ++s) {
      auto st = ckpt::ShmStore(copy_name(prefix, rank, s)).peek();
      steps.push_back(st ? *st : -1);
    }
    return steps;
  }

  // HTTPS when the job has an identity: this pod's leaf, and only clients whose certificate the job's CA signed
  // (refused in the handshake, before a header is read).
  static std::unique_ptr<httplib::Server> make_server(const Auth& auth) {
    if (!auth.tls) return std::make_unique<httplib::Server>();
    tls::X509Ptr cert = tls::read_cert(auth.tls->leaf.cert_pem, "the pod's peer-copy certificate");
    tls::PkeyPtr key = tls::read_key(auth.tls->leaf.key_pem, "the pod's peer-copy key");
    auto s = std::make_unique<httplib::SSLServer>(cert.get(), key.get(),
                                                  tls::new_store(auth.tls->ca_pem, tls::kJobCaCertEnv));
    if (!s->is_valid()) throw Error("peer copy: cannot set up TLS with the pod's certificate: " + tls::openssl_error());
    SSL_CTX_set_min_proto_version(s->ssl_context(), TLS1_3_VERSION);  // each connection's SSL is made from it later
    return s;
  }

  Impl(const std::string& ip, int want_port, Auth a, std::string p)
      : auth(std::move(a)), prefix(std::move(p)), server(make_server(auth)) {
    server->new_task_queue = [] { return new httplib::ThreadPool(4); };
    server->Put(R"(/v1/peer/(\d+))",
                [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                  if (!authorized(req, res) || !current(req, res)) return;
                  receive(std::stoi(req.matches[1].str()), req, res, reader);
                });
    server->Get(R"(/v1/peer/(\d+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      res.set_content(nlohmann::json{{"steps", steps_of(prefix, std::stoi(req.matches[1].str()))}}.dump(),
                      "application/json");
    });
    server->Get(R"(/v1/peer/(\d+)/([ab]))", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      serve(std::stoi(req.matches[1].str()), req.matches[2].str() == "a" ? 0 : 1, res);
    });
    port = want_port == 0 ? server->bind_to_any_port(ip) : (server->bind_to_port(ip, want_port) ? want_port : -1);
    if (port <= 0) {
      throw Error("peer copy: cannot listen on " + ip + ":" + std::to_string(want_port) +
                  " (RAILYARD_AGENT_PEER_PORT; 0 picks a free port)");
    }
    thread = std::thread([this] { server->listen_after_bind(); });
  }

  void receive(int rank, const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    const std::string length = req.get_header_value("Content-Length");
    const uint64_t size = length.empty() ? 0 : std::strtoull(length.c_str(), nullptr, 10);
    std::lock_guard<std::mutex> l(lock_of(rank));
    // Overwrite the older copy: the newer one stays complete whatever happens to this transfer. A step it already
    // holds (a sender that re-sends after an error) replaces that copy, so the two copies stay two different steps.
    const auto steps = steps_of(prefix, rank);
    const std::string announced = req.get_header_value("X-Railyard-Step");
    const int64_t incoming = announced.empty() ? -2 : std::strtoll(announced.c_str(), nullptr, 10);
    int slot = (steps[0] >= 0 && steps[0] > steps[1]) ? 1 : 0;
    if (incoming >= 0 && steps[0] == incoming) slot = 0;
    if (incoming >= 0 && steps[1] == incoming) slot = 1;
    ckpt::ShmStore store(copy_name(prefix, rank, slot));
    std::string why;
    std::optional<int64_t> step;
    bool whole = false;
    try {
      store.begin_image(size);
      whole = reader([&](const char* data, size_t n) {
        store.write_image(data, n);
        return true;
      });
      if (!whole) why = "connection ended before the whole copy arrived";
      step = store.commit_image(&why);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!step) {
      res.status = 422;
      res.set_content("peer copy of rank " + std::to_string(rank) + " rejected: " + why + "\n", "text/plain");
      // A transfer cut short is routine (a lagging sender gives up on a slot the worker overwrites; a lost node);
      // a complete transfer that fails its checks is not.
      log::write(whole ? log::Level::Warn : log::Level::Debug, kComponent,
                 "peer copy: rejected a copy (the slot stays torn; the other copy is kept)",
                 {{"rank", std::to_string(rank)}, {"why", why}});
      return;
    }
    res.set_content(nlohmann::json{{"step", *step}, {"slot", slot == 0 ? "a" : "b"}}.dump(), "application/json");
  }

  void serve(int rank, int slot, httplib::Response& res) {
    std::string why;
    std::shared_ptr<ckpt::ShmStore::Image> img = ckpt::ShmStore(copy_name(prefix, rank, slot)).map_image(&why);
    if (!img) {
      res.status = 404;
      res.set_content(why + "\n", "text/plain");
      return;
    }
    res.set_header("X-Railyard-Step", std::to_string(img->step()));
    res.set_content_provider(img->size(), "application/octet-stream",
                             [img](size_t offset, size_t length, httplib::DataSink& sink) {
                               const size_t n = std::min(length, kChunk);
                               if (!sink.write(reinterpret_cast<const char*>(img->data()) + offset, n)) return false;
                               // A copy that a PUT overwrote while it was read ends the connection early: the fetcher
                               // sees it torn.
                               return offset + n < img->size() || img->unchanged();
                             });
  }
};

PeerServer::PeerServer(const std::string& ip, int port, Auth auth, std::string prefix)
    : impl_(std::make_unique<Impl>(ip, port, std::move(auth), std::move(prefix))) {}

PeerServer::~PeerServer() {
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int PeerServer::port() const { return impl_->port; }

CopyResult send_slot(const std::string& addr, const Auth& auth, int rank, const std::string& slot_name) {
  const auto t0 = Clock::now();
  std::string why;
  std::shared_ptr<ckpt::ShmStore::Image> img = ckpt::ShmStore(slot_name).map_image(&why);
  // A slot that was complete when peeked but is torn now: the worker started its next put into it (lag, not an error
  // of the peer).
  if (!img) throw LaggedError("nothing to send: " + why);
  auto cli = client_for(addr, auth);
  bool overwritten = false;
  httplib::Headers headers = headers_for(auth);
  headers.emplace("X-Railyard-Step", std::to_string(img->step()));  // a hint for the slot choice; the header decides
  if (auth.generation) headers.emplace(kGenerationHeader, std::to_string(auth.generation->load()));
  auto r = cli->Put(
      "/v1/peer/" + std::to_string(rank), headers, img->size(),
      [&](size_t offset, size_t length, httplib::DataSink& sink) {
        // The worker started its next-but-one put into this slot while we send it: abort at once (the peer sees a
        // torn copy and keeps its other one); checked before every chunk and after the last.
        if (!img->unchanged()) {
          overwritten = true;
          return false;
        }
        const size_t n = std::min(length, kChunk);
        if (!sink.write(reinterpret_cast<const char*>(img->data()) + offset, n)) return false;
        if (offset + n == img->size() && !img->unchanged()) {
          overwritten = true;
          return false;
        }
        return true;
      },
      "application/octet-stream");
  if (overwritten) throw LaggedError("slot " + slot_name + " was overwritten while it was sent (the copy lags)");
  if (!r || r->status != 200) throw PeerError("copy of rank " + std::to_string(rank) + ": " + describe(r, addr));
  return {rank, img->step(), img->size(), since(t0)};
}

std::vector<int64_t> held_steps(const std::string& addr, const Auth& auth, int rank) {
  auto cli = client_for(addr, auth);
  auto r = cli->Get("/v1/peer/" + std::to_string(rank), headers_for(auth));
  if (!r || r->status != 200)
    throw PeerError("listing copies of rank " + std::to_string(rank) + ": " + describe(r, addr));
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("steps") || !j["steps"].is_array() || j["steps"].size() != 2) {
    throw PeerError("peer " + addr + " answered a listing without two steps: " + r->body.substr(0, 200));
  }
  return j["steps"].get<std::vector<int64_t>>();
}

std::vector<int64_t> fetch(const std::string& addr, const Auth& auth, int rank, const std::string& base,
                           std::string* why) {
  std::vector<int64_t> fetched;
  std::vector<int64_t> steps;
  try {
    steps = held_steps(addr, auth, rank);
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return fetched;
  }
  std::string reasons;
  for (int s = 0; s < 2; ++s) {
    if (steps[s] < 0) {
      if (!reasons.empty()) reasons += "; ";
      reasons += std::string("slot ") + (s == 0 ? "a" : "b") + " empty or torn";
      continue;
    }
    ckpt::ShmStore dest(base + (s == 0 ? "-a" : "-b"));
    std::string err;
    bool begun = false;
    auto cli = client_for(addr, auth);
    auto r = cli->Get(
        "/v1/peer/" + std::to_string(rank) + "/" + (s == 0 ? "a" : "b"), headers_for(auth),
        [&](const httplib::Response& res) {
          if (res.status != 200) return true;  // the body is the reason: read it into r->body
          const uint64_t size = std::strtoull(res.get_header_value("Content-Length").c_str(), nullptr, 10);
          try {
            dest.begin_image(size);
            begun = true;
          } catch (const std::exception& e) {
            err = e.what();
            return false;
          }
          return true;
        },
        [&](const char* data, size_t n) {
          if (!begun) return true;
          try {
            dest.write_image(data, n);
          } catch (const std::exception& e) {
            err = e.what();
            return false;
          }
          return true;
        });
    std::optional<int64_t> step;
    if (begun) step = dest.commit_image(&err);
    if (step) {
      fetched.push_back(*step);
    } else {
      if (err.empty()) err = describe(r, addr);
      if (!reasons.empty()) reasons += "; ";
      reasons += std::string("slot ") + (s == 0 ? "a" : "b") + ": " + err;
      ckpt::ShmStore::remove(dest.name());  // a torn local slot would only be skipped; leave none behind
    }
  }
  if (why) *why = reasons;
  return fetched;
}

PeerSender::PeerSender(Auth auth, std::chrono::milliseconds poll, OnCopy on_copy)
    : auth_(std::move(auth)), poll_(poll), on_copy_(std::move(on_copy)), thread_([this] { loop(); }) {}

PeerSender::~PeerSender() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PeerSender::record_held(int rank, const std::string& base, const std::vector<int64_t>& steps) {
  try {
    ckpt::write_peer_held(ckpt::peer_held_name(base), steps);
  } catch (const std::exception& e) {
    // The worker then finds no record and keeps waiting for its newest snapshot to be held (a bounded wait): the
    // copies themselves go on.
    log::warn(kComponent, "cannot record what the peer holds", {{"rank", std::to_string(rank)}, {"error", e.what()}});
  }
}

void PeerSender::set(std::map<int, std::string> ranks, std::string target) {
  // Before this generation's workers start: what an earlier target held says nothing about the new one, so each
  // rank's record starts empty (its workers keep their newest snapshot until the new target holds it).
  if (!target.empty()) {
    for (const auto& [rank, base] : ranks) record_held(rank, base, {});
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    ranks_ = std::move(ranks);
    target_ = std::move(target);
    ++config_version_;
  }
  cv_.notify_all();
}

void PeerSender::loop() {
  std::map<int, std::string> ranks;
  std::string target;
  uint64_t version = 0;
  std::map<int, std::set<int64_t>> held;  // steps the target holds, per rank (as far as this sender knows)
  std::map<int, std::vector<int64_t>> written;  // what the ranks' held records say (ckpt::write_peer_held)
  // Each local slot's step and count of puts when last looked at (kept across generations: the slots stay).
  std::map<std::string, std::pair<int64_t, uint64_t>> seen;
  std::string last_error;
  Clock::time_point retry_at{};
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, poll_, [&] { return stop_ || config_version_ != version; });
      if (stop_) return;
      if (config_version_ != version) {
        version = config_version_;
        ranks = ranks_;
        target = target_;
        held.clear();
        written.clear();  // set() emptied the records
        last_error.clear();
        retry_at = {};
      }
    }
    if (target.empty() || ranks.empty() || Clock::now() < retry_at) continue;
    try {
      for (const auto& [rank, base] : ranks) {
        if (!held.count(rank)) {
          // A new target (a new generation) may already hold some steps (the same peer as before): skip those.
          auto& h = held[rank];
          for (int64_t s : held_steps(target, auth_, rank))
            if (s >= 0) h.insert(s);
        }
        // Complete local slots, newest first: when the copies lag, the newest matters; the receiver overwrites its
        // older copy, so newest-then-older still leaves it both.
        std::vector<std::pair<int64_t, std::string>> slots;
        std::vector<int64_t> rewritten;
        for (const char* suffix : {"-a", "-b"}) {
          uint64_t writes = 0;
          const std::string name = base + suffix;
          if (auto st = ckpt::ShmStore(name).peek(nullptr, &writes)) {
            slots.emplace_back(*st, name);
            // A slot put since it was last seen holds a snapshot the target has not received, even under a step
            // number it holds: after a restore to an older step, the new generation computes that step again, and
            // the target's copy is of the abandoned run. Send it again, and do not count it as held meanwhile.
            auto it = seen.find(name);
            if (it != seen.end() && it->second != std::make_pair(*st, writes)) rewritten.push_back(*st);
            seen[name] = {*st, writes};
          }
        }
        std::sort(slots.rbegin(), slots.rend());
        auto& h = held[rank];
        for (int64_t s : rewritten) h.erase(s);
        bool relist = false;
        for (const auto& [step, name] : slots) {
          if (h.count(step)) continue;
          try {
            CopyResult res = send_slot(target, auth_, rank, name);
            h.insert(res.step);
            on_copy_(res, "");
          } catch (const LaggedError& e) {
            // Not the target's fault: the worker moved on. The receiver rejected the mixed copy (its older slot is
            // torn now), so the next round sends the newest slot at once.
            on_copy_(CopyResult{rank}, e.what());
            relist = true;
            break;
          }
        }
        // Forget steps no longer held locally: the target overwrote them too (it keeps the two newest).
        std::set<int64_t> keep;
        for (const auto& s : slots)
          if (h.count(s.first)) keep.insert(s.first);
        h = std::move(keep);
        if (std::vector<int64_t> now(h.begin(), h.end()); now != written[rank]) {
          record_held(rank, base, now);
          written[rank] = std::move(now);
        }
        if (relist) held.erase(rank);
      }
      last_error.clear();
    } catch (const std::exception& e) {
      held.clear();  // re-list after an error: the target may have lost or torn a slot
      retry_at = Clock::now() + std::chrono::milliseconds(500);
      CopyResult none;
      on_copy_(none, e.what());
      if (e.what() != last_error) {
        last_error = e.what();
        log::warn(kComponent, "peer copy failed; retrying", {{"target", target}, {"error", last_error}});
      }
    }
  }
}

}  // namespace railyard::worker::peer
