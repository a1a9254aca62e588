// Crash safety: a child process saves a checkpoint large enough to take a while and is SIGKILLed at a random
// moment, 50 times (seeded). After each kill the reader must load either the previous good checkpoint or the new
// complete one, element-exact, never anything else; the next writer start removes the orphans.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "test_util.h"

using namespace railyard::ckpt;
using namespace railyard::ckpt::test;

namespace {

// ~13 MiB of fp32 state in a GPT shape: L=2 C=192 maxT=128 Vp=1024, with AdamW m and v.
std::vector<TensorDef> crash_defs() { return gpt_tensor_defs(2, 192, 128, 1024, true); }

// The state of `step`: a random base (generated once) plus the step, so every step differs in every element and is
// cheap to produce in each child.
GlobalState step_state(const GlobalState& base, int64_t step) {
  GlobalState g = base;
  for (auto& [name, v] : g.data) {
    for (float& x : v) x += static_cast<float>(step);
  }
  return g;
}

const GlobalState& base_state() {
  static const GlobalState base = GlobalState::make(crash_defs(), 20261122);
  return base;
}

// Forks a child that generates the state of `step`, writes one byte to the pipe, then saves and exits 0 when
// committed. Returns the pid and the read end of the pipe.
std::pair<pid_t, int> start_saver(const std::string& root, int64_t step) {
  return fork_child([&](int fd) {
    int code = 1;
    try {
      GlobalState g = step_state(base_state(), step);
      RankState rs = rank_state(g, Layout{}, 0);
      WriterOptions o;
      o.root = root;
      o.keep = 2;
      Writer w(o);
      char b = 'x';
      if (::write(fd, &b, 1) != 1) ::_exit(5);
      w.snapshot(step, rs.shards, {{"step", step}});
      code = w.wait(step, Clock::now() + std::chrono::seconds(60)).state == SaveState::Committed ? 0 : 3;
    } catch (...) {
      code = 4;
    }
    return code;
  });
}

}  // namespace

TEST_CASE("crash safety: SIGKILL during save, 50 times, never loads a wrong checkpoint") {
  TempDir dir("ckpt-crash");
  const std::string root = dir.path();
  const auto defs = crash_defs();
  base_state();  // generated before the first fork, shared copy-on-write by every child

  // Steps 1-3 are saved completely (step 3 is the first known-good checkpoint); the fastest of them sets the
  // range of kill delays, so a slow outlier on a busy machine does not push every kill past the commit.
  double save_s = 1e9;
  for (int64_t step = 1; step <= 3; ++step) {
    auto [pid0, fd0] = start_saver(root, step);
    wait_ready(fd0);
    auto t_ready = Clock::now();
    int st0 = 0;
    ::waitpid(pid0, &st0, 0);
    REQUIRE((WIFEXITED(st0) && WEXITSTATUS(st0) == 0));
    save_s = std::min(save_s, std::chrono::duration<double>(Clock::now() - t_ready).count());
  }
  int64_t elements = 0;
  for (const auto& d : defs) elements += shape_volume(d.shape);
  MESSAGE("one save of " << elements * 4 / (1 << 20) << " MiB takes " << save_s << " s (fastest of 3)");
  int st = 0;

  std::mt19937_64 rng(20261122);
  std::uniform_real_distribution<double> frac(0.0, 1.2);
  int64_t good = 3;
  int loaded_new = 0, loaded_old = 0, finished = 0, orphans_seen = 0;
  for (int i = 0; i < 50; ++i) {
    const int64_t step = 4 + i;
    CAPTURE(step);
    auto [pid, fd] = start_saver(root, step);
    wait_ready(fd);
    std::this_thread::sleep_for(std::chrono::duration<double>(frac(rng) * save_s));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ++finished;

    // The child's writer start removed the previous kill's orphan, so at most its own can be left.
    int orphans_now = 0;
    for (const auto& e : std::filesystem::directory_iterator(root)) {
      orphans_now += e.path().filename().string().find(".tmp-") != std::string::npos;
    }
    CHECK(orphans_now <= 1);
    orphans_seen += orphans_now;

    FullTargets full(defs);
    LoadResult r = Reader(root).load_latest(full.targets);
    REQUIRE((r.step == good || r.step == step));
    CHECK(r.manifest.rank_state.at(0)["step"] == r.step);
    GlobalState want = step_state(base_state(), r.step);
    REQUIRE(count_mismatches(want, full.data) == 0);
    (r.step == step ? loaded_new : loaded_old)++;
    good = r.step;
  }
  MESSAGE("after 50 kills: new checkpoint loaded " << loaded_new << " times, previous " << loaded_old
                                                   << " times; children that finished before the kill: " << finished);
  MESSAGE("kills that left an orphaned temporary directory (removed by the next writer start): " << orphans_seen);
  CHECK(orphans_seen > 0);
  CHECK(loaded_old > 0);  // some kills must have landed inside a save
  CHECK(loaded_new > 0);

  // The next writer start removes every orphan of the killed runs.
  int orphans = 0;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    orphans += e.path().filename().string().find(".tmp-") != std::string::npos;
  }
  MESSAGE("orphaned temporary directories before the final writer start: " << orphans);
  {
    WriterOptions o;
    o.root = root;
    Writer w(o);
  }
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    CAPTURE(name);
    if (name == "latest" || name == kCommitLockName) continue;  // the lock file stays (it is only ever flocked)
    CHECK(parse_step_dir(name).has_value());                    // no .tmp-*, .old-* or stray temp files
    CHECK(std::filesystem::exists(e.path() / "manifest.json"));
  }
  for (const auto& info : list_checkpoints(root)) CHECK(info.complete);
}
