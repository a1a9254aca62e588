// Records core/v1 Events about objects, aggregating repeats (same object, type, reason, message) into a count.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "common/kube/client.h"

namespace railyard::kube {

struct EventRecorderOptions {
  std::string component{};                     // source.component, e.g. "railyard-operator"
  std::string host{};                          // source.host, optional
  std::chrono::seconds aggregate_window{600};  // a repeat within this window bumps count instead of a new Event
};

// Best effort: failures are logged, never thrown (an event must not break a reconcile).
class EventRecorder {
 public:
  EventRecorder(Client& client, EventRecorderOptions opts);

  // `obj` needs apiVersion, kind, metadata.name (and namespace/uid where it has them). Returns the stored Event,
  // or null if it could not be recorded.
  Json record(const Json& obj, const std::string& type, const std::string& reason, const std::string& message);
  Json normal(const Json& obj, const std::string& reason, const std::string& message) {
    return record(obj, "Normal", reason, message);
  }
  Json warning(const Json& obj, const std::string& reason, const std::string& message) {
    return record(obj, "Warning", reason, message);
  }

 private:
  struct Seen {
    std::string ns, name;
    int count = 0;
    std::chrono::steady_clock::time_point last;
  };
  Client& client_;
  EventRecorderOptions opts_;
  std::mutex mu_;
  std::map<std::string, Seen> seen_;
};

}  // namespace railyard::kube
