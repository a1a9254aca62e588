// The pure rule behind "silent" exits (operator/rendezvous/silence.h): which pod fell silent, and when nobody is
// blamed (the service's own stall, every pod quiet, a pod without a heartbeat promise, a replaced UID).
#include "operator/rendezvous/silence.h"

#include <doctest/doctest.h>

using railyard::op::silence::Clock;
using railyard::op::silence::find_silent;
using railyard::op::silence::Heard;
using std::chrono::milliseconds;

namespace {

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

Heard pod(const std::string& name, int last_ms_before, long long heartbeat_ms = 500) {
  Heard h;
  h.pod = name;
  h.uid = "uid-" + name;
  h.holder_uid = h.uid;
  h.last = t0 - milliseconds(last_ms_before);
  h.heartbeat_ms = heartbeat_ms;
  return h;
}

}  // namespace

TEST_CASE("a pod quiet past the threshold while a peer is heard is silent; not a moment before") {
  const auto after = milliseconds(4000);
  auto r = find_silent({pod("p0", 100), pod("p1", 4000)}, t0, Clock::time_point{}, after);
  REQUIRE(r.size() == 1);
  CHECK(r[0].pod == "p1");
  CHECK(r[0].uid == "uid-p1");
  CHECK(r[0].seconds == doctest::Approx(4.0));
  CHECK(r[0].heard_peer == "p0");
  CHECK(r[0].peer_seconds == doctest::Approx(0.1));
  CHECK(find_silent({pod("p0", 100), pod("p1", 3990)}, t0, Clock::time_point{}, after).empty());
  // Off.
  CHECK(find_silent({pod("p0", 100), pod("p1", 60000)}, t0, Clock::time_point{}, milliseconds(0)).empty());
}

TEST_CASE("the threshold is at least three of the pod's heartbeats") {
  // A 2 s heartbeat: 5 s of quiet is less than 3 beats (6 s).
  CHECK(find_silent({pod("p0", 100), pod("p1", 5000, 2000)}, t0, Clock::time_point{}, milliseconds(4000)).empty());
  CHECK(find_silent({pod("p0", 100), pod("p1", 6000, 2000)}, t0, Clock::time_point{}, milliseconds(4000)).size() == 1);
}

TEST_CASE("nobody is blamed when every pod is quiet, or the service itself stalled") {
  const auto after = milliseconds(4000);
  // Every pod quiet: the operator's network, not a pod. The peer must be heard within half the threshold.
  CHECK(find_silent({pod("p0", 9000), pod("p1", 9000)}, t0, Clock::time_point{}, after).empty());
  CHECK(find_silent({pod("p0", 2100), pod("p1", 9000)}, t0, Clock::time_point{}, after).empty());
  CHECK(find_silent({pod("p0", 1900), pod("p1", 9000)}, t0, Clock::time_point{}, after).size() == 1);
  // A single pod has no peer to compare with.
  CHECK(find_silent({pod("p0", 9000)}, t0, Clock::time_point{}, after).empty());
  // The service was stopped until 1 s ago (an operator paused or starved): quiet counts from then.
  CHECK(find_silent({pod("p0", 100), pod("p1", 9000)}, t0, t0 - milliseconds(1000), after).empty());
  CHECK(find_silent({pod("p0", 100), pod("p1", 9000)}, t0, t0 - milliseconds(4000), after).size() == 1);
}

