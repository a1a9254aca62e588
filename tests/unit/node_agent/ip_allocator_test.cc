#include "deploy/local/node_agent/ip_allocator.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/unit/node_agent/temp_dir.h"

namespace na = railyard::node_agent;

using railyard::node_agent::testing::TempDir;

TEST_CASE("ip parse/format") {
  CHECK(na::parse_ipv4("127.16.0.1") == ((127u << 24) | (16u << 16) | 1u));
  CHECK(na::format_ipv4((127u << 24) | (31u << 16) | (255u << 8) | 254u) == "127.31.255.254");
  CHECK_FALSE(na::parse_ipv4("127.0.0"));
  CHECK_FALSE(na::parse_ipv4("127.0.0.256"));
  CHECK_FALSE(na::parse_ipv4("127.0.0.1x"));
}

TEST_CASE("ip allocator: unique loopback addresses, never 127.0.0.1, stable per owner") {
  na::IpAllocator a("");
  std::set<std::string> seen;
  for (int i = 0; i < 600; ++i) {
    std::string ip = a.allocate("pod-" + std::to_string(i));
    CHECK(ip.rfind("127.", 0) == 0);
    CHECK(ip != "127.0.0.1");
    auto parsed = na::parse_ipv4(ip);
    REQUIRE(parsed);
    CHECK((*parsed & 255) != 0);
    CHECK((*parsed & 255) != 255);
    seen.insert(ip);
  }
  CHECK(seen.size() == 600);
  CHECK(a.allocate("pod-5") == a.lookup("pod-5").value());
  CHECK(a.size() == 600);
}

TEST_CASE("ip allocator: persisted across restarts, released addresses not reused at once") {
  TempDir d("na-ip");
  std::string file = d.path + "/ips.json";
  std::string ip_a, ip_b;
  {
    na::IpAllocator a(file);
    ip_a = a.allocate("a");
    ip_b = a.allocate("b");
    a.release("b");
  }
  na::IpAllocator again(file);
  CHECK(again.lookup("a") == ip_a);
  CHECK_FALSE(again.lookup("b"));
  std::string ip_c = again.allocate("c");
  CHECK(ip_c != ip_a);
  CHECK(ip_c != ip_b);
  again.retain_only({"c"});
  CHECK_FALSE(again.lookup("a"));
  na::IpAllocator third(file);
  CHECK(third.size() == 1);
  CHECK(third.lookup("c") == ip_c);
}

TEST_CASE("ip allocator: exhaustion is a clear error; corrupt file names the file") {
  uint32_t first = *na::parse_ipv4("127.20.0.254");
  uint32_t last = *na::parse_ipv4("127.20.1.2");  // usable: .0.254, .1.1, .1.2 (skips .0.255 and .1.0)
  na::IpAllocator a("", first, last);
  std::set<std::string> got{a.allocate("1"), a.allocate("2"), a.allocate("3")};
  CHECK(got == std::set<std::string>{"127.20.0.254", "127.20.1.1", "127.20.1.2"});
  CHECK_THROWS_WITH_AS(a.allocate("4"), doctest::Contains("no free pod address"), na::IpExhausted);
  a.release("2");
  CHECK(a.allocate("4") == "127.20.1.1");

  TempDir d("na-ip");
  std::string file = d.path + "/ips.json";
  std::ofstream(file) << "{not json";
  auto load = [&] { na::IpAllocator reloaded(file); };
  CHECK_THROWS_WITH_AS(load(), doctest::Contains(file.c_str()), railyard::ConfigError);
  std::ofstream(file, std::ios::trunc) << R"({"pods": {"x": "10.0.0.1"}})";
  CHECK_THROWS_WITH_AS(load(), doctest::Contains("pods.x"), railyard::ConfigError);
}
