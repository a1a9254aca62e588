// Who may speak for a job: a target's series count for job J and rank R only when the target's pod (from its
// metadata) is in J's world and R is one of that pod's ranks; the world comes from the TrainingJob.
#include "monitor/attribution.h"

#include <doctest/doctest.h>

using namespace railyard::monitor;
using nlohmann::json;

namespace {

Sample sample(const std::string& name, const std::string& ns, const std::string& job, const std::string& pod,
              const std::string& rank, const std::string& instance, double value = 1) {
  Sample s;
  s.name = name;
  s.labels = {{"namespace", ns}, {"trainingjob", job}, {"pod", pod}, {"instance", instance}, {"node", "n-" + pod}};
  if (!rank.empty()) s.labels["rank"] = rank;
  s.value = value;
  return s;
}

// The world world_of would read from status.world.pods ["v-worker-0", "v-worker-1"] with procsPerReplica 2.
const std::map<JobKey, JobWorld> kWorlds = {
    {{"b", "v"}, world_of(json::parse(R"({"metadata":{"name":"v"},"spec":{"procsPerReplica":2},
                              "status":{"world":{"pods":["v-worker-0","v-worker-1"]}}})"))}};

}  // namespace

TEST_CASE("world_of: status.world.pods in rank order, else the replicas' pod names; procs per pod from the spec") {
  json job = json::parse(R"({"metadata":{"name":"v","namespace":"b"},"spec":{"replicas":3,"procsPerReplica":4},
                             "status":{"world":{"pods":["v-worker-2","v-worker-0"]}}})");
  JobWorld w = world_of(job);
  CHECK(w.pods == std::vector<std::string>{"v-worker-2", "v-worker-0"});
  CHECK(w.procs_per_pod == 4);
  // The world's order decides the ranks, not the replica index: after a shrink v-worker-2 runs ranks 0..3.
  CHECK(w.ranks_of("v-worker-2") == std::make_pair(0, 4));
  CHECK(w.ranks_of("v-worker-0") == std::make_pair(4, 8));
  CHECK_FALSE(w.ranks_of("v-worker-1").has_value());
  // The same answers without the index (a world built by hand).
  JobWorld by_hand{w.pods, w.procs_per_pod, {}};
  CHECK(by_hand.ranks_of("v-worker-0") == std::make_pair(4, 8));
  CHECK_FALSE(by_hand.ranks_of("v-worker-1").has_value());
  job["status"].erase("world");
  w = world_of(job);
  CHECK(w.pods == std::vector<std::string>{"v-worker-0", "v-worker-1", "v-worker-2"});
  job["spec"].erase("procsPerReplica");
  CHECK(world_of(job).procs_per_pod == 1);
}

TEST_CASE("a pod speaks only for its own ranks of its own job") {
  Attributor a;
  auto r = a.attribute(
      {
          sample("railyard_worker_step", "b", "v", "v-worker-0", "0", "10.0.0.1:9400"),
          sample("railyard_worker_step", "b", "v", "v-worker-0", "1", "10.0.0.1:9401"),
          sample("railyard_worker_step", "b", "v", "v-worker-1", "3", "10.0.0.2:9401"),
          // v-worker-0 claims rank 2, which is v-worker-1's.
          sample("railyard_worker_nonfinite_total", "b", "v", "v-worker-0", "2", "10.0.0.1:9400"),
          // A pod of namespace b that is not in v's world (any tenant of b can label a pod railyard.dev/job=v).
          sample("railyard_worker_nonfinite_total", "b", "v", "intruder", "0", "10.0.0.9:9400"),
          // No pod label: a target registered without the pod's metadata.
          sample("railyard_worker_nonfinite_total", "b", "v", "", "0", "10.0.0.9:9400"),
          // No rank.
          sample("railyard_worker_step", "b", "v", "v-worker-1", "", "10.0.0.2:9400"),
          // Namespace a's pod: its target says namespace a, so it speaks for a/v at most, which is not watched here.
          sample("railyard_worker_nonfinite_total", "a", "v", "v-worker-0", "0", "10.1.0.1:9400"),
          // Not a worker target at all (the operator's series): ignored, not counted.
          Sample{"railyard_operator_restarts_total", {{"namespace", "b"}}, 1},
      },
      kWorlds);
  REQUIRE(r.kept.size() == 3);
  CHECK(r.kept[0].label("rank") == "0");
  CHECK(r.kept[1].label("rank") == "1");
  CHECK(r.kept[2].label("rank") == "3");
  for (const auto& s : r.kept) CHECK(s.name == "railyard_worker_step");
  CHECK(r.rejected == 4);
  REQUIRE_FALSE(r.notes.empty());
  CHECK(r.notes[0].find("rank 2 is not one of the pod's ranks [0, 2)") != std::string::npos);
}

TEST_CASE("up without a rank gets the rank its target last served; unknown targets blame no one") {
  Attributor a;
  // First round: the target serves rank 1 and is up; its `up` (no rank: not a target label) is listed first.
  auto r = a.attribute({sample("up", "b", "v", "v-worker-0", "", "10.0.0.1:9401", 1),
                        sample("railyard_worker_step", "b", "v", "v-worker-0", "1", "10.0.0.1:9401")},
                       kWorlds);
  REQUIRE(r.kept.size() == 2);
  CHECK(r.kept[1].name == "up");
  CHECK(r.kept[1].label("rank") == "1");
  // Next round it is down: no series, its `up` is 0 and still names rank 1.
  r = a.attribute({sample("up", "b", "v", "v-worker-0", "", "10.0.0.1:9401", 0),
                   sample("up", "b", "v", "v-worker-1", "", "10.0.0.2:9400", 0)},
                  kWorlds);
  REQUIRE(r.kept.size() == 1);
  CHECK(r.kept[0].label("rank") == "1");
  CHECK(r.kept[0].value == 0);
  // An `up` that carries a rank (a file-SD target list may set it) is checked like any series.
  r = a.attribute({sample("up", "b", "v", "v-worker-1", "0", "10.0.0.2:9400", 0)}, kWorlds);
  CHECK(r.kept.empty());
  CHECK(r.rejected == 1);
  // The job is gone: its targets are forgotten.
  a.attribute({}, {});
  r = a.attribute({sample("up", "b", "v", "v-worker-0", "", "10.0.0.1:9401", 0)}, kWorlds);
  CHECK(r.kept.empty());
}
