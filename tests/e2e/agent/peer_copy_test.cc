// The peer copy of the in-memory checkpoint tier (worker/agent/peer_copy.h) over real sockets on 127.0.0.1: a full
// copy arrives bitwise and is fetched back, a torn or damaged copy is rejected (the holder keeps its other copy), a
// wrong token or another job is refused, the sender thread follows a worker's puts, and over TLS (the job's own CA)
// neither the token nor the bytes cross in cleartext and another job's agents are refused in the handshake.
#include "worker/agent/peer_copy.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "checkpoint/peer_held.h"
#include "checkpoint/shm_store.h"
#include "common/tls/channel.h"
#include "common/tls/job_identity.h"
#include "tests/recording_proxy.h"

using railyard::ckpt::LoadTarget;
using railyard::ckpt::ShmStore;
using railyard::ckpt::TensorShard;
namespace peer = railyard::worker::peer;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kToken(64, 'k');
const peer::Auth kAuth{"ns1/job1", kToken, nullptr};

std::string unique_prefix(const char* what) { return "/railyard-peertest-" + std::to_string(::getpid()) + "-" + what; }

struct Cleanup {
  std::vector<std::string> prefixes;
  ~Cleanup() {
    for (const auto& p : prefixes) ShmStore::remove_prefix(p);
  }
};

// A rank's state: one tensor of n floats, all derived from `seed`.
std::vector<float> state_for(int64_t seed, size_t n) {
  std::vector<float> v(n);
  std::mt19937 g(static_cast<uint32_t>(seed));
  for (auto& x : v) x = static_cast<float>(g()) / 4294967296.0f;
  return v;
}

void put_step(ShmStore& slot, int64_t step, const std::vector<float>& data) {
  TensorShard s;
  s.name = "w";
  s.dtype = railyard::ckpt::DType::F32;
  s.global_shape = {static_cast<int64_t>(data.size())};
  s.box = {{0}, {static_cast<int64_t>(data.size())}};
  s.data = data.data();
  slot.put(step, {s}, {{"step", step}});
}

// The step and contents of a slot, read with the full CRC32C check (nullopt: unusable).
std::optional<int64_t> read_slot(const std::string& name, std::vector<float>* out, size_t n) {
  out->assign(n, 0.0f);
  LoadTarget t{"w", railyard::ckpt::DType::F32, {{0}, {static_cast<int64_t>(n)}}, out->data()};
  std::string why;
  auto st = ShmStore(name).get({t}, nullptr, &why);
  if (!st) MESSAGE(why);
  return st;
}

std::string addr(const peer::PeerServer& s) { return "127.0.0.1:" + std::to_string(s.port()); }

// A connected TCP socket to 127.0.0.1:port.
int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// A raw HTTP PUT that announces `announced` bytes, sends `body` and closes: a sender that died mid-copy.
void raw_put(int port, int rank, const std::string& body, size_t announced) {
  int fd = connect_to(port);
  std::string req = "PUT /v1/peer/" + std::to_string(rank) + " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                    kToken + "\r\nX-Railyard-Job: ns1/job1\r\nContent-Type: application/octet-stream\r\n" +
                    "Content-Length: " + std::to_string(announced) + "\r\nConnection: close\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < req.size()) {
    ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  ::close(fd);
}

std::string image_bytes(const std::string& name) {
  auto img = ShmStore(name).map_image();
  REQUIRE(img);
  return std::string(reinterpret_cast<const char*>(img->data()), img->size());
}

template <class F>
bool eventually(F f, double seconds = 10) {
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

}  // namespace

