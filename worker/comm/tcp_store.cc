#include "worker/comm/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "worker/comm/communicator.h"

namespace railyard::worker::comm {
namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3, kAdd = 4, kAuth = 5 };
enum Status : uint8_t { kMissing = 0, kOk = 1, kRefused = 2 };
// A request larger than this is garbage (a stray client or a port mix-up), not a store entry.
constexpr uint32_t kMaxField = 64u << 20;
// Before a client proved it holds the token, it gets no more than this per field: no 64 MiB allocations for strangers.
constexpr uint32_t kMaxUnauthenticatedField = 4096;

std::string errno_text(int err) { return std::strerror(err); }

void put_u32(std::vector<char>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

bool read_field(tls::Channel& ch, std::string& out, uint32_t max = kMaxField) {
  unsigned char len[4];
  if (!ch.read_all(len, 4)) return false;
  uint32_t n = get_u32(len);
  if (n > max) return false;
  out.resize(n);
  return n == 0 || ch.read_all(out.data(), n);
}

// Compares without an early exit, so the time taken does not tell how much of a guessed token was right.
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool write_reply(tls::Channel& ch, uint8_t status, const std::string& reply) {
  std::vector<char> out;
  out.reserve(5 + reply.size());
  out.push_back(static_cast<char>(status));
  put_u32(out, static_cast<uint32_t>(reply.size()));
  out.insert(out.end(), reply.begin(), reply.end());
  return ch.write_all(out.data(), out.size());
}

std::vector<char> encode_i64(int64_t v) {
  std::vector<char> out(8);
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((u >> (8 * i)) & 0xff);
  return out;
}
int64_t decode_i64(const char* p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return static_cast<int64_t>(u);
}

// getaddrinfo for IPv4 host:port (MASTER_ADDR may be a name under Kubernetes).
sockaddr_in resolve(const std::string& host, int port, const char* what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    throw CommError(std::string(what) + ": cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  sockaddr_in addr{};
  std::memcpy(&addr, res->ai_addr, sizeof addr);
  ::freeaddrinfo(res);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
struct TcpStoreServer::Impl {
  std::string host;
  int port = 0;
  int listen_fd = -1;
  std::string token;   // empty: no authentication
  tls::SslCtxPtr ctx;  // null: plain TCP
  std::atomic<size_t> refused{0};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> unauthenticated_ms{10000};
  std::thread acceptor;

  mutable std::mutex mu;  // guards data, conns
  std::map<std::string, std::string> data;
  struct Conn {
    int fd;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;  // set by the thread as it returns: then it can be joined at once
  };
  std::vector<Conn> conns;

  static void set_timeouts(int fd, int64_t ms) {
    timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }

  // Under mu: joins and closes the connections whose threads have returned.
  void reap() {
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->done->load()) {
        it->thread.join();
        ::close(it->fd);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }

  void accept_loop() {
    while (!stop.load()) {
      pollfd p{listen_fd, POLLIN, 0};
      int rc = ::poll(&p, 1, 50);
      if (rc <= 0) continue;
      int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      // Until it has shaken hands and shown its token, a connection gets bounded reads and writes.
      set_timeouts(fd, unauthenticated_ms.load());
      std::lock_guard<std::mutex> lock(mu);
      if (stop.load()) {
        ::close(fd);
        break;
      }
      reap();
      if (conns.size() >= TcpStoreServer::kMaxConnections) {
        refused.fetch_add(1);
        ::close(fd);
        continue;
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      conns.push_back(Conn{fd, std::thread([this, fd, done] {
                             serve(fd);
                             done->store(true);
                           }),
                           done});
    }
  }

  // The connection's channel: TLS when the server has a context (a failed handshake is a refusal: nothing of the
  // protocol was read), else plain.
  std::unique_ptr<tls::Channel> open(int fd) {
    if (!ctx) return std::make_unique<tls::Channel>(fd);
    std::string why;
    auto ch = tls::Channel::accept(fd, ctx.get(), &why);
    if (!ch) {
      refused.fetch_add(1);
      ::shutdown(fd, SHUT_RDWR);
    }
    return ch;
  }

  void serve(int fd) {
    std::unique_ptr<tls::Channel> ch = open(fd);
    if (ch) serve(fd, *ch);
    // The peer sees the end now (a deadline passed, a refusal, its own close); the fd is closed when reaped.
    ::shutdown(fd, SHUT_RDWR);
  }

  void serve(int fd, tls::Channel& ch) {
    bool authenticated = token.empty();
    if (authenticated) set_timeouts(fd, 0);  // no token to wait for: the handshake was all
    for (;;) {
      uint8_t op;
      std::string key, value;
      const uint32_t max = authenticated ? kMaxField : kMaxUnauthenticatedField;
      if (!ch.read_all(&op, 1) || !read_field(ch, key, max) || !read_field(ch, value, max)) {
        if (!authenticated) refused.fetch_add(1);
        return;
      }
      if (!authenticated) {
        if (op != kAuth || !same_token(key, token)) {
          refused.fetch_add(1);
          write_reply(ch, kRefused, "");
          // Nothing was read from or written to the store. The client sees the end of the connection now; the fd
          // itself is closed with the others by the destructor (it owns them).
          ::shutdown(fd, SHUT_RDWR);
          return;
        }
        authenticated = true;
        set_timeouts(fd, 0);  // a rank may idle between requests for as long as training runs
        if (!write_reply(ch, kOk, "")) return;
        continue;
      }
      uint8_t status = kOk;
      std::string reply;
      if (op == kAuth) {  // a client with a token talking to a server without one, or a repeated auth: nothing to do
        if (!write_reply(ch, kOk, "")) return;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        switch (op) {
          case kSet:
            data[key] = std::move(value);
            break;
          case kGet: {
            auto it = data.find(key);
            if (it == data.end()) {
              status = 0;
            } else {
              reply = it->second;
            }
            break;
          }
          case kCheck:
            status = data.count(key) ? 1 : 0;
            break;
          case kAdd: {
            if (value.size() != 8) return;
            auto& slot = data[key];
            int64_t cur = slot.size() == 8 ? decode_i64(slot.data()) : 0;
            cur += decode_i64(value.data());
            auto enc = encode_i64(cur);
            slot.assign(enc.begin(), enc.end());
            reply = slot;
            break;
          }
          default:
            return;  // unknown op: drop the connection, the client sees a clear error
        }
      }
      if (!write_reply(ch, status, reply)) return;
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::chrono::milliseconds retry_for,
                               std::string token, StoreTls tls)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->token = std::move(token);
  if (tls) impl_->ctx = tls::server_context(*tls);
  std::string where = "TcpStore server " + host + ":" + std::to_string(port);
  sockaddr_in addr = resolve(host, port, where.c_str());
  const auto give_up = std::chrono::steady_clock::now() + retry_for;
  int fd = -1;
  for (;;) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw CommError(where + ": socket: " + errno_text(errno));
    int one = 1;
    // A restarted generation binds the same MASTER_PORT while the old connections sit in TIME_WAIT.
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd, 128) == 0) break;
    int err = errno;
    ::close(fd);
    if (err == EADDRINUSE && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    throw CommError(where + ": cannot listen: " + errno_text(err) +
                    (err == EADDRINUSE ? " (another process holds the port: pick another MASTER_PORT)" : ""));
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  impl_->port = ntohs(addr.sin_port);
  impl_->listen_fd = fd;
  impl_->acceptor = std::thread([this] { impl_->accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop.store(true);
  impl_->acceptor.join();
  std::vector<Impl::Conn> conns;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    conns.swap(impl_->conns);
    for (auto& c : conns) ::shutdown(c.fd, SHUT_RDWR);  // wakes the blocked recv of every connection thread
  }
  for (auto& c : conns) {
    c.thread.join();
    ::close(c.fd);
  }
  ::close(impl_->listen_fd);
}

int TcpStoreServer::port() const { return impl_->port; }
const std::string& TcpStoreServer::host() const { return impl_->host; }
size_t TcpStoreServer::key_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->data.size();
}
size_t TcpStoreServer::refused_count() const { return impl_->refused.load(); }
void TcpStoreServer::set_unauthenticated_deadline(std::chrono::milliseconds d) {
  impl_->unauthenticated_ms = d.count();
}

// ---------------------------------------------------------------------------------------------------------------------
TcpStore::TcpStore(const std::string& host, int port, std::string prefix, std::chrono::milliseconds timeout,
                   const std::string& token, StoreTls tls)
    : host_(host), port_(port), prefix_(std::move(prefix)), timeout_(timeout) {
  if (port <= 0 || port > 65535) {
    throw CommError("TcpStore: port " + std::to_string(port) + " is out of range 1..65535 (set MASTER_PORT)");
  }
  sockaddr_in addr = resolve(host, port, ("TcpStore " + address()).c_str());
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  auto backoff = std::chrono::milliseconds(5);
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw CommError("TcpStore " + address() + ": socket: " + errno_text(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      // A server that stops answering turns into an error after the store timeout instead of a hang.
      timeval tv{};
      tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
      tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      fd_ = fd;
      start_tls(fd, tls);
      if (!token.empty()) {
        uint8_t status;
        request(kAuth, token, {}, &status);  // a refusal throws from request()
        if (status != kOk) refused();
      }
      return;
    }
    last_error = errno_text(errno);
    ::close(fd);
    if (std::chrono::steady_clock::now() + backoff > deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
  throw CommTimeout("TcpStore " + address() + ": could not connect within " + std::to_string(timeout.count()) +
                    " ms: " + last_error +
                    " (is rank 0 running and are MASTER_ADDR/MASTER_PORT the same on every rank?)");
}

TcpStore::~TcpStore() { drop(); }

void TcpStore::drop() {
  ch_.reset();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TcpStore::start_tls(int fd, const StoreTls& tls) {
  if (!tls) {
    ch_ = std::make_unique<tls::Channel>(fd);
    return;
  }
  std::string why;
  ch_ = tls::Channel::connect(fd, tls::client_context(*tls).get(), &why);  // the SSL keeps its context alive
  if (ch_) return;
  drop();
  throw CommError("TcpStore " + address() + ": TLS handshake with the bootstrap store failed (" + why +
                  "): rank 0 serves it over TLS to the ranks of its job only, and this rank's identity (" +
                  tls::kPeerCaEnv + ", " + tls::kPeerCertEnv +
                  ", set by the agent) is another job's, or the server "
                  "speaks plain TCP");
}

std::string TcpStore::address() const { return host_ + ":" + std::to_string(port_); }

std::vector<char> TcpStore::request(uint8_t op, const std::string& key, const std::vector<char>& value,
                                    uint8_t* status) {
  std::vector<char> msg;
  msg.reserve(9 + key.size() + value.size());
  msg.push_back(static_cast<char>(op));
  put_u32(msg, static_cast<uint32_t>(key.size()));
  msg.insert(msg.end(), key.begin(), key.end());
  put_u32(msg, static_cast<uint32_t>(value.size()));
  msg.insert(msg.end(), value.begin(), value.end());
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) throw CommError("TcpStore " + address() + ": connection lost earlier");
  unsigned char head[5];
  if (!ch_->write_all(msg.data(), msg.size()) || !ch_->read_all(head, 5)) {
    int err = errno;
    drop();
    throw CommError("TcpStore " + address() + ": server went away or did not answer within " +
                    std::to_string(timeout_.count()) + " ms (" + (err ? errno_text(err) : "closed") +
                    "); rank 0 serves the store and may have exited");
  }
  *status = head[0];
  if (*status == kRefused) {
    drop();
    refused();
  }
  std::vector<char> reply(get_u32(head + 1));
  if (!reply.empty() && !ch_->read_all(reply.data(), reply.size())) {
    drop();
    throw CommError("TcpStore " + address() + ": truncated reply");
  }
  return reply;
}

void TcpStore::refused() {
  throw CommError("TcpStore " + address() +
                  ": the bootstrap store refused this client: rank 0 serves it only to clients with the generation's "
                  "token (RAILYARD_STORE_TOKEN, set by the agent), and this one's is missing or different (ranks of "
                  "another job or generation on the same MASTER_ADDR/MASTER_PORT?)");
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  uint8_t status;
  request(kSet, full_key(key), value, &status);
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  uint8_t status;
  auto value = request(kGet, full_key(key), {}, &status);
  if (status != 1) throw CommError("TcpStore " + address() + ": key '" + full_key(key) + "' vanished");
  return value;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    uint8_t status;
    request(kCheck, full_key(k), {}, &status);
    if (status != 1) return false;
  }
  return true;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto backoff = std::chrono::microseconds(500);
  size_t next = 0;  // keys before `next` are known to exist; keys are never deleted
  for (;;) {
    while (next < keys.size()) {
      uint8_t status;
      request(kCheck, full_key(keys[next]), {}, &status);
      if (status != 1) break;
      ++next;
    }
    if (next == keys.size()) return;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::string missing;
      for (size_t i = next; i < keys.size() && i < next + 8; ++i) missing += (missing.empty() ? "" : ", ") + keys[i];
      throw CommTimeout("TcpStore " + address() + ": timed out after " + std::to_string(timeout.count()) +
                        " ms waiting for keys [" + missing + "] under prefix '" + prefix_ +
                        "' (a rank did not start, or ranks disagree on RAILYARD_GENERATION/WORLD_SIZE)");
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  uint8_t status;
  auto reply = request(kAdd, full_key(key), encode_i64(delta), &status);
  if (reply.size() != 8) throw CommError("TcpStore " + address() + ": bad reply to add");
  return decode_i64(reply.data());
}

}  // namespace railyard::worker::comm
