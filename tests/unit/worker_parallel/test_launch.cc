// `railyard-worker train --nproc N` as a user runs it, on shards made by `railyard data prepare`: both ranks run and
// rank 0 reports the loss; the 2-rank losses equal the single-process run with the same global batch (the loader's
// data-parallel split end to end), bitwise in --deterministic mode; a rank killed mid-run fails the whole world
// within the collective deadline; SIGINT to the launcher reaches every rank.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/worker/worker_test_util.h"
#include "tests/unit/worker_parallel/launch_test_util.h"

using namespace railyard::worker::testing;

namespace {

const std::string kModel = "--model l=2,c=64,nh=4,t=64,v=256 --batch 2 --seq 32 --global-batch 256 --peak-flops 1e11";

// Starts `cmd` (via sh) in the background; returns its pid.
pid_t spawn(const std::string& cmd) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits for pid up to `seconds`; returns its exit code (128 + signal), or -1 on timeout (then kills it).
int wait_for(pid_t pid, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// The launcher's child whose environment has RANK=rank.
pid_t child_with_rank(pid_t launcher, int rank) {
  std::ifstream f("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
  for (pid_t c; f >> c;) {
    std::stringstream env(slurp("/proc/" + std::to_string(c) + "/environ"));
    for (std::string kv; std::getline(env, kv, '\0');) {
      if (kv == "RANK=" + std::to_string(rank)) return c;
    }
  }
  return -1;
}

bool any_line_with(const std::string& text, const std::string& a, const std::string& b) {
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);) {
    if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) return true;
  }
  return false;
}