TEST_CASE("a full copy arrives bitwise, the holder keeps the two newest, and a replacement fetches them back") {
  Cleanup c;
  const std::string src = unique_prefix("src"), holder = unique_prefix("holder"), dest = unique_prefix("dest");
  c.prefixes = {src, holder, dest};
  const size_t n = 3 << 20;  // 12 MiB of floats: many socket reads, not one
  peer::PeerServer server("127.0.0.1", 0, kAuth, holder);
  CHECK(server.port() > 0);

  ShmStore a(src + "-r3-a"), b(src + "-r3-b");
  put_step(a, 7, state_for(7, n));
  auto r = peer::send_slot(addr(server), kAuth, 3, a.name());
  CHECK(r.step == 7);
  CHECK(r.bytes > n * sizeof(float));
  MESSAGE("copy of a " << r.bytes / 1e6 << " MB slot over 127.0.0.1: " << r.seconds * 1e3 << " ms");
  CHECK(peer::held_steps(addr(server), kAuth, 3) == std::vector<int64_t>{7, -1});
  // The copy is the worker's snapshot byte for byte and passes the full checksum.
  CHECK(image_bytes(peer::copy_name(holder, 3, 0)) == image_bytes(a.name()));
  std::vector<float> got;
  REQUIRE(read_slot(peer::copy_name(holder, 3, 0), &got, n) == 7);
  CHECK(got == state_for(7, n));

  put_step(b, 8, state_for(8, n));
  peer::send_slot(addr(server), kAuth, 3, b.name());
  CHECK(peer::held_steps(addr(server), kAuth, 3) == std::vector<int64_t>{7, 8});
  put_step(a, 9, state_for(9, n));
  peer::send_slot(addr(server), kAuth, 3, a.name());
  CHECK(peer::held_steps(addr(server), kAuth, 3) == std::vector<int64_t>{9, 8});    // 7, the older, was overwritten
  CHECK(peer::held_steps(addr(server), kAuth, 4) == std::vector<int64_t>{-1, -1});  // another rank: nothing
  // A step sent again replaces its own copy: the holder keeps two different steps.
  peer::send_slot(addr(server), kAuth, 3, a.name());
  CHECK(peer::held_steps(addr(server), kAuth, 3) == std::vector<int64_t>{9, 8});

  // A replacement pod's agent fetches both copies into its own worker slots.
  std::string why;
  auto t0 = Clock::now();
  auto steps = peer::fetch(addr(server), kAuth, 3, dest + "-r3", &why);
  const double fetch_s = std::chrono::duration<double>(Clock::now() - t0).count();
  MESSAGE("fetch of two copies: " << fetch_s * 1e3 << " ms");
  CHECK(steps == std::vector<int64_t>{9, 8});
  REQUIRE(read_slot(dest + "-r3-a", &got, n) == 9);
  CHECK(got == state_for(9, n));
  REQUIRE(read_slot(dest + "-r3-b", &got, n) == 8);
  CHECK(got == state_for(8, n));
  CHECK(peer::fetch(addr(server), kAuth, 4, dest + "-r4", &why).empty());
  CHECK(why.find("empty or torn") != std::string::npos);
}

TEST_CASE("a copy from a superseded generation is refused and the holder keeps its current copies") {
  // issue #40 item 2: the old container of a pod whose kubelet died still runs its agent for a while; its sender must
  // not replace the new generation's copy with its stale slot.
  Cleanup c;
  const std::string src = unique_prefix("gsrc"), holder = unique_prefix("gholder");
  c.prefixes = {src, holder};
  const size_t n = 1024;
  auto gen = [](int64_t g) {
    peer::Auth a = kAuth;
    a.generation = std::make_shared<std::atomic<int64_t>>(g);
    return a;
  };
  const peer::Auth holder_auth = gen(3);
  peer::PeerServer server("127.0.0.1", 0, holder_auth, holder);
  ShmStore a(src + "-r1-a"), b(src + "-r1-b");
  put_step(a, 40, state_for(40, n));
  put_step(b, 41, state_for(41, n));
  peer::send_slot(addr(server), gen(3), 1, a.name());
  peer::send_slot(addr(server), gen(3), 1, b.name());
  REQUIRE(peer::held_steps(addr(server), kAuth, 1) == std::vector<int64_t>{40, 41});

  ShmStore stale(src + "-stale-r1-a");
  put_step(stale, 99, state_for(99, n));  // a newer step number than either copy: only the generation tells
  for (const auto& who : {gen(2), gen(1), kAuth /* no generation at all */}) {
    try {
      peer::send_slot(addr(server), who, 1, stale.name());
      FAIL("a superseded generation's copy was accepted");
    } catch (const peer::PeerError& e) {
      CHECK(std::string(e.what()).find("409") != std::string::npos);
      CHECK(std::string(e.what()).find("generation 3") != std::string::npos);
    }
  }
  CHECK(peer::held_steps(addr(server), kAuth, 1) == std::vector<int64_t>{40, 41});
  std::vector<float> got;
  REQUIRE(read_slot(peer::copy_name(holder, 1, 0), &got, n) == 40);
  CHECK(got == state_for(40, n));

  // The same generation and a newer one (a sender whose agent joined the next generation first) are accepted; the
  // holder moving on to generation 4 fences generation 3.
  put_step(a, 42, state_for(42, n));
  CHECK(peer::send_slot(addr(server), gen(4), 1, a.name()).step == 42);
  holder_auth.generation->store(4);
  CHECK_THROWS_AS(peer::send_slot(addr(server), gen(3), 1, b.name()), peer::PeerError);
  CHECK(peer::held_steps(addr(server), kAuth, 1) == std::vector<int64_t>{42, 41});
}

