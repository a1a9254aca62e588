#include "worker/agent/heartbeat.h"

namespace railyard::worker {

Heartbeat::Heartbeat(std::chrono::milliseconds period, std::function<void()> beat)
    : period_(period), beat_(std::move(beat)), thread_([this] { loop(); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    l.unlock();
    beat_();
    l.lock();
    cv_.wait_for(l, period_, [this] { return stop_; });
  }
}

}  // namespace railyard::worker
