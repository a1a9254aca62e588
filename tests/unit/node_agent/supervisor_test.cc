#include "deploy/local/node_agent/supervisor.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "deploy/local/node_agent/signals.h"
#include "tests/unit/node_agent/temp_dir.h"

namespace na = railyard::node_agent;
using namespace std::chrono_literals;

using railyard::node_agent::testing::TempDir;

namespace {

// Records exits reported by the supervisor's callback.
struct Exits {
  std::mutex mu;
  std::map<std::string, na::ExitStatus> by_key;
  na::Supervisor::ExitCallback callback() {
    return [this](const std::string& key, pid_t, const na::ExitStatus& s) {
      std::lock_guard<std::mutex> l(mu);
      by_key[key] = s;
    };
  }
  void forget(const std::string& key) {
    std::lock_guard<std::mutex> l(mu);
    by_key.erase(key);
  }
  std::optional<na::ExitStatus> get(const std::string& key) {
    // The callback runs right after the process is removed; give it a moment.
    for (int i = 0; i < 100; ++i) {
      {
        std::lock_guard<std::mutex> l(mu);
        auto it = by_key.find(key);
        if (it != by_key.end()) return it->second;
      }
      std::this_thread::sleep_for(10ms);
    }
    return std::nullopt;
  }
};

na::SpawnSpec sh(const TempDir& d, const std::string& script) {
  return na::SpawnSpec{{"sh", "-c", script},
                       {{"PATH", "/usr/bin:/bin"}, {"GREETING", "hi"}},
                       d.path + "/work/sub",
                       d.path + "/logs/main.log"};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// 'T' stopped, 'S' sleeping, 'Z' zombie, ... or '-' when the process is gone.
char proc_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all;
  if (!std::getline(in, all)) return '-';
  auto close = all.rfind(')');
  return close == std::string::npos || close + 2 >= all.size() ? '?' : all[close + 2];
}

bool gone(pid_t pid) {
  for (int i = 0; i < 100; ++i) {
    char s = proc_state(pid);
    if (s == '-' || s == 'Z') return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

pid_t read_pid(const std::string& path) {
  for (int i = 0; i < 200; ++i) {
    std::string s = slurp(path);
    if (!s.empty() && s.back() == '\n') return static_cast<pid_t>(std::stoi(s));
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}

}  // namespace

TEST_CASE("supervisor: exit codes, env, working dir and log file") {
  TempDir d("na-sup");
  Exits exits;
  na::Supervisor sup(exits.callback());
  sup.start("a", sh(d, "echo out $GREETING; echo err >&2; pwd; exit 3"));
  REQUIRE(sup.wait("a", 5s));
  auto s = exits.get("a");
  REQUIRE(s);
  CHECK_FALSE(s->signaled);
  CHECK(s->code == 3);
  CHECK(na::describe(*s) == "exited with code 3");
  std::string log = slurp(d.path + "/logs/main.log");
  CHECK(log.find("out hi") != std::string::npos);
  CHECK(log.find("err") != std::string::npos);
  CHECK(log.find(d.path + "/work/sub") != std::string::npos);

  exits.forget("a");
  sup.start("a", sh(d, "exit 0"));  // the key is free again once the process ended
  REQUIRE(sup.wait("a", 5s));
  CHECK(exits.get("a")->code == 0);
}

TEST_CASE("supervisor: exec failure is a SpawnError naming the command") {
  TempDir d("na-sup");
  na::Supervisor sup;
  na::SpawnSpec spec{{"/nonexistent/binary"}, {}, d.path, d.path + "/x.log"};
  CHECK_THROWS_WITH_AS(sup.start("x", spec), doctest::Contains("/nonexistent/binary"), na::SpawnError);
  CHECK_FALSE(sup.running("x"));
  auto busy = sh(d, "sleep 5");
  sup.start("y", busy);
  CHECK_THROWS_AS(sup.start("y", busy), na::SpawnError);
  sup.signal("y", SIGKILL);
  CHECK(sup.wait("y", 5s));
}

TEST_CASE("supervisor: death by signal") {
  TempDir d("na-sup");
  Exits exits;
  na::Supervisor sup(exits.callback());
  sup.start("k", sh(d, "sleep 30"));
  CHECK(sup.signal("k", SIGKILL));
  REQUIRE(sup.wait("k", 5s));
  auto s = exits.get("k");
  REQUIRE(s);
  CHECK(s->signaled);
  CHECK(s->signal == SIGKILL);
  CHECK(s->code == 137);
  CHECK(na::describe(*s) == "killed by signal 9 (SIGKILL)");
  CHECK_FALSE(sup.signal("k", SIGKILL));
}

TEST_CASE("supervisor: SIGTERM is delivered and handled within the grace period") {
  TempDir d("na-sup");
  Exits exits;
  na::Supervisor sup(exits.callback());
  std::string marker = d.path + "/marker";
  sup.start("t", sh(d, "trap 'echo bye > " + marker + "; exit 0' TERM; echo 1 > " + d.path +
                           "/ready; while :; do sleep 0.1; done"));
  REQUIRE(read_pid(d.path + "/ready") == 1);  // trap installed
  auto t0 = std::chrono::steady_clock::now();
  CHECK(sup.terminate("t", 10s));
  REQUIRE(sup.wait("t", 5s));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(exits.get("t")->code == 0);
  CHECK(slurp(marker) == "bye\n");
}

TEST_CASE("supervisor: SIGKILL after the grace period when SIGTERM is ignored") {
  TempDir d("na-sup");
  Exits exits;
  na::Supervisor sup(exits.callback());
  sup.start("i", sh(d, "trap '' TERM; echo 1 > " + d.path + "/ready; while :; do sleep 0.1; done"));
  REQUIRE(read_pid(d.path + "/ready") == 1);
  auto t0 = std::chrono::steady_clock::now();
  sup.terminate("i", 600ms);
  CHECK_FALSE(sup.wait("i", 300ms));  // still alive during the grace period
  REQUIRE(sup.wait("i", 5s));
  auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(elapsed >= 550ms);
  CHECK(elapsed < 4s);
  auto s = exits.get("i");
  REQUIRE(s);
  CHECK(s->signaled);
  CHECK(s->signal == SIGKILL);
}

TEST_CASE("supervisor: signals reach the whole process group, grandchildren included") {
  TempDir d("na-sup");
  Exits exits;
  na::Supervisor sup(exits.callback());
  std::string pidfile = d.path + "/grandchild";
  sup.start("g", sh(d, "sleep 300 & echo $! > " + pidfile + "; wait"));
  pid_t grandchild = read_pid(pidfile);
  REQUIRE(grandchild > 0);
  auto leader = sup.pid("g");
  REQUIRE(leader);
  CHECK(getpgid(grandchild) == *leader);  // own group, led by the pod's main process
  CHECK(getsid(*leader) == *leader);      // and own session (setsid)

  SUBCASE("freeze and thaw") {
    CHECK(sup.signal("g", SIGSTOP));
    bool stopped = false;
    for (int i = 0; i < 100 && !stopped; ++i) {
      stopped = proc_state(grandchild) == 'T' && proc_state(*leader) == 'T';
      std::this_thread::sleep_for(10ms);
    }
    CHECK(stopped);
    CHECK(sup.signal("g", SIGCONT));
    bool resumed = false;
    for (int i = 0; i < 100 && !resumed; ++i) {
      resumed = proc_state(grandchild) != 'T';
      std::this_thread::sleep_for(10ms);
    }
    CHECK(resumed);
    sup.signal("g", SIGKILL);
  }
  SUBCASE("group kill") { CHECK(sup.signal("g", SIGKILL)); }
  REQUIRE(sup.wait("g", 5s));
  CHECK(gone(grandchild));
}

TEST_CASE("supervisor: what is left of a group dies with its main process") {
  TempDir d("na-sup");
  na::Supervisor sup;
  std::string pidfile = d.path + "/bg";
  sup.start("b", sh(d, "sleep 300 & echo $! > " + pidfile + "; exit 0"));
  pid_t bg = read_pid(pidfile);
  REQUIRE(bg > 0);
  REQUIRE(sup.wait("b", 5s));
  CHECK(gone(bg));
}

TEST_CASE("supervisor: stop_all terminates everything, destructor does not hang") {
  TempDir d("na-sup");
  auto t0 = std::chrono::steady_clock::now();
  {
    na::Supervisor sup;
    sup.start("1", sh(d, "sleep 60"));
    sup.start("2", sh(d, "trap '' TERM; while :; do sleep 0.1; done"));
    sup.stop_all(500ms);
    CHECK(sup.keys().empty());
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("signal names") {
  CHECK(na::parse_signal("KILL") == SIGKILL);
  CHECK(na::parse_signal("sigterm") == SIGTERM);
  CHECK(na::parse_signal("9") == 9);
  CHECK(na::parse_signal("INT") == SIGINT);
  CHECK(na::signal_name(SIGKILL) == "SIGKILL");
  CHECK_THROWS_WITH_AS(na::parse_signal("BOGUS"), doctest::Contains("--signal 'BOGUS'"), railyard::ConfigError);
  CHECK_THROWS_AS(na::parse_signal("0"), railyard::ConfigError);
  CHECK_THROWS_AS(na::parse_signal("999"), railyard::ConfigError);
}