TEST_CASE("a long-poll in flight is heard; no promise, an exit or a UID that lost its name is never silent") {
  const auto after = milliseconds(4000);
  Heard waiting = pod("p1", 9000);
  waiting.in_flight = 1;
  CHECK(find_silent({pod("p0", 100), waiting}, t0, Clock::time_point{}, after).empty());
  // A peer in a long-poll counts as heard.
  Heard peer = pod("p0", 8000);
  peer.in_flight = 1;
  auto r = find_silent({peer, pod("p1", 9000)}, t0, Clock::time_point{}, after);
  REQUIRE(r.size() == 1);
  CHECK(r[0].pod == "p1");
  CHECK(r[0].peer_seconds == 0.0);
  // An agent that promised nothing (an older agent) is never blamed.
  CHECK(find_silent({pod("p0", 100), pod("p1", 9000, 0)}, t0, Clock::time_point{}, after).empty());
  // Its ranks exited (a finished agent goes quiet).
  Heard done = pod("p1", 9000);
  done.exited = true;
  CHECK(find_silent({pod("p0", 100), done}, t0, Clock::time_point{}, after).empty());
  // Replaced (the name is held by another UID), or never fenceable (no UID).
  Heard replaced = pod("p1", 9000);
  replaced.holder_uid = "uid-new";
  CHECK(find_silent({pod("p0", 100), replaced}, t0, Clock::time_point{}, after).empty());
  Heard anonymous = pod("p1", 9000);
  anonymous.uid.clear();
  anonymous.holder_uid.clear();
  CHECK(find_silent({pod("p0", 100), anonymous}, t0, Clock::time_point{}, after).empty());
  // A peer whose UID lost its name proves nothing.
  Heard stale_peer = pod("p0", 100);
  stale_peer.holder_uid = "uid-other";
  CHECK(find_silent({stale_peer, pod("p1", 9000)}, t0, Clock::time_point{}, after).empty());
}

TEST_CASE("two silent pods of four are both found") {
  auto r = find_silent({pod("p0", 100), pod("p1", 5000), pod("p2", 300), pod("p3", 7000)}, t0, Clock::time_point{},
                       milliseconds(4000));
  REQUIRE(r.size() == 2);
  CHECK(r[0].pod == "p1");
  CHECK(r[1].pod == "p3");
  CHECK(r[0].heard_peer == "p0");  // the most recently heard peer
}

TEST_CASE("a survivor's lost-peer report after a pod was last heard halves its threshold; one before it does not") {
  const auto after = milliseconds(4000);
  const Clock::time_point none{};
  // p1 last heard 2.0 s ago; a survivor reported losing a peer 1.8 s ago (after p1 fell quiet): silent at after / 2.
  auto r = find_silent({pod("p0", 100), pod("p1", 2000)}, t0, none, after, t0 - milliseconds(1800));
  REQUIRE(r.size() == 1);
  CHECK(r[0].pod == "p1");
  CHECK(r[0].corroborated);
  CHECK(r[0].seconds == doctest::Approx(2.0));
  // Not a moment before the halved threshold.
  CHECK(find_silent({pod("p0", 100), pod("p1", 1990)}, t0, none, after, t0 - milliseconds(1800)).empty());
  // Without the report, the same quiet is not enough.
  CHECK(find_silent({pod("p0", 100), pod("p1", 2000)}, t0, none, after).empty());
  // The report came before p1 was last heard (a killed rank's agent goes on talking): the full threshold.
  CHECK(find_silent({pod("p0", 100), pod("p1", 2000)}, t0, none, after, t0 - milliseconds(2500)).empty());
  auto full = find_silent({pod("p0", 100), pod("p1", 4000)}, t0, none, after, t0 - milliseconds(4500));
  REQUIRE(full.size() == 1);
  CHECK_FALSE(full[0].corroborated);
  // Never below three heartbeats: a 1 s heartbeat keeps 3 s even when corroborated.
  CHECK(find_silent({pod("p0", 100), pod("p1", 2500, 1000)}, t0, none, after, t0 - milliseconds(2400)).empty());
  CHECK(find_silent({pod("p0", 100), pod("p1", 3000, 1000)}, t0, none, after, t0 - milliseconds(2400)).size() == 1);
  // The peer must still be heard within half of the (halved) threshold: every pod quiet blames nobody.
  CHECK(find_silent({pod("p0", 1100), pod("p1", 2000)}, t0, none, after, t0 - milliseconds(1800)).empty());
  // A service stall still restarts the count.
  CHECK(find_silent({pod("p0", 100), pod("p1", 2000)}, t0, t0 - milliseconds(500), after, t0 - milliseconds(1800))
            .empty());
}
