// The bootstrap key-value store of one generation: rank 0 serves it (TcpStoreServer, in a thread of its process);
// every rank talks to it through TcpStore, which is the gloo::rendezvous::Store that Gloo's connectFullMesh uses and
// that carries the NCCL unique id. Debian's Gloo ships no TCP store, hence this one.
//
// Wire format (one request, one reply, on a persistent connection): u8 op, u32 key length, key, u32 value length,
// value; reply u8 status, u32 value length, value. Integers little-endian. Keys are plain bytes.
//
// Token: a server given a non-empty token serves a connection only after its first request was an auth request
// (op 5, key = the token) carrying that token; anything else gets status 2 ("refused", empty value) and the
// connection is closed. The agent gives every worker of a generation the same token, derived from the job's
// rendezvous token (worker/agent, RAILYARD_STORE_TOKEN), so a stray or hostile client on the pod network can neither
// read the Gloo/NCCL addresses nor plant its own. The token never appears in an error message or a log line.
//
// TLS: given a pod identity (common/tls/job_identity.h: the job CA's certificate and this pod's leaf under it, from
// RAILYARD_PEER_TLS_*), the server and every client speak the same protocol inside TLS 1.3, each presenting its leaf
// and trusting only the job's CA. A client without a certificate, or with another job's, fails the handshake before
// it sends a byte of the protocol, so the token and the values cross the pod network only encrypted. Without an
// identity: plain TCP, as before (tests, single-host runs without the agent).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/tls/channel.h"
#include "common/tls/job_identity.h"

namespace railyard::worker::comm {

using StoreTls = std::shared_ptr<const tls::PodIdentity>;  // null: plain TCP

class TcpStoreServer {
 public:
  // Binds host:port (port 0: the kernel picks a free one, see port()). A port still held by someone else is retried
  // for up to `retry_for` (the previous generation's rank 0 may still be exiting). Throws CommError naming host:port.
  // `token` empty: every client is served (tests, single-host runs without the agent). `tls` set: only over TLS, to
  // clients whose certificate the job's CA signed (a ConfigError when the identity is unreadable).
  TcpStoreServer(const std::string& host, int port, std::chrono::milliseconds retry_for = std::chrono::milliseconds(0),
                 std::string token = "", StoreTls tls = nullptr);
  // Stops accepting, closes every connection and joins its threads.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;
  const std::string& host() const;
  size_t key_count() const;
  size_t refused_count() const;  // connections closed for a missing or wrong token, or a failed TLS handshake
  // A connection must complete its TLS handshake and present its token within this (default 10 s), or it is closed:
  // a peer that connects and says nothing holds no thread for long. Past it, a client may idle as long as it likes.
  void set_unauthenticated_deadline(std::chrono::milliseconds d);
  // At most this many connections at a time (default 4096, far above 2 per rank of the largest world); more are
  // closed at once and counted as refused. Finished connections are reaped as new ones arrive.
  static constexpr size_t kMaxConnections = 4096;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client. Thread-safe (one request at a time on the connection); waits poll the server, so two threads waiting on
// different keys never block each other for longer than a round trip.
class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying until `timeout` (rank 0 may start later). Every key is stored as prefix + "/" +
  // key, so a new generation (another prefix) never sees the keys of an old one. Throws CommTimeout naming host:port.
  // A non-empty `token` is presented right after connecting; a server that refuses it (or that wants a token when
  // none is given) makes the constructor, or the first request, throw CommError saying so. `tls` set: the connection
  // is TLS, the server must prove the job's CA signed its certificate; a failed handshake throws CommError (no retry).
  TcpStore(const std::string& host, int port, std::string prefix, std::chrono::milliseconds timeout,
           const std::string& token = "", StoreTls tls = nullptr);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& value) override;
  // Waits (up to the store's timeout) until the key exists, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // Throws CommTimeout naming the missing keys when they do not all exist within `timeout`.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // Whether every key exists now.
  bool check(const std::vector<std::string>& keys);
  // Atomically adds delta to the integer stored at key (0 if absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);

  const std::string& prefix() const { return prefix_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string address() const;

 private:
  std::vector<char> request(uint8_t op, const std::string& key, const std::vector<char>& value, uint8_t* status);
  [[noreturn]] void refused();
  void start_tls(int fd, const StoreTls& tls);
  void drop();  // closes the connection after an error
  std::string full_key(const std::string& key) const { return prefix_ + "/" + key; }

  std::string host_;
  int port_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  int fd_ = -1;
  std::unique_ptr<tls::Channel> ch_;  // on fd_
};

}  // namespace railyard::worker::comm
