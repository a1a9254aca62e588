// The restart request contract (common/restart_request.h): what the monitor writes, the operator reads back.
#include "common/restart_request.h"

#include <doctest/doctest.h>

#include <set>
#include <string>

using namespace railyard;

TEST_CASE("restart request: every field survives format and parse") {
  RestartRequest r;
  r.reason = "Straggler";
  r.rule = "straggler";
  r.node = "gpu-3";
  r.evidence = "rank 2 takes 3.1x the median step time, \"quoted\", é";
  r.detector = "monitor";
  r.source = "alertmanager";
  r.time = "2026-11-28T03:00:05Z";
  r.onset = "2026-11-28T03:00:00Z";
  r.rank = 2;
  r.generation = 7;
  const std::string s = format_restart_request(r);
  CHECK(s == format_restart_request(r));  // stable: the monitor compares values to find its own request
  auto back = parse_restart_request(s);
  REQUIRE(back);
  CHECK(back->reason == r.reason);
  CHECK(back->rule == r.rule);
  CHECK(back->node == r.node);
  CHECK(back->evidence == r.evidence);
  CHECK(back->detector == r.detector);
  CHECK(back->source == r.source);
  CHECK(back->time == r.time);
  CHECK(back->onset == r.onset);
  CHECK(back->rank == 2);
  REQUIRE(back->generation);
  CHECK(*back->generation == 7);
  CHECK(format_restart_request(*back) == s);

  // Unset onset and generation are left out, and come back unset.
  RestartRequest bare;
  const nlohmann::json j = nlohmann::json::parse(format_restart_request(bare));
  CHECK_FALSE(j.contains("onset"));
  CHECK_FALSE(j.contains("generation"));
  CHECK(j["rank"] == -1);
  back = parse_restart_request(format_restart_request(bare));
  REQUIRE(back);
  CHECK_FALSE(back->generation);
  CHECK(back->onset.empty());
}

TEST_CASE("restart request: hand-written values") {
  CHECK_FALSE(parse_restart_request("now"));
  CHECK_FALSE(parse_restart_request(""));
  CHECK_FALSE(parse_restart_request("[1,2]"));
  CHECK_FALSE(parse_restart_request("\"text\""));
  // An object with fields of the wrong type keeps its defaults: it still requests a restart, with no details.
  auto r = parse_restart_request(R"({"rank":"2","node":3,"generation":"1","reason":"Hang"})");
  REQUIRE(r);
  CHECK(r->rank == -1);
  CHECK(r->node.empty());
  CHECK_FALSE(r->generation);
  CHECK(r->reason == "Hang");
  CHECK(r->detector.empty());  // not claimed for the monitor
  CHECK(std::string(kRestartRequestAnnotation) == "railyard.dev/restart-request");
  CHECK(std::string(kRestartHandledAnnotation) == "railyard.dev/restart-handled");
  CHECK(std::string(kRestartDetectorAnnotation) == "railyard.dev/restart-detector");
  CHECK(std::string(kExcludeNodesAnnotation) == "railyard.dev/exclude-nodes");
}

TEST_CASE("restart request: a rank or generation out of range blames no rank and names no generation") {
  // A wrapped rank would blame (and with excludeFailedNodes, exclude the node of) an innocent rank.
  for (const char* rank : {"4294967298", "-2", "-4294967295", "18446744073709551615", "2147483648"}) {
    INFO(rank);
    auto r = parse_restart_request(std::string(R"({"reason":"Hang","rank":)") + rank + "}");
    REQUIRE(r);
    CHECK(r->rank == -1);
  }
  auto ok = parse_restart_request(R"({"rank":2147483647,"generation":9223372036854775807})");
  REQUIRE(ok);
  CHECK(ok->rank == 2147483647);
  CHECK(ok->generation == 9223372036854775807LL);
  auto big = parse_restart_request(R"({"generation":18446744073709551615})");
  REQUIRE(big);
  CHECK_FALSE(big->generation);
}

TEST_CASE("exclude-nodes list: what the monitor writes is what the operator reads") {
  CHECK(add_to_node_list("", "a") == "a");
  CHECK(add_to_node_list("a,b", "a") == "a,b");
  CHECK(add_to_node_list("a,,b", "c") == "a,b,c");
  CHECK(add_to_node_list(" b , a", "") == "b,a");  // order kept, blanks dropped, no empty name added
  CHECK(parse_node_list(" n1 ,n2,,n1, ") == std::set<std::string>{"n1", "n2"});
  // Round trip: every name added is read back, once.
  std::string list;
  for (const char* n : {"node-b", "node-a", "node-b", "node-c"}) list = add_to_node_list(list, n);
  CHECK(list == "node-b,node-a,node-c");
  CHECK(parse_node_list(list) == std::set<std::string>{"node-a", "node-b", "node-c"});
}
