// Bounds for every HTTP listener Railyard runs (issue #40 item 6): a peer that sends an endless body, never finishes
// its headers or holds connections open must cost one bounded slot, never memory or every thread. cpp-httplib reads a
// request's body into memory before a handler sees it, so the cap must be set on the server itself.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>

namespace railyard::http {

struct ServerBounds {
  size_t max_body = 4096;                 // larger request bodies get 413 before any handler runs
  std::chrono::seconds read_timeout{5};   // per read: a peer that stops sending mid-request is dropped
  std::chrono::seconds write_timeout{5};  // per write: a peer that stops reading is dropped
  std::chrono::seconds keep_alive{1};     // idle keep-alive connections do not pin a thread
  size_t keep_alive_requests = 100;       // then the connection is closed
  size_t threads = 4;                     // requests beyond these wait in the queue
};

// For listeners that answer GETs and small POSTs: metrics, health, readiness.
inline constexpr ServerBounds kSmallRequests{};

inline void apply(httplib::Server& s, const ServerBounds& b) {
  s.set_payload_max_length(b.max_body);
  s.set_read_timeout(b.read_timeout);
  s.set_write_timeout(b.write_timeout);
  s.set_keep_alive_timeout(b.keep_alive.count());
  s.set_keep_alive_max_count(b.keep_alive_requests);
  const size_t threads = b.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
}

}  // namespace railyard::http
