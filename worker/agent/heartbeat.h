// A beat at a fixed period on a thread of its own, whatever the agent's main loop is doing (waiting for its workers
// to stop, fetching peer copies, starting processes). The agent beats with a status poll: the service then hears the
// pod at least every period for as long as the agent runs, and a silence means the pod (or its node, or its network)
// is gone or frozen, never that the agent was busy (docs/rendezvous.md "A pod that falls silent").
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace railyard::worker {

class Heartbeat {
 public:
  // Calls beat() now and then every `period` (measured from the end of the previous beat, so a slow beat never
  // piles up) until destroyed. beat() must not throw; it runs on the heartbeat's thread.
  Heartbeat(std::chrono::milliseconds period, std::function<void()> beat);
  ~Heartbeat();  // stops and joins; a beat in progress finishes first
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void loop();

  const std::chrono::milliseconds period_;
  const std::function<void()> beat_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace railyard::worker