TEST_CASE("a torn or damaged copy is rejected and the holder keeps its newer copy") {
  Cleanup c;
  const std::string src = unique_prefix("src2"), holder = unique_prefix("holder2"), dest = unique_prefix("dest2");
  c.prefixes = {src, holder, dest};
  const size_t n = 1 << 20;
  peer::PeerServer server("127.0.0.1", 0, kAuth, holder);
  ShmStore a(src + "-r0-a"), b(src + "-r0-b");
  put_step(a, 10, state_for(10, n));
  put_step(b, 11, state_for(11, n));
  peer::send_slot(addr(server), kAuth, 0, a.name());
  peer::send_slot(addr(server), kAuth, 0, b.name());
  REQUIRE(peer::held_steps(addr(server), kAuth, 0) == std::vector<int64_t>{10, 11});

  // A sender that dies halfway: the older copy (10) is torn, 11 is kept, nothing reads the torn one as valid.
  put_step(a, 12, state_for(12, n));
  const std::string img = image_bytes(a.name());
  raw_put(server.port(), 0, img.substr(0, img.size() / 2), img.size());
  CHECK(eventually([&] { return peer::held_steps(addr(server), kAuth, 0) == std::vector<int64_t>{-1, 11}; }));
  std::string why;
  CHECK_FALSE(ShmStore(peer::copy_name(holder, 0, 0)).peek(&why));
  CHECK(why.find("torn") != std::string::npos);
  std::vector<float> got;
  REQUIRE(read_slot(peer::copy_name(holder, 0, 1), &got, n) == 11);
  CHECK(got == state_for(11, n));

  // One flipped byte in the data: the whole copy arrives but fails the CRC32C check: rejected with 422.
  std::string bad = img;
  bad[bad.size() - 100] ^= 0x01;
  {
    httplib::Client cli("127.0.0.1", server.port());
    auto res = cli.Put("/v1/peer/0", {{"Authorization", "Bearer " + kToken}, {"X-Railyard-Job", "ns1/job1"}}, bad,
                       "application/octet-stream");
    REQUIRE(res);
    CHECK(res->status == 422);
    CHECK(res->body.find("CRC32C mismatch") != std::string::npos);
  }
  CHECK(peer::held_steps(addr(server), kAuth, 0) == std::vector<int64_t>{-1, 11});
  // A header damaged in flight (its step changed): refused by the header checksum.
  std::string bad_header = img;
  bad_header[40] ^= 0x01;
  {
    httplib::Client cli("127.0.0.1", server.port());
    auto res = cli.Put("/v1/peer/0", {{"Authorization", "Bearer " + kToken}, {"X-Railyard-Job", "ns1/job1"}},
                       bad_header, "application/octet-stream");
    REQUIRE(res);
    CHECK(res->status == 422);
  }

  // A fetch gets only the good copy; the torn one is not copied into the new pod's slots.
  auto steps = peer::fetch(addr(server), kAuth, 0, dest + "-r0", &why);
  CHECK(steps == std::vector<int64_t>{11});
  CHECK_FALSE(ShmStore(dest + "-r0-a").peek());
  REQUIRE(read_slot(dest + "-r0-b", &got, n) == 11);

  // The intact copy still arrives after all that.
  peer::send_slot(addr(server), kAuth, 0, a.name());
  CHECK(peer::held_steps(addr(server), kAuth, 0) == std::vector<int64_t>{12, 11});
}

