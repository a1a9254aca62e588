#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "tests/unit/worker_comm/comm_test_util.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/tcp_store.h"

using namespace railyard::worker::comm;
using std::chrono::milliseconds;

namespace {
std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE("set, get and wait across two clients; a waiting get returns once another client sets the key") {
  TcpStoreServer server("127.0.0.1", 0);
  REQUIRE(server.port() > 0);
  TcpStore a("127.0.0.1", server.port(), "g0", milliseconds(5000));
  TcpStore b("127.0.0.1", server.port(), "g0", milliseconds(5000));
  a.set("x", bytes("hello"));
  CHECK(text(b.get("x")) == "hello");
  CHECK(b.check({"x"}));
  CHECK_FALSE(b.check({"x", "y"}));

  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    a.set("late", bytes(std::string(100000, 'z')));  // larger than one TCP segment
  });
  auto t0 = std::chrono::steady_clock::now();
  auto v = b.get("late");
  setter.join();
  CHECK(v.size() == 100000);
  CHECK(v[99999] == 'z');
  CHECK(since(t0) >= 90);
  CHECK(a.add("counter", 3) == 3);
  CHECK(b.add("counter", -1) == 2);
  CHECK(server.key_count() == 3);
}

TEST_CASE("generations are isolated by prefix") {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore g0("127.0.0.1", server.port(), "g0", milliseconds(300));
  TcpStore g1("127.0.0.1", server.port(), "g1", milliseconds(300));
  g0.set("0", bytes("old address"));
  CHECK_FALSE(g1.check({"0"}));
  CHECK_THROWS_AS(g1.get("0"), CommTimeout);
}

TEST_CASE("wait throws CommTimeout naming the missing key within the timeout") {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore s("127.0.0.1", server.port(), "g7", milliseconds(5000));
  s.set("present", bytes("1"));
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    s.wait({"present", "absent"}, milliseconds(400));
  } catch (const CommTimeout& e) {
    msg = e.what();
  }
  double took = since(t0);
  CHECK(msg.find("absent") != std::string::npos);
  CHECK(msg.find("g7") != std::string::npos);
  CHECK(msg.find("present") == std::string::npos);
  CHECK(took >= 390);
  CHECK(took < 1500);
}

TEST_CASE("connecting to a port nobody serves fails with the address after the timeout") {
  const int port = testing::free_store_port();
  auto t0 = std::chrono::steady_clock::now();
  try {
    TcpStore s("127.0.0.1", port, "g0", milliseconds(300));
    FAIL("connected to a closed port");
  } catch (const CommTimeout& e) {
    CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  }
  CHECK(since(t0) < 1500);
}

TEST_CASE("a client whose server went away gets a CommError, not a hang") {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStore s("127.0.0.1", server->port(), "g0", milliseconds(2000));
  s.set("a", bytes("1"));
  server.reset();
  CHECK_THROWS_AS(s.set("b", bytes("2")), CommError);
}

TEST_CASE("a second server on a taken port names the port") {
  TcpStoreServer first("127.0.0.1", 0);
  try {
    TcpStoreServer second("127.0.0.1", first.port());
    FAIL("bound twice");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find(std::to_string(first.port())) != std::string::npos);
  }
}

TEST_CASE("a server retries a taken port while the previous owner exits") {
  auto first = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  const int port = first->port();
  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(200));
    first.reset();
  });
  auto t0 = std::chrono::steady_clock::now();
  TcpStoreServer second("127.0.0.1", port, milliseconds(5000));
  release.join();
  CHECK(second.port() == port);
  CHECK(since(t0) >= 150);
  TcpStore client("127.0.0.1", port, "g1", milliseconds(1000));
  client.set("k", bytes("v"));
  CHECK(text(client.get("k")) == "v");
}

