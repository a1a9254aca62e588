// Shared by the communicator tests (test_tcp_store.cc, test_tcp_store_tls.cc): a free port for a store, and the
// options of one rank of a world on it.
#pragma once

#include <chrono>
#include <string>
#include <utility>

#include "worker/comm/gloo_communicator.h"
#include "worker/comm/tcp_store.h"

namespace railyard::worker::comm::testing {

// A port no one serves right now: one a store bound to and released.
inline int free_store_port() {
  TcpStoreServer probe("127.0.0.1", 0);
  return probe.port();
}

// Rank `rank` of a world of `size` whose store is (or will be, served by rank 0) at 127.0.0.1:`port`.
inline GlooOptions gloo_options(int port, int rank, int size, std::chrono::milliseconds timeout,
                                std::string prefix = "g0") {
  GlooOptions o;
  o.store_port = port;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.prefix = std::move(prefix);
  return o;
}

}  // namespace railyard::worker::comm::testing
