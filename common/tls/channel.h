// A connected socket as a byte stream, plain or TLS: what a small request/reply protocol of its own (the trainers'
// bootstrap store, worker/comm/tcp_store.h) needs to run the same code over either. The channel never owns the
// file descriptor: its owner closes it after the channel is gone.
#pragma once

#include <openssl/ssl.h>

#include <cstddef>
#include <memory>
#include <string>

namespace railyard::tls {

class Channel {
 public:
  // Plain TCP on fd.
  explicit Channel(int fd) : fd_(fd) {}
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // A TLS handshake on fd as the server / the client under ctx (job_identity.h). Null, and *why set to OpenSSL's
  // reason, when it fails: the peer then got nothing but the handshake's alert.
  static std::unique_ptr<Channel> accept(int fd, SSL_CTX* ctx, std::string* why);
  static std::unique_ptr<Channel> connect(int fd, SSL_CTX* ctx, std::string* why);

  // All n bytes, or false (the peer went away, a timeout, a TLS error). Writes never raise SIGPIPE.
  bool read_all(void* data, size_t n);
  bool write_all(const void* data, size_t n);
  bool tls() const { return ssl_ != nullptr; }

 private:
  Channel(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  static std::unique_ptr<Channel> handshake(int fd, SSL_CTX* ctx, bool server, std::string* why);
  int fd_;
  SSL* ssl_ = nullptr;
};

}  // namespace railyard::tls