TEST_CASE("a wrong token or another job's token is refused and changes nothing") {
  Cleanup c;
  const std::string src = unique_prefix("src3"), holder = unique_prefix("holder3"), dest = unique_prefix("dest3");
  c.prefixes = {src, holder, dest};
  peer::PeerServer server("127.0.0.1", 0, kAuth, holder);
  ShmStore a(src + "-r1-a");
  put_step(a, 5, state_for(5, 1000));
  peer::send_slot(addr(server), kAuth, 1, a.name());
  put_step(a, 6, state_for(6, 1000));

  const peer::Auth wrong{"ns1/job1", std::string(64, 'x'), nullptr};
  try {
    peer::send_slot(addr(server), wrong, 1, a.name());
    FAIL("a copy with a wrong token was accepted");
  } catch (const peer::PeerError& e) {
    CHECK(std::string(e.what()).find("401") != std::string::npos);
    CHECK(std::string(e.what()).find(kToken) == std::string::npos);  // no token in the message
    CHECK(std::string(e.what()).find(wrong.token) == std::string::npos);
  }
  CHECK_THROWS_AS(peer::held_steps(addr(server), wrong, 1), peer::PeerError);
  std::string why;
  CHECK(peer::fetch(addr(server), wrong, 1, dest + "-r1", &why).empty());
  CHECK(why.find("401") != std::string::npos);
  CHECK_FALSE(ShmStore(dest + "-r1-a").peek());
  // The right token for another job: 403.
  const peer::Auth other{"ns1/job2", kToken, nullptr};
  try {
    peer::send_slot(addr(server), other, 1, a.name());
    FAIL("a copy for another job was accepted");
  } catch (const peer::PeerError& e) {
    CHECK(std::string(e.what()).find("403") != std::string::npos);
  }
  // No header at all.
  httplib::Client cli("127.0.0.1", server.port());
  auto res = cli.Get("/v1/peer/1/a");
  REQUIRE(res);
  CHECK(res->status == 401);
  CHECK(peer::held_steps(addr(server), kAuth, 1) == std::vector<int64_t>{5, -1});
}

