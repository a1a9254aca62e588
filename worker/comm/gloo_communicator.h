// Gloo backend of Communicator: collectives over TCP between CPU buffers. Bootstrap through TcpStore (rank 0 serves
// it). See docs/parallel.md "Communication".
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "worker/comm/communicator.h"
#include "worker/comm/tcp_store.h"

namespace railyard::worker::comm {

struct GlooOptions {
  std::string store_host = "127.0.0.1";  // MASTER_ADDR: where rank 0 serves the store
  int store_port = 0;                    // MASTER_PORT
  int rank = 0;
  int size = 1;
  std::string bind_host = "127.0.0.1";  // this rank's address for Gloo's pairs (RAILYARD_POD_IP under the agent)
  std::chrono::milliseconds timeout{30000};
  std::string prefix = "g0";  // one per generation, so a restarted world never reads old keys
  // Rank 0 runs the store server (bound to store_host:store_port) for as long as any communicator of this world
  // lives. False when the caller runs the TcpStoreServer itself (tests, run_local_world).
  bool serve_store = true;
  std::string name = "world";
  // The bootstrap store's token (RAILYARD_STORE_TOKEN, which the agent derives from the job's rendezvous token per
  // generation). Rank 0's server refuses clients without it; empty: the store is open (runs without the agent).
  std::string store_token;
  // The store over TLS with the pod's identity under the job's CA (RAILYARD_PEER_TLS_CA/_CERT/_KEY, set by the
  // agent); null: plain TCP.
  StoreTls store_tls;
};

// Connects rank `rank` of the world; returns when every rank has connected (or throws CommError/CommTimeout naming
// what is missing). Bad options throw std::invalid_argument naming the field. A CommError on this communicator or on
// any split of it closes the connections of all of them (the generation is over): peers fail fast in every group.
std::unique_ptr<Communicator> connect_gloo(const GlooOptions& options);

// From the launcher's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (required), RAILYARD_GENERATION
// (prefix "g<generation>", default 0), RAILYARD_STORE_TOKEN (the store's token, default none),
// RAILYARD_PEER_TLS_CA/_CERT/_KEY (the store over TLS, all three or none), RAILYARD_POD_IP (bind
// address, default MASTER_ADDR when it is a loopback address, else 0.0.0.0 is refused: set it),
// RAILYARD_COMM_TIMEOUT_MS (default 30000). Throws ConfigError naming the variable and the fix.
GlooOptions gloo_options_from_env();

}  // namespace railyard::worker::comm
