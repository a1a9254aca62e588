// Waiting gangs in PriorityClass order: the order itself, the priority a template gets, and a ReservingPlacement
// that books the gangs ahead before it places a job.
#include "operator/controller/gang_order.h"

#include <doctest/doctest.h>

#include "operator/scheduler/placement.h"

using namespace railyard::op;

namespace {
Json priority_class(const std::string& name, int64_t value, bool global_default = false) {
  return {{"apiVersion", "scheduling.k8s.io/v1"},
          {"kind", "PriorityClass"},
          {"metadata", {{"name", name}}},
          {"value", value},
          {"globalDefault", global_default}};
}
Json job(const std::string& name, const std::string& created, const std::string& priority_class_name = "") {
  Json j = {{"metadata", {{"name", name}, {"namespace", "ns"}, {"creationTimestamp", created}}},
            {"spec", {{"replicas", 1}, {"template", {{"spec", Json::object()}}}}}};
  if (!priority_class_name.empty()) j["spec"]["template"]["spec"]["priorityClassName"] = priority_class_name;
  return j;
}
Json cpu_node(const std::string& name) {
  return {{"metadata", {{"name", name}}},
          {"status",
           {{"allocatable", {{"cpu", "4"}, {"memory", "8Gi"}}},
            {"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
}
}  // namespace

TEST_CASE("a template's priority: its class, else the global default (the lowest if several), else 0") {
  const Json high = priority_class("high", 1000), low = priority_class("low", -5);
  const Json def_a = priority_class("default-a", 300, true), def_b = priority_class("default-b", 200, true);
  std::vector<const Json*> none, classes{&high, &low}, with_defaults{&high, &def_a, &def_b};
  CHECK(job_priority(job("a", "t", "high"), classes) == 1000);
  CHECK(job_priority(job("a", "t", "low"), classes) == -5);
  CHECK(job_priority(job("a", "t"), classes) == 0);
  CHECK(job_priority(job("a", "t", "high"), none) == 0);  // no such class: 0 (the API server refuses the pods)
  CHECK(job_priority(job("a", "t", "nope"), classes) == 0);
  CHECK(job_priority(job("a", "t"), with_defaults) == 200);  // the admission plugin's choice among defaults
  CHECK(job_priority(job("a", "t", "high"), with_defaults) == 1000);
  // Hostile or broken objects never throw and count as 0.
  const Json bad_value = {{"metadata", {{"name", "odd"}}}, {"value", "1e9"}};
  const Json huge = priority_class("huge", int64_t{1} << 40);
  std::vector<const Json*> odd{&bad_value, &huge, nullptr};
  CHECK(job_priority(job("a", "t", "odd"), odd) == 0);
  CHECK(job_priority(job("a", "t", "huge"), odd) == 0);
  CHECK(job_priority(Json::array(), odd) == 0);
  CHECK(job_priority(Json{{"spec", {{"template", 7}}}}, odd) == 0);
}

TEST_CASE("gangs go by priority, then by age, then by key") {
  const Json high = priority_class("high", 1000);
  std::vector<const Json*> classes{&high};
  const GangOrder old_low = gang_order(job("old", "2026-12-01T00:00:00Z"), classes);
  const GangOrder new_high = gang_order(job("new", "2026-12-05T00:00:00Z", "high"), classes);
  const GangOrder new_low = gang_order(job("newer", "2026-12-05T00:00:00Z"), classes);
  CHECK(new_high.priority == 1000);
  CHECK(new_high.key == "ns/new");
  CHECK(goes_before(new_high, old_low));
  CHECK_FALSE(goes_before(old_low, new_high));
  CHECK(goes_before(old_low, new_low));
  CHECK_FALSE(goes_before(new_low, old_low));
  GangOrder same = old_low;
  same.key = "ns/other";
  CHECK(goes_before(old_low, same) != goes_before(same, old_low));  // total: one of two equal-age gangs goes first
  CHECK_FALSE(goes_before(old_low, old_low));
}

TEST_CASE("only a job that could take nodes now waits") {
  Json j = job("a", "t");
  CHECK(waiting_gang(j));
  j["status"] = {{"phase", "Running"}};
  CHECK(waiting_gang(j));
  for (const char* phase : {"Succeeded", "Failed", "Suspended", "Invalid"}) {
    j["status"]["phase"] = phase;
    CHECK_FALSE(waiting_gang(j));
  }
  j["status"] = {{"conditions", Json::array({{{"type", "Invalid"}, {"status", "True"}}})}};
  CHECK_FALSE(waiting_gang(j));
  j["status"] = Json::object();
  j["spec"]["runPolicy"] = {{"suspend", true}};
  CHECK_FALSE(waiting_gang(j));
  j["spec"]["runPolicy"]["suspend"] = false;
  j["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z";
  CHECK_FALSE(waiting_gang(j));
  CHECK(waiting_gang(Json::object()));  // shape-less: not refused here (parse_job refuses it later)
  CHECK_FALSE(waiting_gang(Json{{"metadata", {{"deletionTimestamp", "x"}}}}));
}

TEST_CASE("a gang ahead that fits gets the nodes first; one that cannot fit holds nothing") {
  const auto inv = build_inventory({cpu_node("n1"), cpu_node("n2"), cpu_node("n3")}, {});
  ReservingPlacement p(std::make_unique<SimplePlacement>(), std::chrono::milliseconds(0));
  PlacementRequest low{"ns/low", 2, 0, {}, Json::array()};
  PlacementRequest high{"ns/high", 2, 0, {}, Json::array()};
  // Without anything ahead, the low-priority gang fits.
  REQUIRE(p.place(low, inv).ok);
  // With a 2-pod gang ahead on 3 one-pod-per-node nodes, 1 node is left: the 2-pod low gang waits and says why.
  low.ahead = {high};
  auto r = p.place(low, inv);
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("room held first for 1 waiting gang of higher priority (ns/high)") != std::string::npos);
  // A 1-pod gang still fits beside it.
  PlacementRequest small = low;
  small.pods = 1;
  r = p.place(small, inv);
  REQUIRE(r.ok);
  // The gang ahead took n1 and n2 (first fit); the small one gets what it left.
  CHECK(r.nodes == std::vector<std::string>{"n3"});
  // A gang ahead too big for the cluster blocks nothing.
  high.pods = 4;
  low.ahead = {high};
  CHECK(p.place(low, inv).ok);
  // Gangs ahead are booked in order: the first takes 2 nodes, the second (2 pods) no longer fits and holds nothing.
  PlacementRequest a{"ns/a", 2, 0, {}, Json::array()}, b{"ns/b", 2, 0, {}, Json::array()};
  small.ahead = {a, b};
  r = p.place(small, inv);
  REQUIRE(r.ok);
  CHECK(r.nodes == std::vector<std::string>{"n3"});
  // A job never waits for itself.
  PlacementRequest self = low;
  self.ahead = {low};
  self.ahead[0].ahead.clear();
  CHECK(p.place(self, inv).ok);
}

TEST_CASE("a gang ahead that was just placed counts once, by its reservation") {
  const auto inv = build_inventory({cpu_node("n1"), cpu_node("n2"), cpu_node("n3")}, {});
  ReservingPlacement p(std::make_unique<SimplePlacement>());  // reservations held 5 s
  PlacementRequest high{"ns/high", 2, 0, {}, Json::array()};
  REQUIRE(p.place(high, inv).ok);  // its pods are created, the cache does not show them yet
  PlacementRequest small{"ns/small", 1, 0, {}, Json::array()};
  small.ahead = {high};  // the cache still shows it waiting
  const auto r = p.place(small, inv);
  REQUIRE(r.ok);  // booked twice would leave no node
  CHECK(r.nodes == std::vector<std::string>{"n3"});
}