TEST_CASE("the sender follows the worker's puts off the training path, and stops when told") {
  Cleanup c;
  const std::string src = unique_prefix("src4"), holder = unique_prefix("holder4");
  c.prefixes = {src, holder};
  const size_t n = 1 << 18;
  peer::PeerServer server("127.0.0.1", 0, kAuth, holder);
  std::atomic<int> copies{0}, errors{0};
  std::atomic<double> total_s{0};
  peer::PeerSender sender(kAuth, std::chrono::milliseconds(5), [&](const peer::CopyResult& r, const std::string& e) {
    if (!e.empty()) {
      ++errors;
      return;
    }
    ++copies;
    total_s = total_s + r.seconds;
  });
  ShmStore slots[2] = {ShmStore(src + "-r2-a"), ShmStore(src + "-r2-b")};
  put_step(slots[0], 1, state_for(1, n));
  put_step(slots[1], 2, state_for(2, n));
  sender.set({{2, src + "-r2"}}, addr(server));
  // Both existing slots go over.
  CHECK(eventually([&] {
    auto h = peer::held_steps(addr(server), kAuth, 2);
    return std::max(h[0], h[1]) == 2 && std::min(h[0], h[1]) == 1;
  }));
  // A worker putting a step every 20 ms: the holder catches up with each.
  for (int64_t step = 3; step <= 12; ++step) {
    put_step(slots[(step - 1) % 2], step, state_for(step, n));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(eventually([&] {
    auto h = peer::held_steps(addr(server), kAuth, 2);
    return std::max(h[0], h[1]) == 12 && std::min(h[0], h[1]) == 11;
  }));
  std::vector<float> got;
  const auto h = peer::held_steps(addr(server), kAuth, 2);
  REQUIRE(read_slot(peer::copy_name(holder, 2, h[0] == 12 ? 0 : 1), &got, n) == 12);
  CHECK(got == state_for(12, n));
  CHECK(copies.load() >= 4);
  CHECK(copies.load() <= 12);  // each step at most once
  // The worker's record of what the target holds (checkpoint/peer_held.h) follows: it keeps step 12 until it is held.
  const std::string record = railyard::ckpt::peer_held_name(src + "-r2");
  CHECK(eventually([&] { return railyard::ckpt::read_peer_held(record) == std::vector<int64_t>{12, 11}; }));
  // Step 12 put again with other contents (a new generation computed it again after a restore to step 11): the
  // target's copy is of the abandoned run, so the sender sends the slot again although the target holds a step 12.
  put_step(slots[1], 12, state_for(1012, n));
  CHECK(eventually([&] {
    const auto now = peer::held_steps(addr(server), kAuth, 2);
    const int slot = now[0] == 12 ? 0 : (now[1] == 12 ? 1 : -1);
    std::vector<float> v;
    return slot >= 0 && read_slot(peer::copy_name(holder, 2, slot), &v, n) == 12 && v == state_for(1012, n);
  }));
  MESSAGE("sender: " << copies.load() << " copies, mean " << total_s.load() / copies.load() * 1e3 << " ms per "
                     << (n * 4) / 1e6 << " MB slot");

  // Target gone: errors are counted and retried, never thrown out of the thread. The new target holds nothing that
  // the old one held: the record is emptied before set() returns (before a new generation's workers start).
  sender.set({{2, src + "-r2"}}, "127.0.0.1:1");
  CHECK(railyard::ckpt::read_peer_held(record).empty());
  CHECK(eventually([&] { return errors.load() > 0; }));
  CHECK(railyard::ckpt::read_peer_held(record).empty());
  sender.set({}, "");
  const int before = copies.load();
  put_step(slots[0], 13, state_for(13, n));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(copies.load() == before);
}

namespace {

// One job's CA and the identities two agents issue themselves under it (AgentConfig::identity).
struct JobTls {
  railyard::tls::CertKey ca;
  std::shared_ptr<const railyard::tls::PodIdentity> holder, sender;
  explicit JobTls(const std::string& name) : ca(railyard::tls::make_job_ca("ns1", name)) {
    holder = std::make_shared<const railyard::tls::PodIdentity>(railyard::tls::issue_pod_identity(ca, {"127.0.0.1"}));
    sender = std::make_shared<const railyard::tls::PodIdentity>(railyard::tls::issue_pod_identity(ca, {"127.0.0.1"}));
  }
};

peer::Auth with_tls(std::shared_ptr<const railyard::tls::PodIdentity> id) {
  return {"ns1/job1", kToken, std::move(id)};
}

std::string proxied(const railyard::test::RecordingProxy& p) { return "127.0.0.1:" + std::to_string(p.port()); }

}  // namespace

TEST_CASE("over TLS a copy arrives and is fetched back, and neither the token nor the bytes cross in cleartext") {
  Cleanup c;
  const std::string src = unique_prefix("src5"), holder = unique_prefix("holder5"), dest = unique_prefix("dest5");
  c.prefixes = {src, holder, dest};
  const size_t n = 1 << 18;
  JobTls job("job1");
  peer::PeerServer server("127.0.0.1", 0, with_tls(job.holder), holder);
  railyard::test::RecordingProxy wire(server.port());
  ShmStore a(src + "-r2-a");
  put_step(a, 11, state_for(11, n));
  const std::string image = image_bytes(a.name());
  const std::string sample = image.substr(image.size() / 2, 64);  // checkpoint bytes from the middle of the tensor

  CHECK(peer::send_slot(proxied(wire), with_tls(job.sender), 2, a.name()).step == 11);
  CHECK(peer::held_steps(proxied(wire), with_tls(job.sender), 2) == std::vector<int64_t>{11, -1});
  std::string why;
  CHECK(peer::fetch(proxied(wire), with_tls(job.sender), 2, dest + "-r2", &why) == std::vector<int64_t>{11});
  CHECK(image_bytes(dest + "-r2-a") == image);
  CHECK(wire.capture().size() > 2 * image.size());  // the copy and the fetch went through the forwarder
  CHECK_FALSE(wire.saw(kToken));
  CHECK_FALSE(wire.saw(kToken.substr(0, 16)));
  CHECK_FALSE(wire.saw(sample));

  // Plain HTTP through the same kind of forwarder: both are there (the capture above would have caught them).
  peer::PeerServer plain("127.0.0.1", 0, kAuth, holder + "-plain");
  c.prefixes.push_back(holder + "-plain");
  railyard::test::RecordingProxy plain_wire(plain.port());
  peer::send_slot(proxied(plain_wire), kAuth, 2, a.name());
  CHECK(plain_wire.saw(kToken));
  CHECK(plain_wire.saw(sample));
}

TEST_CASE("over TLS a plain client, another job's agent, and a server of another job are refused") {
  Cleanup c;
  const std::string src = unique_prefix("src6"), holder = unique_prefix("holder6");
  c.prefixes = {src, holder, holder + "-other", unique_prefix("dest6")};
  JobTls job("job1"), other("job2");
  peer::PeerServer server("127.0.0.1", 0, with_tls(job.holder), holder);
  ShmStore a(src + "-r1-a");
  put_step(a, 3, state_for(3, 1000));

  // Plain HTTP to the TLS listener: the handshake fails, nothing is stored.
  CHECK_THROWS_AS(peer::send_slot(addr(server), kAuth, 1, a.name()), peer::PeerError);
  // Another job's agent, even with this job's token: refused in the handshake.
  try {
    peer::send_slot(addr(server), with_tls(other.sender), 1, a.name());
    FAIL("a copy from another job's agent was accepted");
  } catch (const peer::PeerError& e) {
    CHECK(std::string(e.what()).find(kToken) == std::string::npos);
  }
  // A client that trusts this job's CA but holds another job's certificate: the listener refuses it in the handshake.
  auto forged = std::make_shared<const railyard::tls::PodIdentity>(
      railyard::tls::PodIdentity{job.ca.cert_pem, other.sender->leaf});
  CHECK_THROWS_AS(peer::send_slot(addr(server), with_tls(forged), 1, a.name()), peer::PeerError);
  CHECK_THROWS_AS(peer::held_steps(addr(server), with_tls(forged), 1), peer::PeerError);
  CHECK(peer::held_steps(addr(server), with_tls(job.sender), 1) == std::vector<int64_t>{-1, -1});

  // This job's agent never sends its token to a listener of another job: the handshake fails first.
  peer::PeerServer stranger("127.0.0.1", 0, {"ns1/job1", kToken, other.holder}, holder + "-other");
  railyard::test::RecordingProxy wire(stranger.port());
  CHECK_THROWS_AS(peer::send_slot(proxied(wire), with_tls(job.sender), 1, a.name()), peer::PeerError);
  std::string why;
  CHECK(peer::fetch(proxied(wire), with_tls(job.sender), 1, unique_prefix("dest6") + "-r1", &why).empty());
  CHECK_FALSE(wire.capture().empty());
  CHECK_FALSE(wire.saw(kToken));
  CHECK(peer::held_steps(addr(stranger), with_tls(other.sender), 1) == std::vector<int64_t>{-1, -1});
}

namespace {

// The job's own TLS context, held to exactly TLS 1.2: what a downgraded or older peer would offer.
railyard::tls::SslCtxPtr tls12_only(railyard::tls::SslCtxPtr ctx) {
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_max_proto_version(ctx.get(), TLS1_2_VERSION);
  return ctx;
}

}  // namespace

TEST_CASE("over TLS the peer copies speak TLS 1.3 only, as the store does, even with the job's own certificates") {
  Cleanup c;
  const std::string holder = unique_prefix("holder7");
  c.prefixes = {holder};
  JobTls job("job1");
  peer::PeerServer server("127.0.0.1", 0, with_tls(job.holder), holder);

  // The same client context at TLS 1.3 gets through (so the refusal below is the version, not the certificate).
  auto ok_ctx = railyard::tls::client_context(*job.sender);
  int fd = connect_to(server.port());
  std::string why;
  CHECK(railyard::tls::Channel::connect(fd, ok_ctx.get(), &why) != nullptr);
  ::close(fd);
  auto old_ctx = tls12_only(railyard::tls::client_context(*job.sender));
  fd = connect_to(server.port());
  CHECK(railyard::tls::Channel::connect(fd, old_ctx.get(), &why) == nullptr);
  CHECK_MESSAGE(why.find("version") != std::string::npos, why);
  ::close(fd);

  // Our client against a listener of this job that offers only TLS 1.2: the handshake fails, the token stays home.
  auto srv_ctx = tls12_only(railyard::tls::server_context(*job.holder));
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  railyard::test::RecordingProxy wire(ntohs(a.sin_port));
  std::atomic<bool> accepted{false};
  std::thread t([&] {
    int cfd = ::accept(lfd, nullptr, nullptr);
    if (cfd < 0) return;
    std::string server_why;
    accepted = railyard::tls::Channel::accept(cfd, srv_ctx.get(), &server_why) != nullptr;
    ::close(cfd);
  });
  CHECK_THROWS_AS(peer::held_steps(proxied(wire), with_tls(job.sender), 1), peer::PeerError);
  t.join();
  ::close(lfd);
  CHECK_FALSE(accepted.load());
  CHECK_FALSE(wire.capture().empty());  // the client did try, and the forwarder saw the handshake
  CHECK_FALSE(wire.saw(kToken));
}
