// The nodes a job's replacements stay off after one of its pods fell silent (operator/controller/suspect_nodes.h).
#include "operator/controller/suspect_nodes.h"

#include <doctest/doctest.h>

#include "common/kube/client.h"

using namespace railyard::op;
using std::chrono::seconds;

namespace {
Json ready_node(const std::string& name) {
  return {{"metadata", {{"name", name}}},
          {"status",
           {{"allocatable", {{"cpu", "8"}}}, {"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
}
}  // namespace

TEST_CASE("a silent pod's node is kept off until its Ready condition changes or the suspicion expires, per job") {
  SuspectNodes s;
  const auto t0 = std::chrono::system_clock::now();
  std::map<std::string, std::optional<SuspectNodes::Time>> changed = {{"n1", t0 - seconds(3600)}, {"n2", std::nullopt}};
  auto ready_since = [&](const std::string& n) { return changed.count(n) ? changed[n] : std::nullopt; };
  s.add("a/job", "n1", t0);
  s.add("a/job", "n2", t0);
  CHECK(s.active("a/job", t0 + seconds(1), ready_since) == std::set<std::string>{"n1", "n2"});
  // Another tenant's job is not moved by it.
  CHECK(s.active("b/job", t0 + seconds(1), ready_since).empty());
  // n1 went NotReady (or came back Ready) after the suspicion: the node lifecycle speaks for it now.
  changed["n1"] = t0 + seconds(5);
  CHECK(s.active("a/job", t0 + seconds(6), ready_since) == std::set<std::string>{"n2"});
  // A pod frozen on a healthy node: the node is free again after kSuspectFor.
  CHECK(s.active("a/job", t0 + SuspectNodes::kSuspectFor - seconds(1), ready_since) == std::set<std::string>{"n2"});
  CHECK(s.active("a/job", t0 + SuspectNodes::kSuspectFor, ready_since).empty());
  s.add("a/job", "n2", t0);
  s.forget("a/job");
  CHECK(s.active("a/job", t0, ready_since).empty());
}

TEST_CASE("a Node's Ready lastTransitionTime, and nothing from a node that says nothing usable") {
  const Json node = {{"status",
                      {{"conditions",
                        {{{"type", "MemoryPressure"}, {"lastTransitionTime", "2026-12-01T00:00:00Z"}},
                         {{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", "2026-12-07T03:00:00Z"}}}}}}};
  auto t = ready_transition(node);
  REQUIRE(t);
  CHECK(*t == railyard::kube::parse_rfc3339("2026-12-07T03:00:00Z"));
  CHECK_FALSE(ready_transition(Json::object()));
  CHECK_FALSE(ready_transition(Json{{"status", {{"conditions", "x"}}}}));
  CHECK_FALSE(ready_transition(Json{{"status", {{"conditions", {{{"type", "Ready"}, {"lastTransitionTime", 5}}}}}}}));
  CHECK_FALSE(
      ready_transition(Json{{"status", {{"conditions", {{{"type", "Ready"}, {"lastTransitionTime", "soon"}}}}}}}));
}

TEST_CASE("suspect nodes are avoided while the gang fits elsewhere, and used when nothing else fits") {
  // One pod of a job per node (SimplePlacement), three Ready nodes.
  const auto inv = build_inventory({ready_node("n1"), ready_node("n2"), ready_node("n3")}, {});
  SimplePlacement simple;
  int calls = 0;
  const auto place = [&](const PlacementRequest& req) {
    ++calls;
    return simple.place(req, inv);
  };
  PlacementRequest req{"ns/a", 2, 0, {}, Json::array()};
  // Two pods, n1 suspect: n2 and n3, in one attempt.
  auto r = place_preferring_others({"n1"}, req, place);
  REQUIRE(r.result.ok);
  CHECK(r.result.nodes == std::vector<std::string>{"n2", "n3"});
  CHECK(r.suspects_used.empty());
  CHECK(calls == 1);
  // n1 and n2 suspect: only n3 is beyond suspicion, so the gang goes on the suspects too (first fit: n1, n2).
  calls = 0;
  r = place_preferring_others({"n1", "n2"}, req, place);
  REQUIRE(r.result.ok);
  CHECK(r.result.nodes == std::vector<std::string>{"n1", "n2"});
  CHECK(r.suspects_used == std::vector<std::string>{"n1", "n2"});
  CHECK(calls == 2);
  // The job's own exclusions (excludeFailedNodes, the monitor's railyard.dev/exclude-nodes) stay hard: with n3
  // excluded and n1, n2 suspect, the fallback uses the suspects only.
  req.excluded_nodes = {"n3"};
  r = place_preferring_others({"n1", "n2"}, req, place);
  REQUIRE(r.result.ok);
  CHECK(r.result.nodes == std::vector<std::string>{"n1", "n2"});
  // Excluded and suspect: never used.
  req.excluded_nodes = {"n1", "n3"};
  calls = 0;
  r = place_preferring_others({"n1"}, req, place);
  CHECK_FALSE(r.result.ok);
  CHECK(calls == 1);  // nothing to relax
  CHECK(r.suspects_used.empty());
  // Does not fit even with the suspects: the answer says why, as without any suspicion.
  req.excluded_nodes = {};
  req.pods = 4;
  r = place_preferring_others({"n1"}, req, place);
  CHECK_FALSE(r.result.ok);
  CHECK(r.result.message.find("do not fit") != std::string::npos);
  CHECK(r.suspects_used.empty());
}
