// Nodes a job's replacement pods stay off for a while: the node of a pod that fell silent (restart_triggers.h
// AgentSilent). Such a node may be frozen or cut off while its Node object still says Ready (for the node lifecycle's
// grace period, 40 s by default), and a replacement placed there would never start. A hard exclusion while it lasts,
// not a preference: tried as a preference (used when nothing else fits), the real-node benchmark bound a replacement
// to a node that had just lost its kubelet and containers, because the only other node, started again seconds before,
// did not fit yet; that cost a second restart when the node turned NotReady (docs/benchmarks.md, 2026-12-07 17:14).
// Not an exclusion for good (that is railyard.dev/exclude-nodes, written by the monitor): the pod alone may have been
// frozen on a healthy node. A suspicion ends when the node's Ready condition changes after it (it went NotReady, or
// came back) or after kSuspectFor. Per job (one tenant's frozen pod never moves another's), in memory: a restarted
// operator forgets (docs/rendezvous.md "A pod that falls silent"). Thread-safe (reconciles of different jobs run in
// parallel).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "operator/api.h"

namespace railyard::op {

class SuspectNodes {
 public:
  using Time = std::chrono::system_clock::time_point;
  static constexpr std::chrono::seconds kSuspectFor{120};

  void add(const std::string& job_key, const std::string& node, Time now);
  // The job's suspect nodes now. ready_since(node): when the node's Ready condition last changed (its
  // lastTransitionTime), nullopt when unknown (the node is gone or says nothing: placement skips it anyway).
  template <typename ReadySince>
  std::set<std::string> active(const std::string& job_key, Time now, ReadySince ready_since) {
    std::lock_guard<std::mutex> l(mu_);
    std::set<std::string> out;
    auto job = by_job_.find(job_key);
    if (job == by_job_.end()) return out;
    for (auto it = job->second.begin(); it != job->second.end();) {
      const std::optional<Time> changed = ready_since(it->first);
      if (now - it->second >= kSuspectFor || (changed && *changed > it->second)) {
        it = job->second.erase(it);
      } else {
        out.insert(it->first);
        ++it;
      }
    }
    if (job->second.empty()) by_job_.erase(job);
    return out;
  }
  void forget(const std::string& job_key);

 private:
  std::mutex mu_;
  std::map<std::string, std::map<std::string, Time>> by_job_;  // job key -> node -> since
};

// A Node's Ready condition lastTransitionTime; nullopt when it has none (or not RFC 3339).
std::optional<SuspectNodes::Time> ready_transition(const Json& node);

}  // namespace railyard::op
