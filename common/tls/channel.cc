#include "common/tls/channel.h"

#include <openssl/err.h>
#include <sys/socket.h>

#include <cerrno>
#include <csignal>
#include <mutex>

#include "common/tls/pki.h"

namespace railyard::tls {
namespace {

// OpenSSL's socket BIO writes with write(), not send(MSG_NOSIGNAL): a peer that vanished mid-write must be an error
// here, not a SIGPIPE that kills the process. Only when nobody installed a handler: an application's own choice wins
// (the same rule as worker/comm's connectors).
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  });
}

}  // namespace

Channel::~Channel() {
  // No close_notify: the owner shuts the socket down, and a peer reading it sees the end of the stream either way.
  if (ssl_ != nullptr) SSL_free(ssl_);
}

std::unique_ptr<Channel> Channel::handshake(int fd, SSL_CTX* ctx, bool server, std::string* why) {
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    *why = "cannot start TLS: " + openssl_error();
    SSL_free(ssl);
    return nullptr;
  }
  ignore_sigpipe();
  const int rc = server ? SSL_accept(ssl) : SSL_connect(ssl);
  if (rc != 1) {
    const int err = SSL_get_error(ssl, rc);
    *why = err == SSL_ERROR_SSL ? openssl_error() : "connection closed during the TLS handshake";
    ERR_clear_error();
    SSL_free(ssl);
    return nullptr;
  }
  return std::unique_ptr<Channel>(new Channel(fd, ssl));
}

std::unique_ptr<Channel> Channel::accept(int fd, SSL_CTX* ctx, std::string* why) {
  return handshake(fd, ctx, true, why);
}

std::unique_ptr<Channel> Channel::connect(int fd, SSL_CTX* ctx, std::string* why) {
  return handshake(fd, ctx, false, why);
}

bool Channel::read_all(void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (ssl_ != nullptr) {
      size_t got = 0;
      if (SSL_read_ex(ssl_, p, n, &got) != 1) {
        ERR_clear_error();
        return false;
      }
      p += got;
      n -= got;
      continue;
    }
    ssize_t r = ::recv(fd_, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool Channel::write_all(const void* data, size_t n) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    if (ssl_ != nullptr) {
      size_t put = 0;
      if (SSL_write_ex(ssl_, p, n, &put) != 1) {
        ERR_clear_error();
        return false;
      }
      p += put;
      n -= put;
      continue;
    }
    // MSG_NOSIGNAL so that a vanished peer is an error here, not a SIGPIPE for the whole process.
    ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace railyard::tls
