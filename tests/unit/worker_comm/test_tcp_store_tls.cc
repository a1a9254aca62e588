// The bootstrap store over TLS with the job's identity (worker/comm/tcp_store.h, common/tls/job_identity.h): real
// sockets on 127.0.0.1, and a recording forwarder between client and server to show what crosses the network.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/tls/channel.h"
#include "common/tls/job_identity.h"
#include "tests/recording_proxy.h"
#include "tests/unit/worker_comm/comm_test_util.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/tcp_store.h"

using namespace railyard::worker::comm;
using railyard::test::RecordingProxy;
using std::chrono::milliseconds;
namespace tls = railyard::tls;

namespace {

const std::string kToken = "5f0c4e8a1b2d3c4e5f60718293a4b5c6d7e8f90112233445566778899aabbccdd";
const std::string kValue = "10.9.8.7:4242-the-pair-address-of-rank-0";

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

// One job's CA and two pods' identities under it (what two agents would issue themselves).
struct Job {
  tls::CertKey ca;
  StoreTls server, client;
  explicit Job(const std::string& name) : ca(tls::make_job_ca("ns1", name)) {
    server = std::make_shared<const tls::PodIdentity>(tls::issue_pod_identity(ca, {"127.0.0.1"}));
    client = std::make_shared<const tls::PodIdentity>(tls::issue_pod_identity(ca, {"127.0.0.1"}));
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

int connected_socket(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

}  // namespace

TEST_CASE("over TLS the job's ranks use the store, and neither the token nor a value crosses in cleartext") {
  Job job("a");
  TcpStoreServer server("127.0.0.1", 0, milliseconds(0), kToken, job.server);
  RecordingProxy wire(server.port());
  {
    TcpStore rank1("127.0.0.1", wire.port(), "g0", milliseconds(3000), kToken, job.client);
    TcpStore rank2("127.0.0.1", wire.port(), "g0", milliseconds(3000), kToken, job.server);
    rank1.set("rank0/addr", bytes(kValue));
    CHECK(text(rank2.get("rank0/addr")) == kValue);
    CHECK(rank2.add("count", 5) == 5);
  }
  CHECK(server.refused_count() == 0);
  CHECK(wire.capture().size() > 1000);  // the handshakes and the records went through the forwarder
  CHECK_FALSE(wire.saw(kToken));
  CHECK_FALSE(wire.saw(kToken.substr(0, 16)));
  CHECK_FALSE(wire.saw(kValue));
  CHECK_FALSE(wire.saw("g0/rank0/addr"));

  // The same exchange without TLS: the forwarder sees both (so the capture above would have caught them).
  TcpStoreServer plain("127.0.0.1", 0, milliseconds(0), kToken);
  RecordingProxy plain_wire(plain.port());
  {
    TcpStore rank1("127.0.0.1", plain_wire.port(), "g0", milliseconds(3000), kToken);
    rank1.set("rank0/addr", bytes(kValue));
  }
  CHECK(plain_wire.saw(kToken));
  CHECK(plain_wire.saw(kValue));
}

TEST_CASE("a TLS store refuses a client without TLS, one of another job, and a TLS client without a certificate") {
  Job job("a"), other("b");
  TcpStoreServer server("127.0.0.1", 0, milliseconds(0), kToken, job.server);
  TcpStore good("127.0.0.1", server.port(), "g0", milliseconds(3000), kToken, job.client);
  good.set("rank0/addr", bytes(kValue));

  // Another job's identity, with the right token even: the handshake fails, no request is read.
  const std::string foreign =
      error_of([&] { TcpStore c("127.0.0.1", server.port(), "g0", milliseconds(3000), kToken, other.client); });
  CHECK(foreign.find("TLS handshake") != std::string::npos);
  CHECK(foreign.find(tls::kPeerCertEnv) != std::string::npos);
  CHECK(foreign.find(kToken) == std::string::npos);

  // Trusting this job's CA but holding another job's certificate: the server refuses it in the handshake.
  auto forged = std::make_shared<const tls::PodIdentity>(tls::PodIdentity{job.ca.cert_pem, other.client->leaf});
  CHECK(error_of([&] { TcpStore c("127.0.0.1", server.port(), "g0", milliseconds(3000), kToken, forged); }) != "");

  // Plain TCP: what it sends is no TLS handshake; the server closes without reading a request.
  const std::string plain = error_of([&] { TcpStore c("127.0.0.1", server.port(), "g0", milliseconds(3000), kToken); });
  CHECK(plain.find("went away") != std::string::npos);

  // TLS trusting the job's CA, but with no certificate of its own: the server ends the connection after the
  // handshake, and the auth request gets no answer.
  {
    tls::SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
    SSL_CTX_set_cert_store(ctx.get(), tls::new_store(job.ca.cert_pem, "job CA"));
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    int fd = connected_socket(server.port());
    std::string why;
    auto ch = tls::Channel::connect(fd, ctx.get(), &why);
    if (ch) {
      std::string msg =
          std::string("\x05", 1) + std::string("\x00\x00\x00\x00", 4) + std::string("\x00\x00\x00\x00", 4);
      ch->write_all(msg.data(), msg.size());
      char head[5];
      CHECK_FALSE(ch->read_all(head, 5));
    }
    ch.reset();
    ::close(fd);
  }
  CHECK(server.key_count() == 1);
  // The server counts a refusal when its side of the handshake ends, which may come after the client gave up.
  for (int i = 0; i < 200 && server.refused_count() < 4; ++i) std::this_thread::sleep_for(milliseconds(10));
  CHECK(server.refused_count() == 4);

  // A client of the job does not talk to a server of another job (it would hand it the token) or a plain one.
  TcpStoreServer stranger("127.0.0.1", 0, milliseconds(0), "", other.server);
  CHECK(error_of([&] {
          TcpStore c("127.0.0.1", stranger.port(), "g0", milliseconds(3000), kToken, job.client);
        }).find("TLS handshake") != std::string::npos);
  CHECK(stranger.key_count() == 0);
  TcpStoreServer open("127.0.0.1", 0);
  CHECK(error_of([&] {
          TcpStore c("127.0.0.1", open.port(), "g0", milliseconds(3000), kToken, job.client);
        }).find("TLS handshake") != std::string::npos);
}

TEST_CASE("connect_gloo over a TLS store; the identity comes from RAILYARD_PEER_TLS_*, malformed ones are named") {
  Job job("a");
  const int port = testing::free_store_port();
  auto options = [&](int rank) {
    GlooOptions o = testing::gloo_options(port, rank, 2, milliseconds(5000), "g1");
    o.store_token = kToken;
    o.store_tls = rank == 0 ? job.server : job.client;
    return o;
  };
  float x[2] = {1, 2};
  std::thread rank1([&] { connect_gloo(options(1))->all_reduce(&x[1], 1, DType::kFloat32, ReduceOp::kSum); });
  connect_gloo(options(0))->all_reduce(&x[0], 1, DType::kFloat32, ReduceOp::kSum);
  rank1.join();
  CHECK(x[0] == 3);
  CHECK(x[1] == 3);

  ::unsetenv(tls::kPeerCaEnv);
  ::unsetenv(tls::kPeerCertEnv);
  ::unsetenv(tls::kPeerKeyEnv);
  CHECK(tls::pod_identity_from_env() == nullptr);
  ::setenv(tls::kPeerCaEnv, job.ca.cert_pem.c_str(), 1);
  ::setenv(tls::kPeerCertEnv, job.client->leaf.cert_pem.c_str(), 1);
  CHECK_THROWS_WITH_AS(tls::pod_identity_from_env(), doctest::Contains("only some are set"), railyard::ConfigError);
  ::setenv(tls::kPeerKeyEnv, job.client->leaf.key_pem.c_str(), 1);
  auto id = tls::pod_identity_from_env();
  REQUIRE(id != nullptr);
  CHECK(id->leaf.cert_pem == job.client->leaf.cert_pem);
  ::setenv(tls::kPeerCertEnv, "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n", 1);
  CHECK_THROWS_WITH_AS(tls::pod_identity_from_env(), doctest::Contains(tls::kPeerCertEnv), railyard::ConfigError);
  Job other("b");
  ::setenv(tls::kPeerCertEnv, other.client->leaf.cert_pem.c_str(),
           1);  // another job's leaf: not the CA's, nor the key's
  CHECK_THROWS_WITH_AS(tls::pod_identity_from_env(), doctest::Contains("is not signed by RAILYARD_PEER_TLS_CA"),
                       railyard::ConfigError);
  ::unsetenv(tls::kPeerCaEnv);
  ::unsetenv(tls::kPeerCertEnv);
  ::unsetenv(tls::kPeerKeyEnv);
}

namespace {
size_t thread_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}
int raw_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}
}  // namespace

TEST_CASE("bounded: a connection that never shows its token is closed at the deadline; finished ones hold no thread") {
  TcpStoreServer server("127.0.0.1", 0, milliseconds(0), kToken);
  server.set_unauthenticated_deadline(milliseconds(500));
  // Connects and says nothing: closed by the server, not by our 10 s receive timeout.
  int fd = raw_connect(server.port());
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[8];
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(::recv(fd, buf, sizeof buf, 0) <= 0);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  ::close(fd);
  // 200 connections come and go: their threads are reaped, not kept until the server ends.
  const size_t before = thread_count();
  for (int i = 0; i < 200; ++i) ::close(raw_connect(server.port()));
  std::this_thread::sleep_for(milliseconds(1200));  // each is closed at the deadline at the latest
  ::close(raw_connect(server.port()));              // an accept reaps what has finished
  std::this_thread::sleep_for(milliseconds(200));
  CHECK(thread_count() < before + 20);
  // An authenticated client may idle past the deadline and is still served.
  TcpStore client("127.0.0.1", server.port(), "gen1", milliseconds(5000), kToken);
  client.set("k", {'v'});
  std::this_thread::sleep_for(milliseconds(800));
  CHECK(client.get("k") == std::vector<char>{'v'});
}
