#include "common/kube/event_recorder.h"

#include <cstdio>

#include "common/log.h"

namespace railyard::kube {

EventRecorder::EventRecorder(Client& client, EventRecorderOptions opts) : client_(client), opts_(std::move(opts)) {
  if (opts_.component.empty()) throw ConfigError("event recorder: component must be set (e.g. railyard-operator)");
}

Json EventRecorder::record(const Json& obj, const std::string& type, const std::string& reason,
                           const std::string& message) {
  const std::string name = name_of(obj);
  if (name.empty()) {
    log::warn("kube.events", "cannot record an event about an object without metadata.name", {{"reason", reason}});
    return Json();
  }
  std::string ns = namespace_of(obj);
  const std::string event_ns = ns.empty() ? "default" : ns;  // events about cluster-scoped objects
  const Json& meta = obj["metadata"];
  Json involved = {{"apiVersion", obj.value("apiVersion", "")}, {"kind", obj.value("kind", "")}, {"name", name}};
  if (!ns.empty()) involved["namespace"] = ns;
  if (meta.contains("uid")) involved["uid"] = meta["uid"];
  if (meta.contains("resourceVersion")) involved["resourceVersion"] = meta["resourceVersion"];
  const std::string uid = meta.value("uid", "");
  const std::string agg_key = involved["kind"].get<std::string>() + "|" + ns + "|" + name + "|" + uid + "|" + type +
                              "|" + reason + "|" + message;
  const auto now_steady = std::chrono::steady_clock::now();
  const std::string now = format_rfc3339(std::chrono::system_clock::now());

  std::lock_guard<std::mutex> lock(mu_);
  // Drop entries past the window so the map stays small in a long-running process.
  for (auto it = seen_.begin(); it != seen_.end();) {
    it = now_steady - it->second.last > opts_.aggregate_window ? seen_.erase(it) : std::next(it);
  }
  try {
    auto it = seen_.find(agg_key);
    if (it != seen_.end()) {
      Json patch = {{"count", it->second.count + 1}, {"lastTimestamp", now}};
      try {
        Json out = client_.patch(resources::events, it->second.ns, it->second.name, patch, PatchType::Merge);
        it->second.count += 1;
        it->second.last = now_steady;
        return out;
      } catch (const NotFound&) {
        seen_.erase(it);  // the Event expired on the server: start a new one
      }
    }
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), ".%llx",
                  static_cast<unsigned long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                      std::chrono::system_clock::now().time_since_epoch())
                                                      .count()));
    Json ev = {{"apiVersion", "v1"},
               {"kind", "Event"},
               {"metadata", {{"name", name + suffix}, {"namespace", event_ns}}},
               {"involvedObject", involved},
               {"type", type},
               {"reason", reason},
               {"message", message},
               {"source", {{"component", opts_.component}}},
               {"reportingComponent", opts_.component},
               {"reportingInstance", opts_.host.empty() ? opts_.component : opts_.host},
               {"firstTimestamp", now},
               {"lastTimestamp", now},
               {"count", 1}};
    if (!opts_.host.empty()) ev["source"]["host"] = opts_.host;
    Json out = client_.create(resources::events, event_ns, ev);
    seen_[agg_key] = Seen{event_ns, name_of(out), 1, now_steady};
    return out;
  } catch (const std::exception& e) {
    log::warn("kube.events", "could not record event",
              {{"object", key_of(obj)}, {"reason", reason}, {"error", e.what()}});
    return Json();
  }
}

}  // namespace railyard::kube
