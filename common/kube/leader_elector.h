// Leader election on a coordination.k8s.io/v1 Lease, compatible with client-go's LeaseLock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/kube/client.h"

namespace railyard::kube {

struct LeaderElectorOptions {
  std::string lease_namespace{};
  std::string lease_name{};
  std::string identity{};                           // unique per candidate (e.g. pod name + random suffix)
  std::chrono::milliseconds lease_duration{15000};  // others wait this long after the last renewal they saw
  std::chrono::milliseconds renew_deadline{10000};  // the leader gives up if it could not renew for this long
  std::chrono::milliseconds retry_period{2000};     // between attempts to acquire or renew
  bool release_on_stop = true;                      // clear holderIdentity on stop so a successor takes over at once
};

// Expiry is judged by the local time at which this candidate last saw the lease record change (like client-go),
// never by comparing clocks across machines. Callbacks run on the elector's threads and must return promptly;
// on_started_leading runs on a thread of its own while the renewals go on, so on_stopped_leading may come while it
// still runs (a leader that loses the lease during a slow start).
// After losing the lease (without stop()) the elector becomes a candidate again.
//
// A leader steps down renew_deadline after its last successful renewal even while a renew attempt hangs (a stalled
// API connection): a watchdog thread ends its leadership at that instant, so the standby's takeover (lease_duration
// after the renewal, less the margin below) never finds it still leading. Give the elector a Client of its own whose
// request timeout is short (operator/main.cc: about one retry period, no retries), so that its attempts neither wait
// behind the controller's requests and rate limiter nor outlast the deadline for long.
//
// Hand-over within one lease duration: a candidate polls every retry_period, so it sees a renewal up to one retry
// period late. It therefore takes over takeover_margin() before `lease_duration` after the renewal it saw (so no
// later than lease_duration after the renewal itself) and wakes at that instant instead of at its next poll. A
// leader that cannot renew gives up after renew_deadline, noticed at its next attempt (one retry period later),
// so the margin never exceeds lease_duration - renew_deadline - retry_period: two leaders never overlap as long as
// every replica runs with the same timing.
// How much earlier than lease_duration after a seen renewal a candidate may take the lease (see above):
// min(retry_period, lease_duration - renew_deadline - retry_period), and never below zero.
std::chrono::milliseconds takeover_margin(const LeaderElectorOptions& opts);

// The namespace of this pod's ServiceAccount when running in a cluster; "" elsewhere. The default namespace of a
// component's Lease (and of what else it keeps next to itself).
std::string in_cluster_namespace();

// The leader election's own client configuration, derived from the component's: its own connections and rate limit
// (never queued behind the component's other requests), at most one quick retry, and timeouts of about one retry
// period per attempt, so a stalled API connection costs an attempt about one retry period, not a regular request's
// 30 s with retries.
Config lease_client_config(Config base, std::chrono::milliseconds retry_period);

class LeaderElector {
 public:
  LeaderElector(Client& client, LeaderElectorOptions opts);
  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  void on_started_leading(std::function<void()> fn);
  void on_stopped_leading(std::function<void()> fn);
  void on_new_leader(std::function<void(const std::string& identity)> fn);

  void start();
  void stop();  // releases the lease if leading and release_on_stop; calls on_stopped_leading
  bool is_leader() const { return leader_.load(); }
  std::string observed_leader();

  // One acquire-or-renew attempt (what the loop does every retry_period). Public for tests.
  bool try_acquire_or_renew();

 private:
  void run();
  void release();
  // Ends leadership once (whichever of the renew loop and the watchdog comes first) and calls on_stopped_leading.
  void step_down(const char* why);
  void watch_renewals();  // the watchdog, while leading
  bool sleep_interruptible(std::chrono::milliseconds d);

  Client& client_;
  LeaderElectorOptions opts_;
  std::function<void()> started_fn_, stopped_fn_;
  std::function<void(const std::string&)> new_leader_fn_;
  std::atomic<bool> leader_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::string observed_record_;  // holder + renewTime + rv last seen
  std::string observed_holder_;
  std::chrono::steady_clock::time_point observed_time_{};
  std::chrono::steady_clock::time_point expires_{};     // when the holder's lease counts as expired (candidate only)
  std::chrono::steady_clock::time_point last_renew_{};  // while leading: the last successful renewal (under mu_)
  bool watching_ = false;                               // the watchdog runs (under mu_)
  std::thread thread_;
};

}  // namespace railyard::kube
