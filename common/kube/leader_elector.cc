#include "common/kube/leader_elector.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/log.h"

namespace railyard::kube {

std::string in_cluster_namespace() {
  const char* path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
  if (access(path, R_OK) != 0) return "";
  try {
    std::string ns = read_file(path);
    while (!ns.empty() && (ns.back() == '\n' || ns.back() == ' ')) ns.pop_back();
    return ns;
  } catch (const std::exception&) {
    return "";
  }
}

Config lease_client_config(Config c, std::chrono::milliseconds retry_period) {
  c.qps = 20;
  c.burst = 20;
  c.max_connections = 2;
  // One quick retry for a lost response or a 5xx; the watchdog bounds the whole attempt anyway.
  c.retry.max_attempts = 2;
  const auto attempt = std::chrono::seconds(
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(std::chrono::duration<double>(retry_period).count()))));
  c.request_timeout = attempt;
  c.connect_timeout = attempt;
  c.retry.max_total = attempt;
  return c;
}

std::chrono::milliseconds takeover_margin(const LeaderElectorOptions& o) {
  return std::clamp(o.lease_duration - o.renew_deadline - o.retry_period, std::chrono::milliseconds(0), o.retry_period);
}

LeaderElector::LeaderElector(Client& client, LeaderElectorOptions opts) : client_(client), opts_(std::move(opts)) {
  if (opts_.lease_name.empty() || opts_.lease_namespace.empty() || opts_.identity.empty()) {
    throw ConfigError("leader election: lease_namespace, lease_name and identity must all be set");
  }
  if (opts_.renew_deadline >= opts_.lease_duration || opts_.retry_period >= opts_.renew_deadline) {
    throw ConfigError("leader election: need retry_period < renew_deadline < lease_duration (got " +
                      std::to_string(opts_.retry_period.count()) + " ms, " +
                      std::to_string(opts_.renew_deadline.count()) + " ms, " +
                      std::to_string(opts_.lease_duration.count()) + " ms)");
  }
}

LeaderElector::~LeaderElector() { stop(); }

void LeaderElector::on_started_leading(std::function<void()> fn) { started_fn_ = std::move(fn); }
void LeaderElector::on_stopped_leading(std::function<void()> fn) { stopped_fn_ = std::move(fn); }
void LeaderElector::on_new_leader(std::function<void(const std::string&)> fn) { new_leader_fn_ = std::move(fn); }

std::string LeaderElector::observed_leader() {
  std::lock_guard<std::mutex> lock(mu_);
  return observed_holder_;
}

void LeaderElector::start() {
  if (thread_.joinable()) throw Error("leader election " + opts_.lease_name + ": start() called twice");
  thread_ = std::thread([this] { run(); });
}

void LeaderElector::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool LeaderElector::sleep_interruptible(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

bool LeaderElector::try_acquire_or_renew() {
  const auto now = std::chrono::system_clock::now();
  const std::string now_s = format_rfc3339_micro(now);
  const int64_t duration_s =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(opts_.lease_duration.count()) / 1000.0)));
  // After this candidate's own create or update of the lease: it holds the record it wrote, seen now.
  auto wrote = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    observed_record_ = opts_.identity + "|" + now_s;
    observed_holder_ = opts_.identity;
    observed_time_ = std::chrono::steady_clock::now();
    return true;
  };
  try {
    std::optional<Json> lease = client_.try_get(resources::leases, opts_.lease_namespace, opts_.lease_name);
    if (!lease) {
      Json obj = {{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata", {{"name", opts_.lease_name}, {"namespace", opts_.lease_namespace}}},
                  {"spec",
                   {{"holderIdentity", opts_.identity},
                    {"leaseDurationSeconds", duration_s},
                    {"acquireTime", now_s},
                    {"renewTime", now_s},
                    {"leaseTransitions", 0}}}};
      client_.create(resources::leases, opts_.lease_namespace, obj);
      return wrote();
    }
    Json spec = lease->value("spec", Json::object());
    std::string holder = spec.value("holderIdentity", "");
    std::string renew = spec.value("renewTime", "");
    int64_t their_duration = spec.value("leaseDurationSeconds", duration_s);
    std::string record = holder + "|" + renew;
    bool expired;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (record != observed_record_) {
        observed_record_ = record;
        observed_time_ = std::chrono::steady_clock::now();
      }
      observed_holder_ = holder;
      expires_ = observed_time_ + std::chrono::seconds(their_duration) - takeover_margin(opts_);
      expired = std::chrono::steady_clock::now() >= expires_;
    }
    if (!holder.empty() && holder != opts_.identity && !expired) return false;

    Json nspec = spec;
    nspec["holderIdentity"] = opts_.identity;
    nspec["leaseDurationSeconds"] = duration_s;
    nspec["renewTime"] = now_s;
    if (holder != opts_.identity) {
      nspec["acquireTime"] = now_s;
      nspec["leaseTransitions"] = spec.value("leaseTransitions", 0) + (holder.empty() && renew.empty() ? 0 : 1);
    }
    Json updated = *lease;
    updated["spec"] = nspec;  // metadata.resourceVersion stays: a concurrent writer makes this a Conflict
    client_.update(resources::leases, opts_.lease_namespace, updated);
    return wrote();
  } catch (const Conflict&) {
    return false;  // someone else wrote first; look again next round
  } catch (const std::exception& e) {
    log::warn("kube.leader", "lease update failed",
              {{"lease", opts_.lease_namespace + "/" + opts_.lease_name}, {"error", e.what()}});
    return false;
  }
}

