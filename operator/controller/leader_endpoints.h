// The leader as the only endpoint of the rendezvous Service (issue #40 item 7; docs/install.md "Leader election").
//
// Only the leader serves the rendezvous. A Service that selects every operator replica sends about half of the
// agents' connections to a standby, which refuses them; making the standbys unready instead would hold every
// `helm install --wait` and rollout on a replica that is, by design, never going to lead. So the chart's rendezvous
// Service has no selector, and the replica that leads writes its Endpoints: its own pod IP and rendezvous port, the
// pod named in targetRef. A new leader overwrites it with its own; a replica that loses the lease exits at once
// (main.cc), so two replicas never write it in turn. Kubernetes' own API servers publish the `kubernetes` Service the
// same way.
#pragma once

#include <string>

#include "common/kube/client.h"

namespace railyard::op {

struct LeaderEndpoint {
  std::string ns;                         // the operator's namespace (the Service's)
  std::string name;                       // the Service's name (--leader-endpoints)
  std::string pod_name, pod_uid, pod_ip;  // this replica's pod (downward API: POD_NAME, POD_UID, POD_IP)
  int port = 0;                           // the rendezvous port this replica listens on
  std::string port_name = "rendezvous";   // the Service port's name (an Endpoints port must carry it)
};

// The Endpoints object naming `e` as the Service's only address. Pure.
kube::Json leader_endpoints_object(const LeaderEndpoint& e);

// True when `current` (an Endpoints object read from the API server) names `e` and nothing else: one ready address,
// its IP and pod, one port of that name and number.
bool leader_endpoints_current(const kube::Json& current, const LeaderEndpoint& e);

// Creates or updates the Endpoints so that it names `e` alone; does nothing when it already does. Returns true when
// it wrote. Throws kube::ApiError (a conflict from a concurrent writer included: the caller tries again).
bool publish_leader_endpoints(kube::Client& client, const LeaderEndpoint& e);

}  // namespace railyard::op
