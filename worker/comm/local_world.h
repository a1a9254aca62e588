// A world of N ranks inside one process, each a thread with its own Gloo communicator over real TCP sockets on
// loopback: for tests of anything built on Communicator, and for `railyard-worker train --nproc` style development.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "worker/comm/communicator.h"

namespace railyard::worker::comm {

struct LocalWorldOptions {
  std::chrono::milliseconds timeout{20000};  // deadline of every collective and of the rendezvous
  std::string host = "127.0.0.1";
  std::string name = "world";
};

// Runs fn(comm) on ranks 0..n-1 concurrently and returns when all are done. If any rank throws, its communicator is
// aborted (so the others fail fast instead of waiting out the deadline) and, after every thread has finished, the
// first exception thrown is rethrown. fn tells ranks apart by comm.rank().
void run_local_world(int n, const std::function<void(Communicator&)>& fn, const LocalWorldOptions& options = {});

}  // namespace railyard::worker::comm
