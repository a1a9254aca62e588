// Shared by the NCCL tests on real GPUs (worker_comm/test_nccl_gpu.cc, worker_cuda/test_stage_nccl_gpu.cc): a world
// of ranks as threads of the test, rank r on GPU r, with NCCL's bootstrap kept on 127.0.0.1.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/nccl_communicator.h"
#include "worker/comm/tcp_store.h"

namespace railyard::worker::comm::testing {

// A port on 127.0.0.1 that nothing listened on a moment ago.
inline int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Rank `rank` of `size` joining the store that the test itself serves on 127.0.0.1:`store_port`.
inline GlooOptions store_client(int store_port, int rank, int size) {
  GlooOptions o;
  o.store_port = store_port;
  o.rank = rank;
  o.size = size;
  o.serve_store = false;
  return o;
}

// Runs fn(comm) on n ranks over NCCL (rank r on GPU r), with the collective `timeout` and the store keys under
// `prefix`; returns each rank's error ("" = none). NCCL_COMM_ID (a fresh loopback port) and NCCL_SOCKET_IFNAME (lo,
// unless the caller set it) are set before the threads start: NCCL reads them in ncclGetUniqueId and at init, so
// nothing listens on the machine's other addresses.
inline std::vector<std::string> run_nccl_world(int n, std::chrono::milliseconds timeout, const std::string& prefix,
                                               const std::function<void(Communicator&)>& fn) {
  ::setenv("NCCL_COMM_ID", ("127.0.0.1:" + std::to_string(free_loopback_port())).c_str(), 1);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        GlooOptions o = store_client(server.port(), r, n);
        o.timeout = timeout;
        o.prefix = prefix;
        auto comm = connect_nccl(o, r);
        fn(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      } catch (...) {
        errors[static_cast<size_t>(r)] = "a failed REQUIRE (see above)";
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

}  // namespace railyard::worker::comm::testing
