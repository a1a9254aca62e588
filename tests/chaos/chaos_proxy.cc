// railyard-chaos-proxy: a fault-injecting proxy on 127.0.0.1 between a Kubernetes client (the operator) and the API
// server, for the hostile-network tests (docs/hardening.md has the fault model).
//
// TCP faults (always available): latency per forwarded chunk, refused connections (RST on accept), connections
// reset mid-flow, stalls (nothing forwarded for a while, then RST), watch streams cut mid-line.
// HTTP faults (only when the proxy terminates TLS with --tls-cert/--tls-key/--upstream-ca): 429 (with Retry-After),
// 500 and 503 answers instead of forwarding a request. The API server is TLS only, so HTTP-level faults need the
// proxy to be a TLS endpoint the client trusts: the local cluster's own serving certificate (SAN 127.0.0.1, signed
// by the cluster CA the kubeconfig already trusts) is what the e2e test hands it. Authentication passes through
// untouched (bearer tokens in the request), and the upstream connection verifies the API server against the CA.
//
// Control: SIGUSR1 heals the network (no new faults, pending ones cancelled), SIGUSR2 turns faults back on,
// SIGTERM/SIGINT stop. Counters of every injected fault go to --stats-file (JSON, rewritten every 0.5 s and at exit).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/log.h"

