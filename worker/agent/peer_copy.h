// The peer copy of the in-memory checkpoint tier (Gemini-style; docs/checkpointing.md "The peer copy"): every agent
// streams each newly completed shared-memory slot of its ranks to the agent of the next pod in the generation's
// ring, which keeps the two newest copies per remote rank; an agent that replaces a lost pod fetches its ranks'
// copies before it starts its workers. Copies move byte for byte (ckpt::ShmStore::Image), so the receiver checks the
// same header and CRC32C the worker wrote: a half-received copy is torn (detected), never wrong.
//
// HTTPS on the pod IP when the job has its own CA (Auth::tls; plain HTTP otherwise), every request with
// "Authorization: Bearer <peer_copy_token>" and "X-Railyard-Job: <namespace>/<job>":
//   PUT /v1/peer/<rank>          body: one slot image; stored into the receiver's older slot of that rank; with
//                                "X-Railyard-Generation: <g>", refused (409) when g is older than the receiver's
//   GET /v1/peer/<rank>          {"steps": [a, b]}: the steps of the complete copies (-1: none)
//   GET /v1/peer/<rank>/<a|b>    one copy's image
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/tls/job_identity.h"

namespace railyard::worker::peer {

struct Auth {
  std::string job_key;  // "<namespace>/<job>"
  std::string token;    // the job's peer_copy_token (never the rendezvous token): sent, compared, never logged
  // This pod's identity under the job's CA (AgentConfig::identity): HTTPS both ways, each side presenting its leaf and
  // trusting only the job's CA. Null: plain HTTP.
  std::shared_ptr<const tls::PodIdentity> tls;
  // The generation this agent is in (PeerRing::set_up), shared by its server and its sender; 0 before the first.
  // A sender puts it on every copy (X-Railyard-Generation); a server refuses a copy from an older generation than its
  // own (409): a superseded pod (the old container on a node whose kubelet died, a paused agent) cannot replace a
  // current copy with its stale one (issue #40 item 2). Null: no generation (tests, a server that accepts any).
  std::shared_ptr<std::atomic<int64_t>> generation = nullptr;
};

class PeerError : public Error {
 public:
  using Error::Error;
};
// The local slot was overwritten by the worker's next-but-one put while it was sent: the copy lags the puts.
class LaggedError : public PeerError {
 public:
  using PeerError::PeerError;
};

// "<prefix>-peer-r<rank>-a|b": where a receiver keeps the copies of a remote rank (under its own agent prefix, so it
// removes them with its own segments when it exits).
std::string copy_name(const std::string& prefix, int rank, int slot);

// Receives and serves copies. Binds ip:port (0 = any free port) only; throws Error when it cannot bind.
class PeerServer {
 public:
  PeerServer(const std::string& ip, int port, Auth auth, std::string prefix);
  ~PeerServer();
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct CopyResult {
  int rank = 0;
  int64_t step = -1;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Sends the complete snapshot in shared-memory segment `slot_name` as a copy of `rank` to the peer at addr
// ("ip:port"). Throws PeerError naming what failed (no complete snapshot, refused, overwritten while sending, ...).
CopyResult send_slot(const std::string& addr, const Auth& auth, int rank, const std::string& slot_name);

// The steps of the complete copies of `rank` the peer holds (-1 for an empty or torn slot). Throws PeerError.
std::vector<int64_t> held_steps(const std::string& addr, const Auth& auth, int rank);

// Fetches the peer's complete copies of `rank` into the worker slots `base + "-a"` and `base + "-b"` (what
// RAILYARD_SHM_PREFIX + "-r<rank>" names). Returns the steps fetched (empty: none usable; *why says why).
std::vector<int64_t> fetch(const std::string& addr, const Auth& auth, int rank, const std::string& base,
                           std::string* why);

// The agent's sending side: a thread that polls the local slots of its ranks (peek: the header only) and sends each
// newly completed one to the target. Off the training path: the worker never waits for a copy to finish; it only
// reads, before a put, which of its steps the target holds (ckpt::write_peer_held, updated after every change), so
// that it keeps the one the target holds.
class PeerSender {
 public:
  using OnCopy = std::function<void(const CopyResult&, const std::string& error)>;  // error empty on success
  PeerSender(Auth auth, std::chrono::milliseconds poll, OnCopy on_copy);
  ~PeerSender();
  PeerSender(const PeerSender&) = delete;
  PeerSender& operator=(const PeerSender&) = delete;
  // ranks: global rank -> slot base name ("<prefix>-r<rank>"); target "" = send nothing.
  void set(std::map<int, std::string> ranks, std::string target);

 private:
  void loop();
  // Writes the steps the target holds of `rank` (slots base + "-a|-b") for the rank's workers (checkpoint/peer_held.h).
  static void record_held(int rank, const std::string& base, const std::vector<int64_t>& steps);
  Auth auth_;
  std::chrono::milliseconds poll_;
  OnCopy on_copy_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<int, std::string> ranks_;
  std::string target_;
  uint64_t config_version_ = 0;
  std::thread thread_;
};

}  // namespace railyard::worker::peer
