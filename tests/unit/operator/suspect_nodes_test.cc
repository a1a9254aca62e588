// The nodes a job's replacements stay off after one of its pods fell silent (operator/controller/suspect_nodes.h).
#include "operator/controller/suspect_nodes.h"

#include <doctest/doctest.h>

#include "common/kube/client.h"

using namespace railyard::op;
using std::chrono::seconds;

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
