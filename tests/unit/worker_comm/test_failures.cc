// A rank dies (SIGKILL) or hangs (SIGSTOP) mid-collective: every survivor must get a CommError naming the group
// within the deadline, never hang. The victim is a separate process (worker_comm_peer); survivors are threads here.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/worker_comm/fault_workload.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/tcp_store.h"

using namespace railyard::worker::comm;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#ifndef WORKER_COMM_PEER
#error "WORKER_COMM_PEER must name the worker_comm_peer binary"
#endif

namespace {

constexpr int kDeadlineMs = 1500;

// The victim process; SIGKILLed and reaped on scope exit whatever happens in the test.
class Peer {
 public:
  Peer(int port, int rank, int size, const char* mode, int deadline_ms = kDeadlineMs) {
    std::string p = std::to_string(port), r = std::to_string(rank), s = std::to_string(size),
                t = std::to_string(deadline_ms);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::execl(WORKER_COMM_PEER, WORKER_COMM_PEER, "127.0.0.1", p.c_str(), r.c_str(), s.c_str(), t.c_str(), mode,
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Peer() {
    ::kill(pid_, SIGKILL);
    ::kill(pid_, SIGCONT);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  void signal(int sig) { REQUIRE(::kill(pid_, sig) == 0); }

 private:
  pid_t pid_ = -1;
};

// A survivor's options: the test process serves the store.
GlooOptions survivor(int port, int rank, int size, int timeout_ms = kDeadlineMs) {
  GlooOptions o;
  o.store_port = port;
  o.rank = rank;
  o.size = size;
  o.timeout = milliseconds(timeout_ms);
  o.serve_store = false;
  o.prefix = "failure";
  return o;
}

struct Outcome {
  bool threw = false;
  bool timeout = false;
  std::string message;
  double after_fault_ms = -1;
  bool second_call_threw = false;
};

// Runs `size` ranks except `victim` as threads, running the FaultWorkload `mode` until the victim is hit by `sig`.
std::vector<Outcome> run_fault(int size, int victim, int sig, const char* mode = "all_reduce",
                               int deadline_ms = kDeadlineMs) {
  TcpStoreServer server("127.0.0.1", 0);
  Peer peer(server.port(), victim, size, mode, deadline_ms);
  std::vector<std::atomic<int>> iterations(static_cast<size_t>(size));
  std::atomic<int> failed{0};
  std::atomic<int64_t> fault_at_ns{0};
  std::vector<Outcome> out(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    if (r == victim) continue;
    threads.emplace_back([&, r] {
      Outcome& o = out[static_cast<size_t>(r)];
      // Both outlive the error: a survivor that lingers (logging, checkpointing) must not keep its peers waiting.
      std::unique_ptr<Communicator> comm;
      std::unique_ptr<testing::FaultWorkload> work;
      try {
        GlooOptions opt = survivor(server.port(), r, size, deadline_ms);
        comm = connect_gloo(opt);
        work = std::make_unique<testing::FaultWorkload>(*comm, mode);
        for (;;) {
          work->step();
          ++iterations[static_cast<size_t>(r)];
          if (iterations[static_cast<size_t>(r)].load() > 100000) return;  // never: the fault ends the loop
        }
      } catch (const CommError& e) {
        o.threw = true;
        o.timeout = dynamic_cast<const CommTimeout*>(&e) != nullptr;
        o.message = e.what();
        int64_t f = fault_at_ns.load();
        o.after_fault_ms = f ? static_cast<double>(Clock::now().time_since_epoch().count() - f) / 1e6 : -1;
        if (comm) {
          float x = 0;
          try {
            comm->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
          } catch (const CommError&) {
            o.second_call_threw = true;
          }
        }
      }
      ++failed;
      auto linger_until = Clock::now() + std::chrono::seconds(10);
      while (failed.load() < size - 1 && Clock::now() < linger_until) std::this_thread::sleep_for(milliseconds(5));
    });
  }
  // Let every survivor do a few all-reduces with the victim, then strike.
  auto give_up = Clock::now() + std::chrono::seconds(15);
  for (;;) {
    int lowest = 1 << 30;
    for (int r = 0; r < size; ++r) {
      if (r != victim) lowest = std::min(lowest, iterations[static_cast<size_t>(r)].load());
    }
    if (lowest >= 5 || Clock::now() > give_up) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  fault_at_ns = Clock::now().time_since_epoch().count();
  peer.signal(sig);
  for (auto& t : threads) t.join();
  out.erase(out.begin() + victim);
  return out;
}

}  // namespace

TEST_CASE("SIGKILL of one rank mid all_reduce: every survivor throws CommError naming the group, fast") {
  auto outcomes = run_fault(4, 2, SIGKILL);
  REQUIRE(outcomes.size() == 3);
  for (const auto& o : outcomes) {
    INFO(o.message);
    CHECK(o.threw);
    CHECK(o.message.find("all_reduce on group 'world'") != std::string::npos);
    CHECK(o.after_fault_ms >= 0);
    CHECK(o.after_fault_ms < kDeadlineMs + 1000);
    CHECK(o.second_call_threw);
  }
}

TEST_CASE("SIGSTOP of one rank mid all_reduce: every survivor times out within the deadline") {
  auto outcomes = run_fault(3, 1, SIGSTOP);
  REQUIRE(outcomes.size() == 2);
  bool some_timeout = false;
  for (const auto& o : outcomes) {
    INFO(o.message);
    CHECK(o.threw);
    CHECK(o.message.find("group 'world'") != std::string::npos);
    CHECK(o.after_fault_ms >= 0);
    CHECK(o.after_fault_ms < kDeadlineMs + 1000);
    some_timeout = some_timeout || o.timeout;
  }
  // The ones waiting on the frozen rank time out; others may fail sooner when those close their connections.
  CHECK(some_timeout);
}

TEST_CASE("SIGKILL in a dp x tp grid: a rank sharing no group with the victim fails fast too, not at the deadline") {
  // Deadline 5 s: everyone must fail well before it, which only happens if the failure travels across groups (rank 0
  // is in tp [0,1] and dp [0,2]; the victim 3 is in tp [2,3] and dp [1,3]). Gloo does not always let a direct peer of
  // the victim notice its death at once: when the victim dies while that peer is busy in its other group, the
  // operation it then posts to the victim waits for its deadline (seen in about 1 of 5 runs; docs/parallel.md). So up
  // to three attempts: every attempt must end within the deadline, and one must end fast for everyone, which without
  // the cross-group close (Bootstrap::close_all) never happens, since rank 0 would wait for its deadline every time.
  bool all_fast = false;
  for (int attempt = 0; attempt < 3 && !all_fast; ++attempt) {
    auto outcomes = run_fault(4, 3, SIGKILL, "groups", 5000);
    REQUIRE(outcomes.size() == 3);
    all_fast = true;
    for (const auto& o : outcomes) {
      INFO(o.message);
      CHECK(o.threw);
      CHECK(o.message.find("all_reduce on group '") != std::string::npos);
      CHECK(o.after_fault_ms >= 0);
      CHECK(o.after_fault_ms < 5000 + 1000);
      if (o.timeout || o.after_fault_ms >= 2000) all_fast = false;
    }
    if (!all_fast) MESSAGE("attempt " << attempt + 1 << ": a survivor waited for its deadline");
  }
  CHECK(all_fast);
}

TEST_CASE("recv from a peer that never sends times out naming the peer") {
  TcpStoreServer server("127.0.0.1", 0);
  Peer peer(server.port(), 1, 2, "idle");
  GlooOptions opt = survivor(server.port(), 0, 2);
  auto comm = connect_gloo(opt);
  float x = 0;
  auto t0 = Clock::now();
  std::string msg;
  try {
    comm->recv(&x, 1, DType::kFloat32, 1, 7);
  } catch (const CommTimeout& e) {
    msg = e.what();
  }
  double took = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  CHECK(msg.find("recv on group 'world' (rank 0 of 2): timed out after 1500 ms waiting for rank 1") == 0);
  CHECK(took >= kDeadlineMs - 50);
  CHECK(took < kDeadlineMs + 1000);
  CHECK_THROWS_WITH_AS(comm->barrier(), doctest::Contains("unusable after an earlier error"), CommError);
}

TEST_CASE("a rank that never shows up makes connect fail within the deadline, naming the missing rank's key") {
  TcpStoreServer server("127.0.0.1", 0);
  GlooOptions opt = survivor(server.port(), 0, 2, 800);
  auto t0 = Clock::now();
  std::string msg;
  try {
    connect_gloo(opt);
  } catch (const CommError& e) {
    msg = e.what();
  }
  double took = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  INFO(msg);
  CHECK(msg.find("connect on group 'world'") != std::string::npos);
  CHECK(msg.find("timed out") != std::string::npos);
  CHECK(took < 800 + 1000);
}

TEST_CASE("abort() releases a peer blocked in a collective at once") {
  TcpStoreServer server("127.0.0.1", 0);
  std::string msg;
  double took = 0;
  std::thread waiter([&] {
    GlooOptions opt = survivor(server.port(), 1, 2, 10000);
    auto comm = connect_gloo(opt);
    float x = 1;
    auto t0 = Clock::now();
    try {
      comm->all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
    } catch (const CommError& e) {
      msg = e.what();
    }
    took = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  });
  GlooOptions opt = survivor(server.port(), 0, 2, 10000);
  auto comm = connect_gloo(opt);
  std::this_thread::sleep_for(milliseconds(200));
  comm->abort();
  waiter.join();
  CHECK(msg.find("all_reduce on group 'world' (rank 1 of 2)") == 0);
  CHECK(took < 3000);
  float y = 0;
  CHECK_THROWS_WITH_AS(comm->all_reduce(&y, 1, DType::kFloat32, ReduceOp::kSum), doctest::Contains("aborted"),
                       CommError);
}