void LeaderElector::release() {
  try {
    Json lease = client_.get(resources::leases, opts_.lease_namespace, opts_.lease_name);
    if (lease["spec"].value("holderIdentity", "") != opts_.identity) return;
    lease["spec"]["holderIdentity"] = "";
    lease["spec"]["leaseDurationSeconds"] = 1;
    lease["spec"]["renewTime"] = format_rfc3339_micro(std::chrono::system_clock::now());
    client_.update(resources::leases, opts_.lease_namespace, lease);
  } catch (const std::exception& e) {
    log::warn("kube.leader", "could not release the lease; others take over after it expires",
              {{"lease", opts_.lease_namespace + "/" + opts_.lease_name}, {"error", e.what()}});
  }
}

void LeaderElector::step_down(const char* why) {
  bool was = true;
  if (!leader_.compare_exchange_strong(was, false)) return;
  log::warn("kube.leader", std::string("lost leadership: ") + why,
            {{"identity", opts_.identity}, {"lease", opts_.lease_name}});
  if (stopped_fn_) stopped_fn_();
}

void LeaderElector::watch_renewals() {
  std::unique_lock<std::mutex> lock(mu_);
  while (watching_ && !stopping_) {
    const auto deadline = last_renew_ + opts_.renew_deadline;
    if (std::chrono::steady_clock::now() >= deadline) {
      lock.unlock();
      step_down("no renewal within the renew deadline (a renew attempt may still hang)");
      return;
    }
    cv_.wait_until(lock, deadline);
  }
}

void LeaderElector::run() {
  std::string last_leader;
  auto report_leader = [&] {
    std::string l = observed_leader();
    if (l != last_leader) {
      last_leader = l;
      if (new_leader_fn_ && !l.empty()) new_leader_fn_(l);
    }
  };
  while (true) {
    bool got = try_acquire_or_renew();
    report_leader();
    if (got) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_renew_ = std::chrono::steady_clock::now();
        watching_ = true;
      }
      leader_.store(true);
      log::info("kube.leader", "became leader", {{"identity", opts_.identity}, {"lease", opts_.lease_name}});
      std::thread watchdog([this] { watch_renewals(); });
      // Renewals go on while the leader starts up (as in client-go, which runs OnStartedLeading in a goroutine): a slow
      // start must neither let the lease lapse nor be mistaken for a stall by the watchdog.
      std::thread starter;
      if (started_fn_) starter = std::thread([this] { started_fn_(); });
      bool stopped = false;
      while (leader_.load()) {
        if (!sleep_interruptible(opts_.retry_period)) {
          stopped = true;
          break;
        }
        if (!leader_.load()) break;  // the watchdog stepped down
        const bool renewed = try_acquire_or_renew();
        if (!leader_.load()) break;  // stepped down while the attempt hung: its result no longer counts
        std::unique_lock<std::mutex> lock(mu_);
        if (renewed) {
          last_renew_ = std::chrono::steady_clock::now();
        } else if (std::chrono::steady_clock::now() - last_renew_ > opts_.renew_deadline) {
          lock.unlock();
          step_down("could not renew within the renew deadline");
          break;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        watching_ = false;
      }
      cv_.notify_all();
      watchdog.join();
      if (starter.joinable()) starter.join();
      if (stopped) {
        if (leader_.exchange(false)) {
          if (opts_.release_on_stop) release();
          if (stopped_fn_) stopped_fn_();
        }
        return;
      }
      continue;
    }
    // Poll every retry period, but be there the moment the holder's lease runs out.
    auto wait = opts_.retry_period;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto until = std::chrono::ceil<std::chrono::milliseconds>(expires_ - std::chrono::steady_clock::now());
      if (until.count() >= 0 && until < wait) wait = until + std::chrono::milliseconds(1);
    }
    if (!sleep_interruptible(wait)) return;
  }
}

}  // namespace railyard::kube
