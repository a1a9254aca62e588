// The agent's part in the peer copy of the in-memory checkpoint tier (docs/checkpointing.md "The peer copy"): it
// serves copies to the other agents of its job, streams its ranks' slots to the next pod of each generation's ring,
// and, as the agent of a replacement pod, fetches its ranks' copies before its workers start. The wire side is
// peer_copy.h; this is the per-generation setup around it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous_protocol.h"
#include "worker/agent/agent_metrics.h"
#include "worker/agent/peer_copy.h"
#include "worker/agent/agent_config.h"

namespace railyard::worker {

class PeerRing {
 public:
  // Serves copies on cfg.pod_ip:cfg.peer_port into segments under shm_prefix (the agent's own, so they go with its
  // segments). A listener that cannot bind is logged and left out: the job trains without receiving copies.
  PeerRing(const AgentConfig& cfg, std::string shm_prefix, AgentMetrics& metrics);
  ~PeerRing();
  PeerRing(const PeerRing&) = delete;
  PeerRing& operator=(const PeerRing&) = delete;

  // The listener's port, offered in join requests; 0 when there is none.
  int port() const;

  // A new generation a. replacement: this agent never ran workers, so when a restores, its ranks' copies are
  // fetched from the other pods first (the ring's next pod first: it held this pod index's copies). Then the
  // sender streams this pod's ranks to the next pod of the ring. Off when the generation has no in-memory tier,
  // one pod, or a pod without a listener.
  void set_up(const rdzv::Assignment& a, bool replacement);

  // The steps fetched for `rank` in this generation's set_up (RAILYARD_SHM_PEER_STEPS); empty when none.
  std::vector<int64_t> fetched_steps(int rank) const;
  // This generation's slots are copied to a peer pod (set_up found more than one pod with addresses): the ranks get
  // RAILYARD_SHM_PEER_COPY and read what the peer holds before each put.
  bool copying() const { return copying_; }

  // Stops sending and receiving, and logs what was sent; nothing may create a segment after this. Idempotent.
  void stop();

 private:
  void on_copy(const peer::CopyResult& r, const std::string& error);

  const std::string shm_prefix_;
  const peer::Auth auth_;
  AgentMetrics& metrics_;
  std::map<int, std::vector<int64_t>> steps_;  // rank -> steps fetched from a peer for this generation
  bool copying_ = false;
  std::atomic<uint64_t> copies_{0};
  std::atomic<double> copy_seconds_sum_{0}, copy_seconds_max_{0};
  std::atomic<bool> first_logged_{false};  // the first copy to each new target is logged at info
  std::unique_ptr<peer::PeerServer> server_;
  std::unique_ptr<peer::PeerSender> sender_;
};

}  // namespace railyard::worker