bool wait_for_text(const std::string& path, const std::string& text, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (slurp(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

TEST_CASE("train --nproc 2: both ranks run, rank 0 reports, losses equal one process; failures stop the world") {
  const std::string bin = bin_dir();
  TempDir dir;
  const std::string d = dir.path();
  prepare_data(d);
  const std::string common = bin + "/railyard-worker train " + kModel + " --data " + d + "/data --steps 4 ";

  SUBCASE("data parallel run equals the single process") {
    REQUIRE(sh(common + "--threads 1 --log-json " + d + "/one.jsonl 2> " + d + "/one.txt") == 0);
    REQUIRE(sh(common + "--nproc 2 --log-json " + d + "/two.jsonl > " + d + "/two_out.txt 2> " + d + "/two.txt") == 0);
    const std::string err = slurp(d + "/two.txt");
    CHECK(err.find("[rank 0] ") != std::string::npos);
    CHECK(err.find("[rank 1] ") != std::string::npos);
    CHECK(err.find("dp-group [0,1]") != std::string::npos);  // the layout line of both ranks
    CHECK(any_line_with(err, "[rank 0] ", "step=4/4"));
    CHECK(!any_line_with(err, "[rank 1] ", "step=1/4"));  // step lines speak for the job: rank 0 only
    CHECK(err.find("split_ms=") != std::string::npos);
    const auto one = losses(d + "/one.jsonl"), two = losses(d + "/two.jsonl");
    REQUIRE(one.size() == 4);
    REQUIRE(two.size() == 4);  // rank 0 alone writes the job's log
    for (size_t i = 0; i < one.size(); ++i) CHECK(std::abs(one[i] - two[i]) <= 1e-5 * one[i]);
  }

  SUBCASE("deterministic: two ranks are bitwise the single process") {
    REQUIRE(sh(common + "--deterministic --threads 1 --log-json " + d + "/d1.jsonl 2> " + d + "/d1.txt") == 0);
    REQUIRE(sh(common + "--deterministic --nproc 2 --threads 1 --log-json " + d + "/d2.jsonl 2> " + d + "/d2.txt") ==
            0);
    const auto one = losses(d + "/d1.jsonl"), two = losses(d + "/d2.jsonl");
    REQUIRE(one.size() == 4);
    CHECK(one == two);
  }

  SUBCASE("uneven --dp-split 3,1 (and a slowed rank) trains the single process's model; bad splits refused") {
    // 4 micro-batches per step: rank 0 takes 3, rank 1 one; gradients weighted by micro-batches.
    REQUIRE(sh(common + "--threads 1 --export " + d + "/u1.bin --log-json " + d + "/u1.jsonl 2> " + d + "/u1.txt") ==
            0);
    REQUIRE(sh(common + "--nproc 2 --threads 1 --dp-split 3,1 --slow-ranks 1 --slow-factor 2 --export " + d +
               "/u2.bin --log-json " + d + "/u2.jsonl 2> " + d + "/u2.txt") == 0);
    CHECK(slurp(d + "/u2.txt").find("dp_split=3,1") != std::string::npos);
    const auto one = losses(d + "/u1.jsonl"), two = losses(d + "/u2.jsonl");
    REQUIRE(one.size() == 4);
    REQUIRE(two.size() == 4);
    for (size_t i = 0; i < one.size(); ++i) CHECK(std::abs(one[i] - two[i]) <= 1e-5 * one[i]);
    const auto p1 = read_binary<float>(d + "/u1.bin"), p2 = read_binary<float>(d + "/u2.bin");
    REQUIRE(p1.size() == p2.size());
    double worst = 0, scale = 0;
    for (size_t i = 256; i < p1.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(p1[i] - p2[i])));
      scale = std::max(scale, static_cast<double>(std::abs(p1[i])));
    }
    CHECK(worst <= 1e-5 * scale);
    CHECK(worst > 0);  // a different summation order, not a copy of the single process
    // Bad input: wrong count, wrong sum, a zero share, with --tp, a knob without its partner.
    for (const auto& [flags, text] : std::vector<std::pair<std::string, std::string>>{
             {"--nproc 2 --dp-split 4", "1 entries for dp=2"},
             {"--nproc 2 --dp-split 2,1", "must sum to the 4 micro-batches"},
             {"--nproc 2 --dp-split 4,0", "at least one micro-batch"},
             {"--nproc 2 --dp-split 3,x", "not a comma-separated list"},
             {"--nproc 2 --tp 2 --dp-split 2,2", "drop --tp/--pp"},
             {"--slow-ranks 1", "go together"},
             {"--slow-ranks 0 --slow-factor 0.5", "--slow-factor must be"}}) {
      CAPTURE(flags);
      CHECK(sh(common + "--threads 1 " + flags + " > " + d + "/bad.txt 2>&1") != 0);
      CHECK(slurp(d + "/bad.txt").find(text) != std::string::npos);
    }
  }

  SUBCASE("tp x pp: --export gathers the full model, --init-from scatters it") {
    REQUIRE(sh(common + "--threads 1 --export " + d + "/one.bin 2> " + d + "/e1.txt") == 0);
    REQUIRE(sh(common + "--nproc 4 --tp 2 --pp 2 --threads 1 --export " + d + "/four.bin 2> " + d + "/e4.txt") == 0);
    const auto one = read_binary<float>(d + "/one.bin"), four = read_binary<float>(d + "/four.bin");
    REQUIRE(one.size() == four.size());
    double worst = 0, scale = 0;
    for (size_t i = 256; i < one.size(); ++i) {  // after the 1 KiB llm.c header
      worst = std::max(worst, static_cast<double>(std::abs(one[i] - four[i])));
      scale = std::max(scale, static_cast<double>(std::abs(one[i])));
    }
    CHECK(worst <= 1e-5 * scale);
    CHECK(std::memcmp(one.data(), four.data(), 1024) == 0);  // the same header
    // Resuming from the export: the first step's loss is the same in one process and in tp x pp.
    REQUIRE(sh(common + "--steps 1 --threads 1 --init-from " + d + "/one.bin --log-json " + d + "/i1.jsonl 2> " + d +
               "/i1.txt") == 0);
    REQUIRE(sh(common + "--steps 1 --nproc 4 --tp 2 --pp 2 --threads 1 --init-from " + d + "/one.bin --log-json " + d +
               "/i4.jsonl 2> " + d + "/i4.txt") == 0);
    const auto l1 = losses(d + "/i1.jsonl"), l4 = losses(d + "/i4.jsonl");
    REQUIRE(l1.size() == 1);
    REQUIRE(l4.size() == 1);
    CHECK(std::abs(l1[0] - l4[0]) <= 1e-5 * l1[0]);
  }

  SUBCASE("tp x pp checkpoints: resume is bitwise, and one process restores them resharded") {
    const std::string tp_pp = common + "--steps 6 --threads 1 --nproc 4 --tp 2 --pp 2 --ckpt-dir " + d + "/ck ";
    REQUIRE(sh(tp_pp + "--ckpt-every 3 --ckpt-async off --log-json " + d + "/full.jsonl 2> " + d + "/c1.txt") == 0);
    std::filesystem::remove_all(d + "/ck/step-00000006");
    std::filesystem::remove(d + "/ck/latest");
    REQUIRE(sh(tp_pp + "--resume auto --log-json " + d + "/resumed.jsonl 2> " + d + "/c2.txt") == 0);
    const auto full = losses(d + "/full.jsonl"), resumed = losses(d + "/resumed.jsonl");
    REQUIRE(full.size() == 6);
    REQUIRE(resumed.size() == 3);
    CHECK(std::vector<double>(full.begin() + 3, full.end()) == resumed);
    CHECK(slurp(d + "/c2.txt").find("restored step=3") != std::string::npos);
    std::filesystem::remove_all(d + "/ck/step-00000006");
    std::filesystem::remove(d + "/ck/latest");
    REQUIRE(sh(common + "--steps 6 --threads 1 --ckpt-dir " + d + "/ck --resume auto --log-json " + d +
               "/single.jsonl 2> " + d + "/c3.txt") == 0);
    const auto single = losses(d + "/single.jsonl");
    REQUIRE(single.size() == 3);
    for (size_t i = 0; i < 3; ++i) CHECK(std::abs(single[i] - full[3 + i]) <= 1e-5 * full[3 + i]);
  }

  SUBCASE("a killed rank fails the whole world within the deadline") {
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t launcher =
        spawn("env RAILYARD_COMM_TIMEOUT_MS=2000 " + bin + "/railyard-worker train " + kModel + " --data " + d +
              "/data --steps 100000 --nproc 2 > " + d + "/k_out.txt 2> " + d + "/k.txt");
    REQUIRE(wait_for_text(d + "/k.txt", "step=2/", 30));
    const pid_t victim = child_with_rank(launcher, 1);
    REQUIRE(victim > 0);
    kill(victim, SIGKILL);
    const int code = wait_for(launcher, 20);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string err = slurp(d + "/k.txt");
    INFO(err.substr(err.size() > 3000 ? err.size() - 3000 : 0));
    CHECK(code == 128 + SIGKILL);  // the first failure's code
    CHECK(err.find("a rank failed") != std::string::npos);
    // Rank 0 gave up on its own with an error naming the collective, well before the launcher's grace ran out.
    CHECK(any_line_with(err, "[rank 0] ", "on group '"));  // CommError naming the collective and group
    CHECK(err.find("every rank finished") == std::string::npos);
    CHECK(took < 20);
  }

  SUBCASE("SIGINT to the launcher reaches every rank") {
    const pid_t launcher = spawn(bin + "/railyard-worker train " + kModel + " --data " + d +
                                 "/data --steps 100000 --nproc 2 > " + d + "/i_out.txt 2> " + d + "/i.txt");
    REQUIRE(wait_for_text(d + "/i.txt", "step=2/", 30));
    const pid_t r0 = child_with_rank(launcher, 0), r1 = child_with_rank(launcher, 1);
    REQUIRE(r0 > 0);
    REQUIRE(r1 > 0);
    kill(launcher, SIGINT);
    const int code = wait_for(launcher, 15);
    CHECK(code != 0);
    CHECK(code != -1);
    CHECK(slurp(d + "/i.txt").find("forwarding signal") != std::string::npos);
    CHECK(kill(r0, 0) != 0);  // both ranks are gone (reaped by the launcher)
    CHECK(kill(r1, 0) != 0);
  }
}
