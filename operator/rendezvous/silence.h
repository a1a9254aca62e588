// Which pods fell silent: the pure rule behind the rendezvous service's "silent" exits (docs/rendezvous.md "A pod
// that falls silent"). An agent that announced a heartbeat (JoinRequest.heartbeat_ms) sends a request at least that
// often for as long as it runs, whatever it is doing; a pod that sends none for long enough while a peer of its job is
// heard is frozen, partitioned from the operator, or gone with its node, though its sockets may still be open (its
// peers then block in their collectives) and its node may still look Ready for the node lifecycle's grace period
// (40 s by default). Tested without a server in tests/unit/rendezvous/silence_test.cc.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace railyard::op::silence {

using Clock = std::chrono::steady_clock;

// What the service heard of one pod name of a job.
struct Heard {
  std::string pod;
  std::string uid;             // the UID the pod's requests carried ("" never counts: it cannot be fenced)
  std::string holder_uid;      // the UID the operator says holds the name now (set_pod_uids)
  Clock::time_point last;      // when the last request from that UID started or ended
  int in_flight = 0;           // its requests being served now (a long-poll join): heard
  long long heartbeat_ms = 0;  // its promise (0: none, never silent)
  bool exited = false;         // it reported an exit in the current generation (an agent that finished goes quiet)
};

struct Silent {
  std::string pod, uid;
  double seconds = 0;       // since it was last heard (from when the service itself last ran, after a stall)
  std::string heard_peer;   // a peer heard meanwhile: the service and the network to it work
  double peer_seconds = 0;  // how long ago that peer was heard
  Clock::time_point last;   // when it was last heard
  bool corroborated = false;  // judged by the shorter threshold: a survivor reported a lost peer after it was heard
};

// after: the operator's silence threshold (--agent-silence-seconds; 0 = never). A pod is silent when it holds its
// name, promised a heartbeat, has nothing in flight, did not exit, and was not heard for max(after, 3 x its heartbeat)
// counted from max(last, service_resumed); and some other pod holding its name was heard within half of that (or has
// a request in flight): when every pod is quiet the silence is the service's or its network's, and nobody is blamed.
// service_resumed: the end of the service's own last stall (a paused or starved operator hears nobody meanwhile).
//
// peer_lost: when a survivor of the job last reported that its collective lost a peer (an exit kExitPeerLost: a
// connection reset or closed under it). For a pod not heard since then the two signals agree (the data plane lost
// someone, and this pod stopped talking before that loss was known), so the silence needs only
// max(after / 2, 3 x its heartbeat): a node lost with its containers is replaced seconds sooner. A pod heard after the
// report (a killed rank's agent goes on talking) is judged by the full threshold.
std::vector<Silent> find_silent(const std::vector<Heard>& pods, Clock::time_point now,
                                Clock::time_point service_resumed, std::chrono::milliseconds after,
                                Clock::time_point peer_lost = {});

}  // namespace railyard::op::silence
