#include "worker/comm/local_world.h"

#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "worker/comm/gloo_communicator.h"
#include "worker/comm/tcp_store.h"

namespace railyard::worker::comm {

void run_local_world(int n, const std::function<void(Communicator&)>& fn, const LocalWorldOptions& options) {
  if (n < 1) throw std::invalid_argument("run_local_world: n = " + std::to_string(n) + ", must be >= 1");
  // Port 0: parallel test processes never collide on a fixed port.
  TcpStoreServer server(options.host, 0);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm;
      try {
        GlooOptions o;
        o.store_host = options.host;
        o.store_port = server.port();
        o.rank = r;
        o.size = n;
        o.bind_host = options.host;
        o.timeout = options.timeout;
        o.prefix = "local";
        o.serve_store = false;
        o.name = options.name;
        comm = connect_gloo(o);
        fn(*comm);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        if (comm) comm->abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace railyard::worker::comm
