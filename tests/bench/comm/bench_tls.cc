// What the job's own TLS identity costs (issue 26; docs/hardening.md "The job's own identity"), each figure TLS
// against plain TCP on loopback, in alternating rounds (plain first in odd rounds), medians with min-max:
//   - a bootstrap-store connection: connect, handshake (TLS 1.3, both leaves checked), the token request;
//   - a request on an open store connection (get of a 64-byte value): the per-request cost after the handshake;
//   - the peer copy of one in-memory checkpoint slot (send_slot, agent to agent): throughput, encrypted or not;
//   - an agent start's certificate: one P-256 key and one signature under the job's CA (issue_pod_identity).
// Both ends run on this machine, so every TLS figure pays for encryption and decryption on the same cores.
//   bench_tls [rounds=5] [slot_mib=256]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/shm_store.h"
#include "common/tls/job_identity.h"
#include "worker/agent/peer_copy.h"
#include "worker/comm/tcp_store.h"

namespace {

namespace comm = railyard::worker::comm;
namespace peer = railyard::worker::peer;
namespace tls = railyard::tls;
using Clock = std::chrono::steady_clock;

double since_s(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Series {
  std::vector<double> plain, tls;  // one value per round
};

void report(const char* what, const char* unit, const Series& s, bool higher_is_better) {
  std::vector<double> ratio;
  for (size_t i = 0; i < s.plain.size(); ++i)
    ratio.push_back(higher_is_better ? s.plain[i] / s.tls[i] : s.tls[i] / s.plain[i]);
  auto mm = [](const std::vector<double>& v) { return std::minmax_element(v.begin(), v.end()); };
  auto [pl, ph] = mm(s.plain);
  auto [tl, th] = mm(s.tls);
  auto [rl, rh] = mm(ratio);
  std::printf("%-34s plain %10.3f %s (%.3f-%.3f)   tls %10.3f %s (%.3f-%.3f)   tls cost x%.2f (%.2f-%.2f)\n", what,
              median(s.plain), unit, *pl, *ph, median(s.tls), unit, *tl, *th, median(ratio), *rl, *rh);
}

// Median over `n` store connections (constructor: connect, TLS handshake, token), in milliseconds.
double connect_ms(int port, const std::string& token, const comm::StoreTls& id, int n) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    comm::TcpStore s("127.0.0.1", port, "bench", std::chrono::seconds(5), token, id);
    t.push_back(since_s(t0) * 1e3);
  }
  return median(t);
}

// Microseconds per get of a 64-byte value on one open connection, over `n` gets.
double get_us(int port, const std::string& token, const comm::StoreTls& id, int n) {
  comm::TcpStore s("127.0.0.1", port, "bench", std::chrono::seconds(5), token, id);
  s.set("k", std::vector<char>(64, 'v'));
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i)
    if (s.get("k").size() != 64) std::abort();
  return since_s(t0) / n * 1e6;
}

void put_slot(railyard::ckpt::ShmStore& slot, const std::vector<float>& data) {
  railyard::ckpt::TensorShard s;
  s.name = "w";
  s.dtype = railyard::ckpt::DType::F32;
  s.global_shape = {static_cast<int64_t>(data.size())};
  s.box = {{0}, {static_cast<int64_t>(data.size())}};
  s.data = data.data();
  slot.put(1, {s}, {{"step", 1}});
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const size_t slot_mib = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 256;
  const std::string token(64, 't');
  const tls::CertKey ca = tls::make_job_ca("bench", "tls");
  auto holder = std::make_shared<const tls::PodIdentity>(tls::issue_pod_identity(ca, {"127.0.0.1"}));
  auto sender = std::make_shared<const tls::PodIdentity>(tls::issue_pod_identity(ca, {"127.0.0.1"}));

  comm::TcpStoreServer plain_store("127.0.0.1", 0, std::chrono::milliseconds(0), token, nullptr);
  comm::TcpStoreServer tls_store("127.0.0.1", 0, std::chrono::milliseconds(0), token, holder);

  const std::string prefix = "/railyard-bench-tls-" + std::to_string(::getpid());
  std::vector<float> data(slot_mib * (1 << 20) / sizeof(float));
  std::mt19937 g(7);
  for (auto& x : data) x = static_cast<float>(g()) / 4294967296.0f;
  railyard::ckpt::ShmStore slot(prefix + "-src-r0-a");
  put_slot(slot, data);
  data = {};
  peer::PeerServer plain_peer("127.0.0.1", 0, {"bench/tls", token, nullptr}, prefix + "-plain");
  peer::PeerServer tls_peer("127.0.0.1", 0, {"bench/tls", token, holder}, prefix + "-tls");
  auto peer_addr = [](const peer::PeerServer& p) { return "127.0.0.1:" + std::to_string(p.port()); };

  std::printf("bench_tls: %d alternating rounds, 200 connections and 5,000 gets per side per round, a %zu MiB slot\n",
              rounds, slot_mib);
  Series conn, get, copy;
  std::vector<double> issue_ms;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool use_tls = (r % 2 == 0) == (k == 1);  // odd rounds (r even) plain first
      const comm::StoreTls id = use_tls ? sender : nullptr;
      const int port = use_tls ? tls_store.port() : plain_store.port();
      (use_tls ? conn.tls : conn.plain).push_back(connect_ms(port, token, id, 200));
      (use_tls ? get.tls : get.plain).push_back(get_us(port, token, id, 5000));
      const peer::Auth auth{"bench/tls", token, use_tls ? sender : nullptr};
      const peer::CopyResult c = peer::send_slot(peer_addr(use_tls ? tls_peer : plain_peer), auth, 0, slot.name());
      (use_tls ? copy.tls : copy.plain).push_back(c.bytes / c.seconds / (1 << 20));
    }
    std::vector<double> keys;
    for (int i = 0; i < 20; ++i) {
      const auto t0 = Clock::now();
      tls::issue_pod_identity(ca, {"127.0.0.1"});
      keys.push_back(since_s(t0) * 1e3);
    }
    issue_ms.push_back(median(keys));
    std::printf("round %d: connect %.3f / %.3f ms, get %.1f / %.1f us, copy %.0f / %.0f MiB/s (plain / tls)\n", r + 1,
                conn.plain.back(), conn.tls.back(), get.plain.back(), get.tls.back(), copy.plain.back(),
                copy.tls.back());
  }
  report("store connection (connect+auth)", "ms", conn, false);
  report("store get, 64 B, open connection", "us", get, false);
  report("peer copy of one slot", "MiB/s", copy, true);
  std::printf("%-34s %.3f ms (median of the rounds' medians of 20)\n", "pod leaf at agent start", median(issue_ms));
  railyard::ckpt::ShmStore::remove_prefix(prefix);
  return 0;
}
