// Shared by the communicator tests (test_tcp_store.cc, test_tcp_store_tls.cc): a free port for a store.
#pragma once

#include "worker/comm/tcp_store.h"

namespace railyard::worker::comm::testing {

// A port no one serves right now: one a store bound to and released.
inline int free_store_port() {
  TcpStoreServer probe("127.0.0.1", 0);
  return probe.port();
}

}  // namespace railyard::worker::comm::testing