namespace railyard::chaos {
namespace {

constexpr const char* kComponent = "chaos-proxy";
using Clock = std::chrono::steady_clock;

struct Options {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;
  std::string upstream_host;
  int upstream_port = 0;
  std::string tls_cert, tls_key, upstream_ca;
  std::string port_file, stats_file;
  uint64_t seed = 1;
  int latency_ms = 0;   // each forwarded chunk waits uniform [0, latency_ms]
  double p_refuse = 0;  // per connection: RST right after accept
  double p_reset = 0;   // per connection: RST both sides after uniform [0.2, reset_max_s]
  double reset_max_s = 5;
  double p_stall = 0;           // per connection: forward nothing for [1, 3] s, then RST
  double p_truncate_watch = 0;  // per watch request: cut the stream mid-line after uniform [0.5, 6] s
  double p_http_error = 0;      // per request (TLS mode): answer 429/500/503 instead of forwarding
  bool start_healed = false;
};

struct Stats {
  std::atomic<uint64_t> connections{0}, requests{0}, watches{0}, refused{0}, resets{0}, stalls{0}, truncated_watches{0},
      http_429{0}, http_500{0}, http_503{0}, delayed_chunks{0}, upstream_failures{0};
  nlohmann::json to_json() const {
    return {{"connections", connections.load()},
            {"requests", requests.load()},
            {"watches", watches.load()},
            {"refused", refused.load()},
            {"resets", resets.load()},
            {"stalls", stalls.load()},
            {"truncated_watches", truncated_watches.load()},
            {"http_429", http_429.load()},
            {"http_500", http_500.load()},
            {"http_503", http_503.load()},
            {"delayed_chunks", delayed_chunks.load()},
            {"upstream_failures", upstream_failures.load()}};
  }
};

Options g_opt;
Stats g_stats;
std::atomic<bool> g_faults{true};
std::atomic<bool> g_stop{false};
SSL_CTX* g_server_ctx = nullptr;
SSL_CTX* g_client_ctx = nullptr;

void on_signal(int sig) {
  if (sig == SIGUSR1) g_faults = false;
  if (sig == SIGUSR2) g_faults = true;
  if (sig == SIGTERM || sig == SIGINT) g_stop = true;
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "railyard-chaos-proxy: " << msg << " (see --help)\n";
  std::exit(2);
}

std::pair<std::string, int> split_host_port(const std::string& flag, const std::string& v) {
  auto colon = v.rfind(':');
  if (colon == std::string::npos) usage_error(flag + " '" + v + "': use HOST:PORT");
  int port = -1;
  try {
    port = std::stoi(v.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (port < 0 || port > 65535) usage_error(flag + " '" + v + "': the port must be 0..65535");
  return {v.substr(0, colon), port};
}

double probability(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double p = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || p < 0 || p > 1) usage_error(flag + " '" + v + "': use a number in [0, 1]");
  return p;
}

// One side of a relayed connection: a socket, optionally wrapped in TLS.
struct Side {
  int fd = -1;
  SSL* ssl = nullptr;

  bool pending() const { return ssl != nullptr && SSL_pending(ssl) > 0; }
  // >0 bytes read, 0 closed, -1 nothing to deliver yet (TLS record without application data).
  ssize_t read(char* buf, size_t n) {
    if (ssl == nullptr) {
      ssize_t r = ::recv(fd, buf, n, 0);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
      return r < 0 ? 0 : r;
    }
    int r = SSL_read(ssl, buf, static_cast<int>(n));
    if (r > 0) return r;
    int err = SSL_get_error(ssl, r);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return -1;
    if (err == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EINTR)) return -1;
    return 0;
  }
  bool write_all(const char* buf, size_t n) {
    while (n > 0) {
      ssize_t w;
      if (ssl == nullptr) {
        w = ::send(fd, buf, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
      } else {
        w = SSL_write(ssl, buf, static_cast<int>(n));
      }
      if (w <= 0) return false;
      buf += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }
  // abortive=true sends RST (SO_LINGER 0); otherwise a plain FIN without TLS close_notify (a cut stream).
  void close(bool abortive) {
    if (fd < 0) return;
    if (abortive) {
      linger l{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    if (ssl != nullptr) SSL_free(ssl);
    ssl = nullptr;
    ::close(fd);
    fd = -1;
  }
};

int connect_upstream() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(g_opt.upstream_port));
  if (inet_pton(AF_INET, g_opt.upstream_host.c_str(), &addr.sin_addr) != 1 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void set_timeouts(int fd, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

std::string status_body(int code) {
  const char* reason = code == 429 ? "TooManyRequests" : code == 500 ? "InternalError" : "ServiceUnavailable";
  return nlohmann::json{{"kind", "Status"},
                        {"apiVersion", "v1"},
                        {"metadata", nlohmann::json::object()},
                        {"status", "Failure"},
                        {"message", "chaos proxy: injected " + std::to_string(code)},
                        {"reason", reason},
                        {"code", code}}
      .dump();
}

std::string http_error_response(int code) {
  const char* text = code == 429 ? "Too Many Requests" : code == 500 ? "Internal Server Error" : "Service Unavailable";
  std::string body = status_body(code);
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + text +
                  "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  if (code == 429) r += "Retry-After: 1\r\n";
  return r + "\r\n" + body;
}

std::optional<size_t> header_size_t(const std::string& head, const char* name) {
  std::string lower = head;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string key = std::string("\r\n") + name + ":";
  auto at = lower.find(key);
  if (at == std::string::npos) return std::nullopt;
  return std::strtoull(lower.c_str() + at + key.size(), nullptr, 10);
}

class Connection {
 public:
  Connection(int client_fd, uint64_t id) : id_(id), rng_(g_opt.seed * 1000003 + id) { client_.fd = client_fd; }

  void run() {
    g_stats.connections++;
    const bool faulty = g_faults;
    if (faulty && chance(g_opt.p_refuse)) {
      g_stats.refused++;
      note("refused");
      client_.close(true);
      return;
    }
    upstream_.fd = connect_upstream();
    if (upstream_.fd < 0) {
      g_stats.upstream_failures++;
      client_.close(true);
      return;
    }
    set_timeouts(client_.fd, 10);
    set_timeouts(upstream_.fd, 10);
    if (g_server_ctx != nullptr && !handshake()) {
      close_both(true);
      return;
    }
    if (faulty && chance(g_opt.p_reset)) reset_at_ = Clock::now() + seconds(uniform(0.2, g_opt.reset_max_s));
    if (faulty && chance(g_opt.p_stall)) stall_until_ = Clock::now() + seconds(uniform(1, 3));
    relay();
  }

 private:
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  void note(const std::string& what, const std::string& detail = "") {
    log::info(kComponent, what, {{"conn", std::to_string(id_)}, {"detail", detail}});
  }

  bool handshake() {
    client_.ssl = SSL_new(g_server_ctx);
    SSL_set_fd(client_.ssl, client_.fd);
    if (SSL_accept(client_.ssl) != 1) return false;
    upstream_.ssl = SSL_new(g_client_ctx);
    SSL_set_fd(upstream_.ssl, upstream_.fd);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(upstream_.ssl), g_opt.upstream_host.c_str());
    if (SSL_connect(upstream_.ssl) != 1) {
      g_stats.upstream_failures++;
      log::warn(kComponent, "TLS to the API server failed", {{"error", ERR_error_string(ERR_get_error(), nullptr)}});
      return false;
    }
    return true;
  }

  void close_both(bool abortive) {
    client_.close(abortive);
    upstream_.close(abortive);
  }

  bool forward(Side& to, const char* data, size_t n) {
    if (g_faults && g_opt.latency_ms > 0) {
      g_stats.delayed_chunks++;
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::uniform_int_distribution<int>(0, g_opt.latency_ms)(rng_)));
    }
    return to.write_all(data, n);
  }

  // Client -> server bytes in TLS mode: request heads are parsed so single requests can be answered with an error
  // or marked as watches. HTTP/1.1 clients do not pipeline, so when a request arrives the previous response is
  // complete and an injected answer cannot interleave with the server's bytes.
  bool from_client(const char* data, size_t n) {
    if (g_server_ctx == nullptr || opaque_) return forward(upstream_, data, n);
    size_t at = 0;
    while (at < n) {
      if (body_left_ > 0) {
        size_t take = std::min(body_left_, n - at);
        if (!discard_body_ && !forward(upstream_, data + at, take)) return false;
        body_left_ -= take;
        at += take;
        continue;
      }
      head_.append(data + at, n - at);
      at = n;
      auto end = head_.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (head_.size() > (1 << 20)) return false;  // not HTTP/1.1 as we know it
        return true;
      }
      std::string rest = head_.substr(end + 4);
      std::string head = head_.substr(0, end + 2);
      head_.clear();
      if (!on_request(head)) return false;
      if (!rest.empty()) return from_client(rest.data(), rest.size());
    }
    return true;
  }

  bool on_request(const std::string& head) {
    g_stats.requests++;
    const std::string line = head.substr(0, head.find("\r\n"));
    auto te = head.find("ransfer-Encoding: chunked");
    if (te != std::string::npos) opaque_ = true;  // our clients never send chunked bodies; just relay the rest
    body_left_ = header_size_t(head, "content-length").value_or(0);
    discard_body_ = false;
    const bool watch = line.find("watch=true") != std::string::npos || line.find("watch=1") != std::string::npos;
    if (watch) g_stats.watches++;
    if (g_faults && chance(g_opt.p_http_error)) {
      static constexpr int kCodes[] = {429, 500, 503};
      int code = kCodes[std::uniform_int_distribution<int>(0, 2)(rng_)];
      (code == 429 ? g_stats.http_429 : code == 500 ? g_stats.http_500 : g_stats.http_503)++;
      note("http " + std::to_string(code), line);
      discard_body_ = true;
      std::string response = http_error_response(code);
      return client_.write_all(response.data(), response.size());
    }
    if (watch && g_faults && chance(g_opt.p_truncate_watch)) truncate_at_ = Clock::now() + seconds(uniform(0.5, 6));
    if (!forward(upstream_, head.data(), head.size())) return false;
    return forward(upstream_, "\r\n", 2);
  }

  void relay() {
    char buf[16384];
    while (!g_stop) {
      if (!g_faults) reset_at_ = truncate_at_ = stall_until_ = Clock::time_point::max();
      const auto now = Clock::now();
      if (now >= reset_at_) {
        g_stats.resets++;
        note("reset");
        close_both(true);
        return;
      }
      if (stall_until_ != Clock::time_point::max()) {
        if (now < stall_until_) {
          std::this_thread::sleep_for(std::min<Clock::duration>(stall_until_ - now, std::chrono::milliseconds(100)));
          continue;
        }
        g_stats.stalls++;
        note("stalled, then reset");
        close_both(true);
        return;
      }
      const bool cut = now >= truncate_at_;
      pollfd fds[2] = {{client_.fd, POLLIN, 0}, {upstream_.fd, POLLIN, 0}};
      int ready = client_.pending() || upstream_.pending() ? 2 : poll(fds, 2, cut ? 1000 : 100);
      if (ready < 0 && errno != EINTR) break;
      if (client_.pending() || (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t r = client_.read(buf, sizeof buf);
        if (r == 0 || (r > 0 && !from_client(buf, static_cast<size_t>(r)))) break;
      }
      if (upstream_.fd >= 0 && (upstream_.pending() || (fds[1].revents & (POLLIN | POLLHUP | POLLERR)))) {
        ssize_t r = upstream_.read(buf, sizeof buf);
        if (r == 0) break;
        if (r > 0) {
          // A cut watch stream ends in the middle of an event: half of this chunk, then FIN without close_notify.
          size_t n = cut ? std::max<size_t>(1, static_cast<size_t>(r) / 2) : static_cast<size_t>(r);
          if (!forward(client_, buf, n)) break;
          if (cut) break;
        }
      }
      if (cut && ready == 0) break;  // nothing arrived within a second of the cut: end the stream anyway
    }
    if (Clock::now() >= truncate_at_ && !g_stop) {
      g_stats.truncated_watches++;
      note("watch stream cut");
    }
    close_both(false);
  }

  uint64_t id_;
  std::mt19937_64 rng_;
  Side client_, upstream_;
  Clock::time_point reset_at_ = Clock::time_point::max(), truncate_at_ = Clock::time_point::max(),
                    stall_until_ = Clock::time_point::max();
  std::string head_;
  size_t body_left_ = 0;
  bool discard_body_ = false, opaque_ = false;
};

void write_stats() {
  if (g_opt.stats_file.empty()) return;
  nlohmann::json j = g_stats.to_json();
  j["faults"] = g_faults.load();
  try {
    write_file_atomic(g_opt.stats_file, j.dump() + "\n");
  } catch (const std::exception& e) {
    log::warn(kComponent, "cannot write stats", {{"error", e.what()}});
  }
}

void setup_tls() {
  const bool any = !g_opt.tls_cert.empty() || !g_opt.tls_key.empty() || !g_opt.upstream_ca.empty();
  if (!any) return;
  if (g_opt.tls_cert.empty() || g_opt.tls_key.empty() || g_opt.upstream_ca.empty()) {
    usage_error("TLS mode needs all of --tls-cert, --tls-key and --upstream-ca");
  }
  g_server_ctx = SSL_CTX_new(TLS_server_method());
  if (SSL_CTX_use_certificate_chain_file(g_server_ctx, g_opt.tls_cert.c_str()) != 1) {
    usage_error("--tls-cert " + g_opt.tls_cert + ": not a readable PEM certificate");
  }
  if (SSL_CTX_use_PrivateKey_file(g_server_ctx, g_opt.tls_key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(g_server_ctx) != 1) {
    usage_error("--tls-key " + g_opt.tls_key + ": not the PEM private key of --tls-cert");
  }
  g_client_ctx = SSL_CTX_new(TLS_client_method());
  if (SSL_CTX_load_verify_locations(g_client_ctx, g_opt.upstream_ca.c_str(), nullptr) != 1) {
    usage_error("--upstream-ca " + g_opt.upstream_ca + ": not a readable PEM CA bundle");
  }
  SSL_CTX_set_verify(g_client_ctx, SSL_VERIFY_PEER, nullptr);
  // Post-handshake records (TLS 1.3 session tickets) must not block a read the poll loop started: return to poll.
  SSL_CTX_clear_mode(g_server_ctx, SSL_MODE_AUTO_RETRY);
  SSL_CTX_clear_mode(g_client_ctx, SSL_MODE_AUTO_RETRY);
}

const char* kUsage = R"(usage: railyard-chaos-proxy --upstream HOST:PORT [options]
A fault-injecting proxy for tests (docs/hardening.md). Listens on 127.0.0.1 only.
  --listen 127.0.0.1:PORT       listen address (default 127.0.0.1:0, a free port)
  --port-file PATH              write the port listened on here once ready
  --stats-file PATH             JSON counters of injected faults, rewritten every 0.5 s
  --tls-cert PEM --tls-key PEM --upstream-ca PEM
                                terminate TLS (enables --http-error); verify the upstream against the CA
  --seed N                      random seed (default 1)
  --latency-ms N                delay each forwarded chunk by uniform [0, N] ms
  --refuse P                    probability a new connection is reset at once
  --reset P                     probability a connection is reset after uniform [0.2, --reset-max] s
  --reset-max S                 (default 5)
  --stall P                     probability a connection forwards nothing for 1-3 s, then is reset
  --truncate-watch P            probability a watch stream is cut mid-event after 0.5-6 s
  --http-error P                probability a request is answered 429/500/503 (TLS mode only)
  --healed                      start with faults off
Signals: SIGUSR1 heals (faults off), SIGUSR2 turns faults on, SIGTERM stops.
)";

void parse_args(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--listen") {
      std::tie(g_opt.listen_host, g_opt.listen_port) = split_host_port(a, next());
      if (g_opt.listen_host != "127.0.0.1") usage_error("--listen: only 127.0.0.1 is allowed");
    } else if (a == "--upstream") {
      std::tie(g_opt.upstream_host, g_opt.upstream_port) = split_host_port(a, next());
    } else if (a == "--port-file") {
      g_opt.port_file = next();
    } else if (a == "--stats-file") {
      g_opt.stats_file = next();
    } else if (a == "--tls-cert") {
      g_opt.tls_cert = next();
    } else if (a == "--tls-key") {
      g_opt.tls_key = next();
    } else if (a == "--upstream-ca") {
      g_opt.upstream_ca = next();
    } else if (a == "--seed") {
      g_opt.seed = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--latency-ms") {
      g_opt.latency_ms = std::max(0, std::atoi(next().c_str()));
    } else if (a == "--refuse") {
      g_opt.p_refuse = probability(a, next());
    } else if (a == "--reset") {
      g_opt.p_reset = probability(a, next());
    } else if (a == "--reset-max") {
      g_opt.reset_max_s = std::max(0.3, std::atof(next().c_str()));
    } else if (a == "--stall") {
      g_opt.p_stall = probability(a, next());
    } else if (a == "--truncate-watch") {
      g_opt.p_truncate_watch = probability(a, next());
    } else if (a == "--http-error") {
      g_opt.p_http_error = probability(a, next());
    } else if (a == "--healed") {
      g_opt.start_healed = true;
    } else {
      usage_error("unknown argument '" + a + "'");
    }
  }
  if (g_opt.upstream_host.empty() || g_opt.upstream_port == 0) usage_error("--upstream HOST:PORT is required");
}

int run(int argc, char** argv) {
  parse_args(argc, argv);
  setup_tls();
  if (g_opt.p_http_error > 0 && g_server_ctx == nullptr) {
    usage_error(
        "--http-error needs TLS termination (--tls-cert, --tls-key, --upstream-ca): a TCP proxy cannot "
        "answer inside an encrypted stream");
  }
  g_faults = !g_opt.start_healed;
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGUSR1, SIGUSR2, SIGTERM, SIGINT}) sigaction(sig, &sa, nullptr);

  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(g_opt.listen_port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(lfd, 128) != 0) {
    std::cerr << "railyard-chaos-proxy: cannot listen on 127.0.0.1:" << g_opt.listen_port << ": "
              << std::strerror(errno) << "\n";
    return 1;
  }
  socklen_t len = sizeof addr;
  getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  if (!g_opt.port_file.empty()) write_file_atomic(g_opt.port_file, std::to_string(port) + "\n");
  log::info(kComponent, "listening",
            {{"addr", "127.0.0.1:" + std::to_string(port)},
             {"upstream", g_opt.upstream_host + ":" + std::to_string(g_opt.upstream_port)},
             {"tls", g_server_ctx != nullptr ? "terminated" : "passed through"}});

  uint64_t next_id = 0;
  auto last_stats = Clock::now();
  bool last_faults = g_faults;
  while (!g_stop) {
    pollfd p{lfd, POLLIN, 0};
    int r = poll(&p, 1, 100);
    if (g_faults != last_faults) {
      last_faults = g_faults;
      log::info(kComponent, last_faults ? "faults on" : "healed: faults off");
    }
    if (r > 0 && (p.revents & POLLIN)) {
      int cfd = accept(lfd, nullptr, nullptr);
      if (cfd >= 0) {
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        std::thread([cfd, id = ++next_id] { Connection(cfd, id).run(); }).detach();
      }
    }
    if (Clock::now() - last_stats > std::chrono::milliseconds(500)) {
      write_stats();
      last_stats = Clock::now();
    }
  }
  write_stats();
  log::info(kComponent, "stopped", {{"stats", g_stats.to_json().dump()}});
  // Relay threads may be blocked in I/O; they hold nothing that needs an orderly shutdown.
  std::_Exit(0);
}

}  // namespace
}  // namespace railyard::chaos

int main(int argc, char** argv) { return railyard::chaos::run(argc, argv); }
