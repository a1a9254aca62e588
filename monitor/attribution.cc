#include "monitor/attribution.h"

#include <set>

#include "common/metrics/job_labels.h"

namespace railyard::monitor {
namespace {

bool parse_rank(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoi(s);
  return true;
}

}  // namespace

std::optional<std::pair<int, int>> JobWorld::ranks_of(const std::string& pod) const {
  if (!index.empty()) {
    auto it = index.find(pod);
    if (it == index.end()) return std::nullopt;
    return std::make_pair(it->second * procs_per_pod, (it->second + 1) * procs_per_pod);
  }
  for (size_t i = 0; i < pods.size(); ++i)
    if (pods[i] == pod)
      return std::make_pair(static_cast<int>(i) * procs_per_pod, static_cast<int>(i + 1) * procs_per_pod);
  return std::nullopt;
}

JobWorld world_of(const nlohmann::json& job) {
  JobWorld w;
  const auto spec = job.value("spec", nlohmann::json::object());
  if (spec.contains("procsPerReplica") && spec["procsPerReplica"].is_number_integer())
    w.procs_per_pod = std::max(1, spec["procsPerReplica"].get<int>());
  const auto status = job.value("status", nlohmann::json::object());
  if (status.is_object() && status.contains("world") && status["world"].is_object() &&
      status["world"].contains("pods") && status["world"]["pods"].is_array())
    for (const auto& p : status["world"]["pods"])
      if (p.is_string()) w.pods.push_back(p.get<std::string>());
  if (w.pods.empty()) {
    int replicas = 1;
    if (spec.contains("replicas") && spec["replicas"].is_number_integer()) replicas = spec["replicas"].get<int>();
    const std::string name = job.value("metadata", nlohmann::json::object()).value("name", std::string());
    for (int i = 0; i < replicas; ++i) w.pods.push_back(name + "-worker-" + std::to_string(i));
  }
  // The first position of a name wins, as in the linear search (a world lists each pod once).
  for (size_t i = 0; i < w.pods.size(); ++i) w.index.emplace(w.pods[i], static_cast<int>(i));
  return w;
}

Attributor::Result Attributor::attribute(const std::vector<Sample>& samples, const std::map<JobKey, JobWorld>& worlds) {
  Result out;
  std::set<std::string> noted;
  auto reject = [&](const Sample& s, const std::string& why) {
    ++out.rejected;
    std::string who = s.label(metrics::kNamespaceLabel) + "/" + s.label(kPodLabel) + " (" + s.label("instance") + ")";
    if (out.notes.size() < 8 && noted.insert(who).second) out.notes.push_back(who + ": " + why);
  };
  // Worker series first, so that `up` finds the rank its target serves in this very round.
  for (int pass = 0; pass < 2; ++pass) {
    for (const Sample& s : samples) {
      if ((s.name == "up") != (pass == 1)) continue;
      const std::string ns = s.label(metrics::kNamespaceLabel), job = s.label(metrics::kTrainingJobLabel);
      if (job.empty()) continue;  // not a worker's series (a control-plane target)
      auto w = worlds.find({ns, job});
      if (w == worlds.end()) continue;  // no such job here (another namespace, or one this monitor does not watch)
      const std::string pod = s.label(kPodLabel);
      auto range = w->second.ranks_of(pod);
      if (!range) {
        reject(s, pod.empty() ? "no pod label on the target" : "pod not in the world of " + ns + "/" + job);
        continue;
      }
      const std::string book = ns + "/" + job + "/" + pod + "@" + s.label("instance");
      int rank = -1;
      Sample kept = s;
      if (!parse_rank(s.label("rank"), &rank)) {
        auto known = instance_rank_.find(book);
        if (s.name != "up" || known == instance_rank_.end()) {
          if (s.name != "up") reject(s, "no integer rank label");
          continue;
        }
        rank = known->second;
        kept.labels["rank"] = std::to_string(rank);
      }
      if (rank < range->first || rank >= range->second) {
        reject(s, "rank " + std::to_string(rank) + " is not one of the pod's ranks [" + std::to_string(range->first) +
                      ", " + std::to_string(range->second) + ")");
        continue;
      }
      if (s.name != "up") instance_rank_[book] = rank;
      out.kept.push_back(std::move(kept));
    }
  }
  // Forget the targets of jobs that are gone, so that the book stays as large as the jobs watched.
  for (auto it = instance_rank_.begin(); it != instance_rank_.end();) {
    bool live = false;
    for (const auto& [key, world] : worlds)
      if (it->first.rfind(key.ns + "/" + key.name + "/", 0) == 0) live = true;
    it = live ? std::next(it) : instance_rank_.erase(it);
  }
  return out;
}

}  // namespace railyard::monitor