// One request on a fresh raw connection (the wire format of tcp_store.h); returns every byte the server sent before
// closing or before `limit` bytes.
std::string raw_request(int port, uint8_t op, const std::string& key, size_t limit = 64) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string msg(1, static_cast<char>(op));
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) msg.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  u32(static_cast<uint32_t>(key.size()));
  msg += key;
  u32(0);
  REQUIRE(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(msg.size()));
  std::string got;
  char buf[256];
  ssize_t n;
  while (got.size() < limit && (n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return got;
}

TEST_CASE("a store with a token serves only clients that present it, and never says it") {
  const std::string token = "5f0c4e8a1b2d3c4e5f60718293a4b5c6d7e8f90112233445566778899aabbccdd";
  TcpStoreServer server("127.0.0.1", 0, milliseconds(0), token);

  TcpStore good("127.0.0.1", server.port(), "g0", milliseconds(2000), token);
  good.set("rank0/addr", bytes("10.0.0.1:4242"));
  CHECK(text(good.get("rank0/addr")) == "10.0.0.1:4242");
  TcpStore good2("127.0.0.1", server.port(), "g0", milliseconds(2000), token);
  CHECK(text(good2.get("rank0/addr")) == "10.0.0.1:4242");
  CHECK(server.refused_count() == 0);

  auto refused_without_token = [&](const std::string& what) {
    CHECK(what.find("refused") != std::string::npos);
    CHECK(what.find("RAILYARD_STORE_TOKEN") != std::string::npos);
    CHECK(what.find("127.0.0.1:" + std::to_string(server.port())) != std::string::npos);
    CHECK(what.find(token) == std::string::npos);
    CHECK(what.find(token.substr(0, 8)) == std::string::npos);
  };
  // No token: the connection is accepted, the first request is refused and nothing reaches the store.
  {
    TcpStore none("127.0.0.1", server.port(), "g0", milliseconds(2000));
    std::string what;
    try {
      none.set("rank0/addr", bytes("6.6.6.6:1"));
    } catch (const CommError& e) {
      what = e.what();
    }
    refused_without_token(what);
    CHECK_THROWS_AS(none.check({"rank0/addr"}), CommError);  // the connection stays closed
  }
  CHECK(text(good.get("rank0/addr")) == "10.0.0.1:4242");
  CHECK(server.key_count() == 1);

  // A wrong token (same length, last character changed) and a prefix of the right one: refused when connecting.
  for (const std::string& wrong : {token.substr(0, token.size() - 1) + "e", token.substr(0, 32), std::string("x")}) {
    std::string what;
    try {
      TcpStore bad("127.0.0.1", server.port(), "g0", milliseconds(2000), wrong);
      FAIL("a wrong token was accepted");
    } catch (const CommError& e) {
      what = e.what();
    }
    refused_without_token(what);
    CHECK(what.find(wrong) == std::string::npos);
  }

  // On the wire: a get without authenticating gets status 2 with no value, then the connection ends.
  CHECK(raw_request(server.port(), 2, "g0/rank0/addr") == std::string("\x02\x00\x00\x00\x00", 5));
  // The auth request with the right token is answered ok.
  CHECK(raw_request(server.port(), 5, token, 5) == std::string("\x01\x00\x00\x00\x00", 5));
  CHECK(server.refused_count() == 5);
  CHECK(server.key_count() == 1);

  // A store without a token serves a client that presents one (a rank with RAILYARD_STORE_TOKEN set and an open
  // store) and one that does not.
  TcpStoreServer open_server("127.0.0.1", 0);
  TcpStore with("127.0.0.1", open_server.port(), "g0", milliseconds(2000), token);
  TcpStore without("127.0.0.1", open_server.port(), "g0", milliseconds(2000));
  with.set("k", bytes("v"));
  CHECK(text(without.get("k")) == "v");
}

TEST_CASE("connect_gloo: ranks with the store token connect, a rank with another token is refused") {
  const int port = testing::free_store_port();
  auto options = [&](int rank, const std::string& token) {
    GlooOptions o = testing::gloo_options(port, rank, 2, milliseconds(5000), "g1");
    o.store_token = token;
    return o;
  };
  float x[2] = {0, 0};
  std::string stranger_error;
  std::thread rank1([&] {
    // A stranger with another token is refused while rank 0 serves; then the real rank 1 joins.
    try {
      auto o = options(1, "not-the-token");
      o.timeout = milliseconds(3000);
      connect_gloo(o);
    } catch (const CommError& e) {
      stranger_error = e.what();
    }
    auto c = connect_gloo(options(1, "the-token"));
    x[1] = 2;
    c->all_reduce(&x[1], 1, DType::kFloat32, ReduceOp::kSum);
  });
  auto c = connect_gloo(options(0, "the-token"));
  x[0] = 1;
  c->all_reduce(&x[0], 1, DType::kFloat32, ReduceOp::kSum);
  rank1.join();
  CHECK(x[0] == 3);
  CHECK(x[1] == 3);
  CHECK(stranger_error.find("refused") != std::string::npos);
  CHECK(stranger_error.find("the-token") == std::string::npos);
}

TEST_CASE("gloo_options_from_env names the variable at fault") {
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("RANK", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.5", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("RAILYARD_GENERATION", "3", 1);
  ::unsetenv("RAILYARD_POD_IP");
  ::unsetenv("RAILYARD_COMM_TIMEOUT_MS");
  auto o = gloo_options_from_env();
  CHECK(o.size == 4);
  CHECK(o.rank == 2);
  CHECK(o.store_host == "127.0.0.5");
  CHECK(o.store_port == 29500);
  CHECK(o.prefix == "g3");
  CHECK(o.bind_host == "127.0.0.1");
  CHECK(o.timeout == milliseconds(30000));
  CHECK(o.store_token.empty());
  ::setenv("RAILYARD_STORE_TOKEN", "abc123", 1);
  CHECK(gloo_options_from_env().store_token == "abc123");
  ::unsetenv("RAILYARD_STORE_TOKEN");

  ::setenv("RANK", "4", 1);
  CHECK_THROWS_WITH_AS(gloo_options_from_env(), doctest::Contains("RANK='4'"), railyard::ConfigError);
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_PORT", "http", 1);
  CHECK_THROWS_WITH_AS(gloo_options_from_env(), doctest::Contains("MASTER_PORT"), railyard::ConfigError);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  CHECK_THROWS_WITH_AS(gloo_options_from_env(), doctest::Contains("RAILYARD_POD_IP"), railyard::ConfigError);
  ::setenv("RAILYARD_POD_IP", "10.0.0.2", 1);
  ::setenv("RAILYARD_COMM_TIMEOUT_MS", "1500", 1);
  o = gloo_options_from_env();
  CHECK(o.bind_host == "10.0.0.2");
  CHECK(o.timeout == milliseconds(1500));
  ::unsetenv("MASTER_ADDR");
  CHECK_THROWS_WITH_AS(gloo_options_from_env(), doctest::Contains("MASTER_ADDR"), railyard::ConfigError);
  ::unsetenv("WORLD_SIZE");
  CHECK_THROWS_WITH_AS(gloo_options_from_env(), doctest::Contains("WORLD_SIZE"), railyard::ConfigError);
}

TEST_CASE("connect_gloo: bad options name the field") {
  GlooOptions o;
  o.store_port = 1234;
  o.size = 2;
  o.rank = 2;
  CHECK_THROWS_WITH_AS(connect_gloo(o), doctest::Contains("GlooOptions.rank"), std::invalid_argument);
  o.rank = 0;
  o.store_port = 0;
  CHECK_THROWS_WITH_AS(connect_gloo(o), doctest::Contains("store_port"), std::invalid_argument);
}

TEST_CASE("connect_gloo with rank 0 serving the store on a fixed port, as under the agent") {
  const int port = testing::free_store_port();
  std::vector<float> got(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      auto c = connect_gloo(testing::gloo_options(port, r, 2, milliseconds(10000)));
      float x = static_cast<float>(r + 1);
      c->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
      got[static_cast<size_t>(r)] = x;
      c->barrier();
    });
  }
  for (auto& t : ts) t.join();
  CHECK(got[0] == 3.0f);
  CHECK(got[1] == 3.0f);
}
