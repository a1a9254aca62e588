// Checkpoints of the real trainer, through the railyard-worker binary as the agent runs it: resume gives bitwise
// the same losses and weights as an uninterrupted run, a corrupt newest checkpoint is skipped with a warning, the
// async snapshot writes the same bytes as a synchronous one, SIGTERM mid-run leaves a complete verifiable
// checkpoint (exit 143), the checkpoint metrics are served, a (2,2,2) checkpoint with and without ZeRO resumes in
// other layouts, and a full disk fails saves cleanly while training goes on.
#include <doctest/doctest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/resource.h>
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
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "checkpoint/peer_held.h"
#include "checkpoint/shm_store.h"
#include "tests/ctest_env.h"
#include "tests/unit/checkpoint/test_util.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using railyard::ckpt::test::TempDir;

std::string bin_dir() { return railyard::test::ctest_env("RAILYARD_BIN_DIR"); }

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// Starts bin_dir()/argv[0] with stdout/stderr into `log`; returns the pid.
pid_t spawn(std::vector<std::string> args, const std::string& log) {
  args[0] = bin_dir() + "/" + args[0];
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE_MESSAGE(rc == 0, "cannot start " << args[0]);
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int run(const std::vector<std::string>& args, const std::string& log) { return wait_exit(spawn(args, log)); }

// One JSON object per line of the trainer's --log-json, steps only: step (1-based) -> the loss as printed (the
// exact double).
std::map<int, std::string> step_losses(const std::string& path) {
  std::map<int, std::string> out;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "step") out[j["step"].get<int>()] = j["loss"].dump();
  }
  return out;
}

struct Fixture {
  TempDir dir{"trainer-ckpt"};
  std::string data = dir / "data";
  Fixture() {
    const int rc = run({"railyard", "data", "prepare", "--input", "/usr/share/common-licenses/GPL-3",
                        "/usr/share/common-licenses/Apache-2.0", "--output", data},
                       dir / "prepare.log");
    REQUIRE_MESSAGE(rc == 0, slurp(dir / "prepare.log"));
  }
  // A small model so that a step takes milliseconds; two threads as in CI.
  std::vector<std::string> train(int steps, const std::string& ckpt, const std::vector<std::string>& extra,
                                 const std::string& threads = "2") const {
    std::vector<std::string> a = {"railyard-worker",
                                  "train",
                                  "--model",
                                  "l=2,c=64,nh=4,t=64,v=256",
                                  "--data",
                                  data,
                                  "--steps",
                                  std::to_string(steps),
                                  "--batch",
                                  "4",
                                  "--seq",
                                  "32",
                                  "--lr",
                                  "3e-3",
                                  "--warmup",
                                  "2",
                                  "--threads",
                                  threads,
                                  "--peak-flops",
                                  "1e11",
                                  "--ckpt-dir",
                                  ckpt};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // 6 steps in deterministic mode (results independent of dp and the ZeRO stage), one thread per rank, checkpoints
  // every 3 steps, 0.05 MiB buckets (they cut tensors between the ZeRO owners); losses and final weights into
  // dir/NAME.jsonl and dir/NAME.bin, output into dir/NAME.log. Returns the exit code.
  int run_deterministic(const std::string& ckpt, const std::string& global_batch, int nproc, int tp, int pp, int zero,
                        const std::string& name, const std::vector<std::string>& more = {}) const {
    std::vector<std::string> extra = {"--global-batch",
                                      global_batch,
                                      "--deterministic",
                                      "--ckpt-every",
                                      "3",
                                      "--bucket-mb",
                                      "0.05",
                                      "--zero",
                                      std::to_string(zero),
                                      "--log-json",
                                      dir / (name + ".jsonl"),
                                      "--export",
                                      dir / (name + ".bin")};
    if (nproc > 1) {
      extra.insert(extra.end(),
                   {"--nproc", std::to_string(nproc), "--tp", std::to_string(tp), "--pp", std::to_string(pp)});
    }
    extra.insert(extra.end(), more.begin(), more.end());
    return run(train(6, ckpt, extra, "1"), dir / (name + ".log"));
  }
};

}  // namespace

TEST_CASE("resume from step 3 continues bitwise like the uninterrupted run; a corrupt newest checkpoint is skipped") {
  Fixture fx;
  const std::string ck = fx.dir / "ck";
  // Uninterrupted: 6 steps, checkpoints at 3 and 6 (--ckpt-every 3).
  REQUIRE_MESSAGE(
      run(fx.train(6, ck, {"--ckpt-every", "3", "--log-json", fx.dir / "a.jsonl", "--export", fx.dir / "a.bin"}),
          fx.dir / "a.log") == 0,
      slurp(fx.dir / "a.log"));
  REQUIRE(fs::exists(ck + "/step-00000003/manifest.json"));
  REQUIRE(fs::exists(ck + "/step-00000006/manifest.json"));
  const auto a = step_losses(fx.dir / "a.jsonl");
  REQUIRE(a.size() == 6);

  SUBCASE("kill after step 3: a new process resumes from the step-3 checkpoint") {
    // The process that wrote step 3 is gone; remove what came after it, as if it had been killed at step 4.
    fs::remove_all(ck + "/step-00000006");
    REQUIRE(run(fx.train(6, ck, {"--ckpt-every", "3", "--log-json", fx.dir / "b.jsonl", "--export", fx.dir / "b.bin"}),
                fx.dir / "b.log") == 0);
    const std::string log = slurp(fx.dir / "b.log");
    CHECK_MESSAGE(log.find("restored step=3") != std::string::npos, log);
    const auto b = step_losses(fx.dir / "b.jsonl");
    REQUIRE(b.size() == 3);
    for (int s = 4; s <= 6; ++s) CHECK_MESSAGE(b.at(s) == a.at(s), "step " << s);
    CHECK_MESSAGE(slurp(fx.dir / "b.bin") == slurp(fx.dir / "a.bin"), "final weights differ");
    CHECK(slurp(fx.dir / "a.bin").size() > 400000);
  }
  SUBCASE("a flipped byte in the newest checkpoint: fall back to step 3 with a warning") {
    const std::string shard = ck + "/step-00000006/rank-00000.bin";
    {
      std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(1000);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      f.seekp(1000);
      f.write(&c, 1);
    }
    REQUIRE(run(fx.train(6, fx.dir / "ck",
                         {"--ckpt-every", "100", "--ckpt-keep", "5", "--log-json", fx.dir / "c.jsonl", "--export",
                          fx.dir / "c.bin"}),
                fx.dir / "c.log") == 0);
    const std::string log = slurp(fx.dir / "c.log");
    CHECK_MESSAGE(log.find("WARN  checkpoint: skipped a checkpoint that does not verify") != std::string::npos, log);
    CHECK_MESSAGE(log.find("step-00000006") != std::string::npos, log);
    CHECK_MESSAGE(log.find("restored step=3") != std::string::npos, log);
    const auto c = step_losses(fx.dir / "c.jsonl");
    REQUIRE(c.size() == 3);
    for (int s = 4; s <= 6; ++s) CHECK_MESSAGE(c.at(s) == a.at(s), "step " << s);
    CHECK(slurp(fx.dir / "c.bin") == slurp(fx.dir / "a.bin"));
  }
  SUBCASE("the async snapshot (overlapped with the next step) saves the same bytes as a synchronous one") {
    const std::string sync = fx.dir / "sync";
    REQUIRE(run(fx.train(6, sync, {"--ckpt-every", "3", "--ckpt-async", "off"}), fx.dir / "s.log") == 0);
    for (const char* step : {"step-00000003", "step-00000006"}) {
      const std::string x = slurp(ck + "/" + step + "/rank-00000.bin");
      CHECK(x.size() > 1000000);  // params + m + v
      CHECK_MESSAGE(x == slurp(sync + "/" + step + "/rank-00000.bin"), step);
    }
  }
  SUBCASE("--resume never starts fresh; a checkpoint of another model is refused naming it") {
    REQUIRE(run(fx.train(3, ck, {"--resume", "never", "--log-json", fx.dir / "n.jsonl", "--ckpt-every", "0"}),
                fx.dir / "n.log") == 0);
    const auto n = step_losses(fx.dir / "n.jsonl");
    REQUIRE(n.size() == 3);
    CHECK(n.at(1) == a.at(1));  // the same first step as the fresh run A
    auto other = fx.train(6, ck, {});
    other[3] = "l=1,c=64,nh=4,t=64,v=256";
    CHECK(run(other, fx.dir / "m.log") != 0);
    const std::string log = slurp(fx.dir / "m.log");
    CHECK_MESSAGE((log.find("holds model") != std::string::npos || log.find("qkvw") != std::string::npos), log);
    CHECK(run(fx.train(6, ck, {"--ckpt-async", "maybe"}), fx.dir / "f.log") == 2);
    CHECK(slurp(fx.dir / "f.log").find("--ckpt-async must be on or off") != std::string::npos);
  }
}

TEST_CASE("SIGTERM mid-run: complete verifiable checkpoint of the current step, exit 143; metrics are served") {
  Fixture fx;
  const std::string ck = fx.dir / "ck";
  const std::string log = fx.dir / "t.log";
  const pid_t pid = spawn(fx.train(1000000, ck,
                                   {"--ckpt-every", "50", "--metrics-port", "0", "--metrics-host", "127.0.0.1",
                                    "--log-json", fx.dir / "t.jsonl"}),
                          log);
  // Wait for the first committed checkpoint, then read /metrics.
  const auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(ck + "/latest") && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE_MESSAGE(fs::exists(ck + "/latest"), slurp(log));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::smatch m;
  const std::string text = slurp(log);
  REQUIRE_MESSAGE(std::regex_search(text, m, std::regex("serving metrics address=127\\.0\\.0\\.1:(\\d+)")), text);
  httplib::Client cli("127.0.0.1", std::stoi(m[1]));
  auto res = cli.Get("/metrics");
  REQUIRE(res);
  const std::string metrics = res->body;
  CHECK(std::regex_search(metrics, std::regex("\\nrailyard_checkpoint_last_step\\{[^}]*\\} [1-9][0-9]*")));
  CHECK(std::regex_search(metrics, std::regex("\\nrailyard_checkpoint_last_timestamp_seconds\\{[^}]*\\} 1[0-9.e+]+")));
  CHECK(std::regex_search(metrics, std::regex("\\nrailyard_checkpoint_snapshot_seconds_count\\{[^}]*\\} [1-9]")));
  CHECK(std::regex_search(metrics, std::regex("\\nrailyard_checkpoint_saves_total\\{[^}]*result=\"committed\"[^}]*\\} "
                                              "[1-9]")));
  CHECK(std::regex_search(metrics, std::regex("\\nrailyard_checkpoint_save_bytes\\{[^}]*\\} [1-9]")));
  {
    std::ofstream(fx.dir / "metrics.txt") << metrics;
    const std::string cmd =
        "promtool check metrics < " + (fx.dir / "metrics.txt") + " > " + (fx.dir / "pt.txt") + " 2>&1";
    if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
      CHECK_MESSAGE(std::system(cmd.c_str()) == 0, slurp(fx.dir / "pt.txt"));
    }
  }

  REQUIRE(kill(pid, SIGTERM) == 0);
  const int code = wait_exit(pid);
  const std::string out = slurp(log);
  REQUIRE_MESSAGE(code == 143, out);
  CHECK(out.find("saved on stop signal") != std::string::npos);
  // The checkpoint is of the last step the log reports, complete and verified by the CLI.
  const auto losses = step_losses(fx.dir / "t.jsonl");
  REQUIRE(!losses.empty());
  const int last = losses.rbegin()->first;
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08d", last);
  CHECK_MESSAGE(slurp(ck + "/latest").rfind(name, 0) == 0, "latest is " << slurp(ck + "/latest") << ", want " << name);
  CHECK(run({"railyard", "ckpt", "verify", ck, "--step", std::to_string(last)}, fx.dir / "v.log") == 0);
  // And a new process continues from it.
  REQUIRE(run(fx.train(last + 2, ck, {"--log-json", fx.dir / "r.jsonl"}), fx.dir / "r.log") == 0);
  CHECK(slurp(fx.dir / "r.log").find("restored step=" + std::to_string(last)) != std::string::npos);
  CHECK(step_losses(fx.dir / "r.jsonl").size() == 2);
}

TEST_CASE("data parallel (train --nproc 2): each rank writes half, resume is bitwise, SIGTERM stops all at one step") {
  Fixture fx;
  const std::string ck = fx.dir / "ck";
  auto dp = [&](int steps, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--global-batch", "256"});
    extra.push_back("--nproc");
    extra.push_back("2");
    return fx.train(steps, ck, extra, "1");
  };
  REQUIRE_MESSAGE(run(dp(6, {"--ckpt-every", "3", "--export", fx.dir / "a.bin"}), fx.dir / "a.log") == 0,
                  slurp(fx.dir / "a.log"));
  for (const char* f : {"rank-00000.bin", "rank-00001.bin"}) CHECK(fs::exists(ck + "/step-00000003/" + f));
  // Replicas split the identical state: each file holds about half of params + m + v.
  const auto half = fs::file_size(ck + "/step-00000003/rank-00000.bin");
  CHECK(half < 1000000);
  CHECK(half + fs::file_size(ck + "/step-00000003/rank-00001.bin") > 1400000);
  fs::remove_all(ck + "/step-00000006");
  REQUIRE(run(dp(6, {"--ckpt-every", "3", "--export", fx.dir / "b.bin"}), fx.dir / "b.log") == 0);
  const std::string blog = slurp(fx.dir / "b.log");
  CHECK_MESSAGE(blog.find("[rank 0] ") != std::string::npos, blog);
  CHECK(std::regex_search(blog, std::regex("rank 0\\][^\\n]*restored step=3")));
  CHECK(std::regex_search(blog, std::regex("rank 1\\][^\\n]*restored step=3")));
  CHECK(slurp(fx.dir / "b.bin") == slurp(fx.dir / "a.bin"));

  const std::string log = fx.dir / "t.log";
  const pid_t pid = spawn(dp(1000000, {"--ckpt-every", "0"}), log);
  const auto t0 = std::chrono::steady_clock::now();
  while (slurp(log).find("step=20/") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(kill(pid, SIGTERM) == 0);
  CHECK(wait_exit(pid) == 143);
  const std::string out = slurp(log);
  std::smatch m0, m1;
  REQUIRE_MESSAGE(std::regex_search(out, m0, std::regex("rank 0\\][^\\n]*saved on stop signal step=(\\d+)")), out);
  REQUIRE(std::regex_search(out, m1, std::regex("rank 1\\][^\\n]*saved on stop signal step=(\\d+)")));
  CHECK(m0[1] == m1[1]);
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08d", std::stoi(m0[1].str()));
  CHECK(slurp(ck + "/latest").rfind(name, 0) == 0);
  CHECK(run({"railyard", "ckpt", "verify", ck}, fx.dir / "v.log") == 0);
}

namespace {

// The in-memory tier's segments of one rank ("<prefix>-r<rank>-a" and "-b"): the step in the header of each, or -1.
// Header layout (checkpoint/shm_store.cc): magic[8], version u32, state u32, generation u64, step i64.
int64_t shm_slot_step(const std::string& name) {
  std::ifstream f("/dev/shm" + name, std::ios::binary);
  char h[32] = {};
  if (!f.read(h, sizeof h)) return -1;
  int64_t step = 0;
  std::memcpy(&step, h + 24, sizeof step);
  return step;
}

// Marks a slot torn, as a writer killed in the middle of its put leaves it (state word back to "writing").
void tear_shm_slot(const std::string& name) {
  std::fstream f("/dev/shm" + name, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  const uint32_t writing = 1;
  f.seekp(12);
  f.write(reinterpret_cast<const char*>(&writing), sizeof writing);
}

struct ShmPrefix {
  std::string prefix = "/railyard-unittest-" + std::to_string(::getpid());
  ShmPrefix() { ::setenv("RAILYARD_SHM_PREFIX", prefix.c_str(), 1); }
  ~ShmPrefix() {
    ::unsetenv("RAILYARD_SHM_PREFIX");
    railyard::ckpt::ShmStore::remove_prefix(prefix + "-");
  }
};

}  // namespace

TEST_CASE("in-memory tier with 2 ranks: both restore the newest step every rank holds, bitwise; else the disk") {
  Fixture fx;
  ShmPrefix shm;
  const std::string ck = fx.dir / "ck";
  auto dp = [&](int steps, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--global-batch", "256", "--ckpt-every", "3", "--ckpt-shm-every", "1", "--nproc", "2"});
    return fx.train(steps, ck, extra, "1");
  };
  // Uninterrupted: 8 steps; memory keeps steps 8 and 7 on each rank (two slots), the disk 3, 6 and 8.
  REQUIRE_MESSAGE(run(dp(8, {"--log-json", fx.dir / "a.jsonl", "--export", fx.dir / "a.bin"}), fx.dir / "a.log") == 0,
                  slurp(fx.dir / "a.log"));
  const auto a = step_losses(fx.dir / "a.jsonl");
  REQUIRE(a.size() == 8);
  std::map<int64_t, std::string> slot_of[2];  // rank -> step -> segment name
  for (int r = 0; r < 2; ++r) {
    for (const char* s : {"-a", "-b"}) {
      const std::string name = shm.prefix + "-r" + std::to_string(r) + s;
      slot_of[r][shm_slot_step(name)] = name;
    }
    REQUIRE_MESSAGE(slot_of[r].count(8) == 1, "rank " << r << " has no in-memory step 8");
    REQUIRE_MESSAGE(slot_of[r].count(7) == 1, "rank " << r << " has no in-memory step 7");
  }
  // As if the process had been killed after step 8 before the disk save: the disk's newest is 6.
  fs::remove_all(ck + "/step-00000008");

  SUBCASE(
      "rank 1's newest slot is torn: both ranks agree on step 7 from memory and finish like the uninterrupted run") {
    tear_shm_slot(slot_of[1][8]);
    REQUIRE(run(dp(8, {"--log-json", fx.dir / "b.jsonl", "--export", fx.dir / "b.bin"}), fx.dir / "b.log") == 0);
    const std::string log = slurp(fx.dir / "b.log");
    CHECK_MESSAGE(std::regex_search(log, std::regex("rank 0\\][^\\n]*restored step=7 from=memory")), log);
    CHECK_MESSAGE(std::regex_search(log, std::regex("rank 1\\][^\\n]*restored step=7 from=memory")), log);
    const auto b = step_losses(fx.dir / "b.jsonl");
    REQUIRE(b.size() == 1);
    CHECK(b.at(8) == a.at(8));
    CHECK_MESSAGE(slurp(fx.dir / "b.bin") == slurp(fx.dir / "a.bin"), "final weights differ");
  }
  SUBCASE("rank 1 holds no usable slot: both ranks read the disk's step 6") {
    tear_shm_slot(slot_of[1][8]);
    tear_shm_slot(slot_of[1][7]);
    REQUIRE(run(dp(8, {"--log-json", fx.dir / "c.jsonl", "--export", fx.dir / "c.bin"}), fx.dir / "c.log") == 0);
    const std::string log = slurp(fx.dir / "c.log");
    CHECK_MESSAGE(log.find("no in-memory snapshot that every rank holds") != std::string::npos, log);
    CHECK(std::regex_search(log, std::regex("rank 0\\][^\\n]*restored step=6 from=[^\\n]*step-00000006")));
    CHECK(std::regex_search(log, std::regex("rank 1\\][^\\n]*restored step=6 from=[^\\n]*step-00000006")));
    const auto c = step_losses(fx.dir / "c.jsonl");
    REQUIRE(c.size() == 2);
    CHECK(c.at(7) == a.at(7));
    CHECK(c.at(8) == a.at(8));
    CHECK(slurp(fx.dir / "c.bin") == slurp(fx.dir / "a.bin"));
  }
  SUBCASE("a flipped byte in rank 0's step-8 contents: the checksum catches it and the ranks go back to step 7") {
    {
      std::fstream f("/dev/shm" + slot_of[0][8], std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(0, std::ios::end);
      const auto size = static_cast<std::streamoff>(f.tellg());
      f.seekg(size - 100);
      char c = 0;
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x01);
      f.seekp(size - 100);
      f.write(&c, 1);
    }
    REQUIRE(run(dp(8, {"--log-json", fx.dir / "d.jsonl", "--export", fx.dir / "d.bin"}), fx.dir / "d.log") == 0);
    const std::string log = slurp(fx.dir / "d.log");
    CHECK_MESSAGE(log.find("in-memory snapshot not usable on every rank") != std::string::npos, log);
    CHECK(std::regex_search(log, std::regex("rank 1\\][^\\n]*restored step=7 from=memory")));
    CHECK(slurp(fx.dir / "d.bin") == slurp(fx.dir / "a.bin"));
  }
}

TEST_CASE(
    "with a peer copy, a put never overwrites the only snapshot the peer holds: the step goes to the third "
    "slot (all ranks together) until the peer holds it, a restart in place restores it, and after kMaxPeerWaits "
    "diversions a put goes ahead") {
  // The slots expected below count worker::kMaxPeerWaits = 8 diversions in a row (worker/train/checkpointing.h).
  Fixture fx;
  ShmPrefix shm;
  ::setenv("RAILYARD_SHM_PEER_COPY", "1", 1);  // as the agent sets it while it copies the slots to a peer
  struct Unset {
    ~Unset() { ::unsetenv("RAILYARD_SHM_PEER_COPY"); }
  } unset;
  auto slots = [&](int rank) {  // the two copied slots
    std::set<int64_t> s;
    for (const char* x : {"-a", "-b"}) s.insert(shm_slot_step(shm.prefix + "-r" + std::to_string(rank) + x));
    return s;
  };
  auto third = [&](int rank) { return shm_slot_step(shm.prefix + "-r" + std::to_string(rank) + "-c"); };
  const std::string held0 = railyard::ckpt::peer_held_name(shm.prefix + "-r0");
  SUBCASE(
      "one process whose peer holds step 1 only: step 2 is put (step 1 stays), 3-10 go to the third slot, 11 "
      "goes ahead, 12 to the third; a restart in place restores 12 from there") {
    railyard::ckpt::write_peer_held(held0, {1});
    REQUIRE_MESSAGE(run(fx.train(12, fx.dir / "ck1", {"--ckpt-shm-every", "1"}), fx.dir / "one.log") == 0,
                    slurp(fx.dir / "one.log"));
    CHECK(slots(0) == std::set<int64_t>{2, 11});  // without the rule: 11 and 12
    CHECK(third(0) == 12);
    const std::string log = slurp(fx.dir / "one.log");
    CHECK_MESSAGE(log.find("the peer copy lags; putting this step in the copied slots anyway") != std::string::npos,
                  log);
    CHECK_MESSAGE(std::regex_search(log, std::regex("puts diverted to the third slot[^\\n]*diverted=9")), log);
    // Started again (as after a kill -9) with the disk's newest removed: step 12 is in the third slot only.
    fs::remove_all(fx.dir / "ck1/step-00000012");
    REQUIRE(run(fx.train(13, fx.dir / "ck1", {"--ckpt-shm-every", "1"}), fx.dir / "again.log") == 0);
    const std::string again = slurp(fx.dir / "again.log");
    CHECK_MESSAGE(again.find("restored step=12 from=memory") != std::string::npos, again);
  }
  SUBCASE("two ranks: rank 0's peer holds its step 1, rank 1's holds nothing: both divert, so both hold 1 and 10") {
    railyard::ckpt::write_peer_held(held0, {1});
    REQUIRE_MESSAGE(
        run(fx.train(12, fx.dir / "ck2", {"--global-batch", "256", "--nproc", "2", "--ckpt-shm-every", "1"}),
            fx.dir / "two.log") == 0,
        slurp(fx.dir / "two.log"));
    CHECK(slots(0) == std::set<int64_t>{1, 10});  // alone, rank 0 would hold 2 and 11
    CHECK(slots(1) == std::set<int64_t>{1, 10});
    CHECK(third(0) == 12);
    CHECK(third(1) == 12);
  }
  SUBCASE("a restore to an older step removes a newer third slot: it is of the run that restore abandons") {
    railyard::ckpt::write_peer_held(held0, {1});
    REQUIRE(run(fx.train(12, fx.dir / "ck3", {"--ckpt-shm-every", "1", "--ckpt-every", "4"}), fx.dir / "three.log") ==
            0);
    REQUIRE(third(0) == 12);
    // Resumed from the disk's step 8, without a peer copy (the puts go to a and b): the third slot's 12 is gone.
    ::unsetenv("RAILYARD_SHM_PEER_COPY");
    REQUIRE(run(fx.train(10, fx.dir / "ck3", {"--ckpt-shm-every", "1", "--resume", fx.dir / "ck3/step-00000008"}),
                fx.dir / "older.log") == 0);
    CHECK_MESSAGE(slurp(fx.dir / "older.log").find("restored step=8") != std::string::npos,
                  slurp(fx.dir / "older.log"));
    CHECK(third(0) == -1);
    CHECK(slots(0) == std::set<int64_t>{9, 10});
  }
}

TEST_CASE("ZeRO-1 dp=2: the sharded moments are saved as slices and resume bitwise under dp=1, dp=2 and ZeRO-2") {
  Fixture fx;
  const std::string ck = fx.dir / "ck";
  // Deterministic mode: results do not depend on dp or the ZeRO stage, so every resumed run must match bitwise.
  // Small buckets (0.05 MiB) cut tensors across the ranks' pieces.
  auto run_as = [&](const std::string& dir, int nproc, int zero, const std::string& name) {
    return fx.run_deterministic(dir, "256", nproc, 1, 1, zero, name);
  };
  REQUIRE_MESSAGE(run_as(ck, 2, 1, "a") == 0, slurp(fx.dir / "a.log"));
  const auto a = step_losses(fx.dir / "a.jsonl");
  REQUIRE(a.size() == 6);
  CHECK(run({"railyard", "ckpt", "verify", ck}, fx.dir / "v.log") == 0);
  // The moments are really split: each rank's file holds about half of them (and half of the parameters).
  const auto r0 = fs::file_size(ck + "/step-00000003/rank-00000.bin");
  const auto r1 = fs::file_size(ck + "/step-00000003/rank-00001.bin");
  CHECK(r0 < 1000000);
  CHECK(r1 < 1000000);
  CHECK(r0 + r1 > 1400000);
  fs::remove_all(ck + "/step-00000006");
  for (auto [nproc, zero, name] : {std::tuple{1, 0, "dp1"}, {2, 0, "dp2"}, {2, 2, "zero2"}, {2, 1, "zero1"}}) {
    INFO(name);
    const std::string copy = fx.dir / (std::string("ck-") + name);
    fs::copy(ck, copy, fs::copy_options::recursive);
    REQUIRE_MESSAGE(run_as(copy, nproc, zero, name) == 0, slurp(fx.dir / (std::string(name) + ".log")));
    const std::string log = slurp(fx.dir / (std::string(name) + ".log"));
    CHECK_MESSAGE(log.find("restored step=3") != std::string::npos, log);
    const auto b = step_losses(fx.dir / (std::string(name) + ".jsonl"));
    REQUIRE(b.size() == 3);
    for (int s = 4; s <= 6; ++s) CHECK_MESSAGE(b.at(s) == a.at(s), "step " << s);
    CHECK_MESSAGE(slurp(fx.dir / (std::string(name) + ".bin")) == slurp(fx.dir / "a.bin"), "final weights differ");
  }
  // `railyard ckpt reshard` turns the ZeRO checkpoint into a dp=1 one; a single process continues from it bitwise.
  REQUIRE(
      run({"railyard", "ckpt", "reshard", ck, "--to-dp", "1", "--to-tp", "1", "--to-pp", "1", "--out", fx.dir / "ck-1"},
          fx.dir / "rs.log") == 0);
  REQUIRE(run_as(fx.dir / "ck-1", 1, 0, "resharded") == 0);
  const auto c = step_losses(fx.dir / "resharded.jsonl");
  REQUIRE(c.size() == 3);
  CHECK(c.at(6) == a.at(6));
  CHECK(slurp(fx.dir / "resharded.bin") == slurp(fx.dir / "a.bin"));
}

TEST_CASE("(dp,tp,pp)=(2,2,2) with and without ZeRO resumes under (1,1,1), (4,1,2), (2,2,1) with and without ZeRO") {
  Fixture fx;
  // Deterministic mode, one thread per rank, 4 virtual micro-batches per step (512 tokens / (4 x 32)) so that dp = 4
  // divides them; 0.05 MiB buckets cut tensors and stage slices between the ZeRO owners.
  auto run_as = [&](const std::string& dir, int nproc, int tp, int pp, int zero, const std::string& name) {
    return fx.run_deterministic(dir, "512", nproc, tp, pp, zero, name);
  };
  // Uninterrupted runs under (2,2,2), with ZeRO-1 and without; checkpoints at steps 3 and 6.
  const std::string ckz = fx.dir / "ck-zero", ck0 = fx.dir / "ck-plain";
  REQUIRE_MESSAGE(run_as(ckz, 8, 2, 2, 1, "a") == 0, slurp(fx.dir / "a.log"));
  REQUIRE_MESSAGE(run_as(ck0, 8, 2, 2, 0, "a0") == 0, slurp(fx.dir / "a0.log"));
  const auto a = step_losses(fx.dir / "a.jsonl");
  REQUIRE(a.size() == 6);
  CHECK(step_losses(fx.dir / "a0.jsonl") == a);  // deterministic mode: ZeRO changes no bit
  CHECK(slurp(fx.dir / "a0.bin") == slurp(fx.dir / "a.bin"));
  CHECK(run({"railyard", "ckpt", "verify", ckz}, fx.dir / "v.log") == 0);
  const auto manifest = nlohmann::json::parse(slurp(ckz + "/step-00000003/manifest.json"));
  CHECK_MESSAGE(manifest.dump().find("\"zero\":1") != std::string::npos, manifest["layout"].dump());
  for (int r = 0; r < 8; ++r) {
    char f[32];
    std::snprintf(f, sizeof(f), "/rank-%05d.bin", r);
    CHECK_MESSAGE(fs::file_size(ckz + "/step-00000003" + f) > 0, f);
  }
  fs::remove_all(ckz + "/step-00000006");
  fs::remove_all(ck0 + "/step-00000006");

  struct Case {
    std::string src;
    int nproc, tp, pp, zero;
  };
  const std::vector<Case> cases = {{ckz, 1, 1, 1, 0}, {ckz, 1, 1, 1, 1}, {ck0, 1, 1, 1, 1}, {ckz, 8, 1, 2, 0},
                                   {ckz, 8, 1, 2, 1}, {ck0, 8, 1, 2, 2}, {ckz, 4, 2, 1, 0}, {ckz, 4, 2, 1, 2},
                                   {ck0, 4, 2, 1, 1}, {ckz, 8, 2, 2, 0}, {ck0, 8, 2, 2, 2}};
  std::map<std::string, std::pair<std::map<int, std::string>, std::string>> by_layout;  // losses, final weights
  double worst = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    const std::string name = std::string("r").append(std::to_string(i));
    const std::string layout =
        std::to_string(k.nproc / (k.tp * k.pp)) + "," + std::to_string(k.tp) + "," + std::to_string(k.pp);
    INFO("from " << fs::path(k.src).filename().string() << " into (" << layout << ") zero " << k.zero);
    const std::string copy = fx.dir / ("ck-" + name);
    fs::copy(k.src, copy, fs::copy_options::recursive);
    REQUIRE_MESSAGE(run_as(copy, k.nproc, k.tp, k.pp, k.zero, name) == 0, slurp(fx.dir / (name + ".log")));
    const std::string log = slurp(fx.dir / (name + ".log"));
    size_t restored = 0;
    for (size_t at = log.find("restored step=3 "); at != std::string::npos; at = log.find("restored step=3 ", at + 1))
      ++restored;
    CHECK_MESSAGE(restored == static_cast<size_t>(k.nproc), log);  // every rank, from step 3
    const auto b = step_losses(fx.dir / (name + ".jsonl"));
    REQUIRE(b.size() == 3);
    const std::string weights = slurp(fx.dir / (name + ".bin"));
    if (k.tp == 2 && k.pp == 2) {
      // The saving layout's tp and pp: the same arithmetic, so the continuation is bitwise the uninterrupted run.
      for (int s = 4; s <= 6; ++s) CHECK_MESSAGE(b.at(s) == a.at(s), "step " << s);
      CHECK_MESSAGE(weights == slurp(fx.dir / "a.bin"), "final weights differ");
    } else {
      // Another tp or pp splits the GEMM sums and the grad norm differently: float rounding, not state, differs.
      for (int s = 4; s <= 6; ++s) {
        const double x = std::stod(a.at(s)), y = std::stod(b.at(s));
        worst = std::max(worst, std::abs(x - y) / std::abs(x));
        CHECK_MESSAGE(std::abs(x - y) <= 1e-6 * std::abs(x), "step " << s << ": " << b.at(s) << " vs " << a.at(s));
      }
    }
    // Whatever saved the checkpoint (ZeRO or not) and whatever ZeRO stage loads it, one target layout continues
    // bitwise the same: the restored state is the same in every case.
    auto [it, first] = by_layout.emplace(layout, std::pair{b, weights});
    if (!first) {
      CHECK_MESSAGE(it->second.first == b, "losses differ from the other runs in (" << layout << ")");
      CHECK_MESSAGE(it->second.second == weights, "final weights differ from the other runs in (" << layout << ")");
    }
  }
  MESSAGE("largest relative loss difference after a change of tp or pp: " << worst);
}

TEST_CASE("sequence parallelism on and off: a checkpoint of either resumes under the other") {
  // Sequence parallelism changes which activations a tp rank holds, not the parameter or optimizer layout: the
  // checkpoint's slices are those of plain tp. Saved at step 3 by (1,2,1) with --sequence-parallel and without;
  // each resumes under the other setting and continues like the uninterrupted run of that setting (1e-6: the
  // layernorm weight gradients are summed in another order).
  Fixture fx;
  const std::vector<std::string> sp = {"--sequence-parallel"};
  auto run_as = [&](const std::string& dir, bool on, const std::string& name) {
    return fx.run_deterministic(dir, "256", 2, 2, 1, 0, name, on ? sp : std::vector<std::string>{});
  };
  const std::string ck_on = fx.dir / "ck-sp", ck_off = fx.dir / "ck-plain";
  REQUIRE_MESSAGE(run_as(ck_on, true, "on") == 0, slurp(fx.dir / "on.log"));
  REQUIRE_MESSAGE(run_as(ck_off, false, "off") == 0, slurp(fx.dir / "off.log"));
  const auto on = step_losses(fx.dir / "on.jsonl"), off = step_losses(fx.dir / "off.jsonl");
  REQUIRE(on.size() == 6);
  REQUIRE(off.size() == 6);
  CHECK(on.at(1) == off.at(1));  // tp=2: the first forward is bitwise the same
  fs::remove_all(ck_on + "/step-00000006");
  fs::remove_all(ck_off + "/step-00000006");
  for (bool target : {false, true}) {
    const std::string src = target ? ck_off : ck_on, name = target ? "off-to-on" : "on-to-off";
    INFO(name);
    const std::string copy = fx.dir / ("ck-" + name);
    fs::copy(src, copy, fs::copy_options::recursive);
    REQUIRE_MESSAGE(run_as(copy, target, name) == 0, slurp(fx.dir / (name + ".log")));
    const std::string log = slurp(fx.dir / (name + ".log"));
    CHECK_MESSAGE(log.find("restored step=3 ") != std::string::npos, log);
    // the stage line names the setting it ran with
    CHECK_MESSAGE((log.find("sequence parallel") != std::string::npos) == target, log);
    const auto b = step_losses(fx.dir / (name + ".jsonl"));
    REQUIRE(b.size() == 3);
    const auto& want = target ? on : off;  // the uninterrupted run of the resuming setting
    for (int s = 4; s <= 6; ++s) {
      const double x = std::stod(want.at(s)), y = std::stod(b.at(s));
      CHECK_MESSAGE(std::abs(x - y) <= 1e-6 * std::abs(x), "step " << s << ": " << b.at(s) << " vs " << want.at(s));
    }
  }
}

TEST_CASE("context parallelism (--cp): trains like one process; checkpoints resume across cp changes") {
  // cp ranks hold the same parameters (a replica's sequences split by position), so a checkpoint of cp = 2 is that of
  // a replica: it resumes under one process and vice versa. Different reduction orders: 1e-5 relative.
  Fixture fx;
  auto run_cp = [&](const std::string& ck, int nproc, int cp, const std::string& name) {
    std::vector<std::string> extra = {"--global-batch",          "256", "--ckpt-every", "3", "--log-json",
                                      fx.dir / (name + ".jsonl")};
    if (nproc > 1) extra.insert(extra.end(), {"--nproc", std::to_string(nproc), "--cp", std::to_string(cp)});
    return run(fx.train(6, ck, extra, "1"), fx.dir / (name + ".log"));
  };
  auto close = [](const std::map<int, std::string>& got, const std::map<int, std::string>& want, int from) {
    for (int s = from; s <= 6; ++s) {
      const double x = std::stod(want.at(s)), y = std::stod(got.at(s));
      CHECK_MESSAGE(std::abs(x - y) <= 1e-5 * std::abs(x), "step " << s << ": " << got.at(s) << " vs " << want.at(s));
    }
  };
  const std::string ck1 = fx.dir / "ck-one", ck2 = fx.dir / "ck-cp2", ck4 = fx.dir / "ck-dp2cp2";
  REQUIRE_MESSAGE(run_cp(ck1, 1, 1, "one") == 0, slurp(fx.dir / "one.log"));
  REQUIRE_MESSAGE(run_cp(ck2, 2, 2, "cp2") == 0, slurp(fx.dir / "cp2.log"));
  REQUIRE_MESSAGE(run_cp(ck4, 4, 2, "dp2cp2") == 0, slurp(fx.dir / "dp2cp2.log"));
  CHECK_MESSAGE(slurp(fx.dir / "cp2.log").find("context parallel 2") != std::string::npos, slurp(fx.dir / "cp2.log"));
  const auto one = step_losses(fx.dir / "one.jsonl");
  REQUIRE(one.size() == 6);
  REQUIRE(step_losses(fx.dir / "cp2.jsonl").size() == 6);
  close(step_losses(fx.dir / "cp2.jsonl"), one, 1);
  close(step_losses(fx.dir / "dp2cp2.jsonl"), one, 1);
  fs::remove_all(ck1 + "/step-00000006");
  fs::remove_all(ck2 + "/step-00000006");
  // cp = 2's checkpoint under one process, one process's under cp = 2
  for (auto [src, nproc, cp, name] : {std::tuple{ck2, 1, 1, "cp2-to-one"}, {ck1, 2, 2, "one-to-cp2"}}) {
    INFO(name);
    const std::string copy = fx.dir / (std::string("ck-") + name);
    fs::copy(src, copy, fs::copy_options::recursive);
    REQUIRE_MESSAGE(run_cp(copy, nproc, cp, name) == 0, slurp(fx.dir / (std::string(name) + ".log")));
    CHECK(slurp(fx.dir / (std::string(name) + ".log")).find("restored step=3 ") != std::string::npos);
    const auto b = step_losses(fx.dir / (std::string(name) + ".jsonl"));
    REQUIRE(b.size() == 3);
    close(b, one, 4);
  }
}

namespace {

// Like spawn(), with the file-size limit RLIMIT_FSIZE (and SIGXFSZ ignored, so a write past it fails with EFBIG).
pid_t spawn_fsize_limited(std::vector<std::string> args, const std::string& log, rlim_t limit) {
  args[0] = bin_dir() + "/" + args[0];
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(126);
    ::signal(SIGXFSZ, SIG_IGN);  // kept across exec
    const struct rlimit lim { limit, limit };
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(126);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
  return pid;
}

}  // namespace

TEST_CASE("disk full during the trainer's saves: the saves fail cleanly, training goes on, the previous one stays") {
  Fixture fx;
  // Reference: 6 uninterrupted steps on a normal disk.
  REQUIRE(run(fx.train(6, fx.dir / "ck-ref", {"--log-json", fx.dir / "ref.jsonl", "--export", fx.dir / "ref.bin"}),
              fx.dir / "ref.log") == 0);
  const auto ref = step_losses(fx.dir / "ref.jsonl");
  REQUIRE(ref.size() == 6);

  // A real full disk: a 6 MiB tmpfs (mount(2) needs root or CAP_SYS_ADMIN), filled after the first checkpoint so
  // that the next shard file (~1.4 MiB) does not fit: ENOSPC. Without mount: the worker runs with RLIMIT_FSIZE =
  // 1 MiB, below one shard file: EFBIG. RAILYARD_CKPT_TEST_NO_MOUNT=1 picks the second way on a machine with mount.
  const std::string mnt = fx.dir / "mnt";
  fs::create_directory(mnt);
  const bool tmpfs = std::getenv("RAILYARD_CKPT_TEST_NO_MOUNT") == nullptr &&
                     ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=6m,mode=0700") == 0;
  struct Unmount {
    std::string path;
    bool on;
    ~Unmount() {
      if (on) ::umount2(path.c_str(), MNT_DETACH);
    }
  } unmount{mnt, tmpfs};
  MESSAGE(
      "disk-full mechanism: " << std::string(tmpfs ? "6 MiB tmpfs filled up (ENOSPC)" : "RLIMIT_FSIZE 1 MiB (EFBIG)"));
  const std::string ck = mnt + "/ck";
  REQUIRE_MESSAGE(run(fx.train(2, ck, {}), fx.dir / "first.log") == 0, slurp(fx.dir / "first.log"));
  REQUIRE(fs::exists(ck + "/step-00000002/manifest.json"));
  const std::string filler = mnt + "/filler";
  if (tmpfs) {
    const auto free_bytes = fs::space(mnt).available;
    REQUIRE(free_bytes > 600 * 1024);
    std::ofstream(filler, std::ios::binary) << std::string(free_bytes - 512 * 1024, 'x');
    REQUIRE(fs::space(mnt).available < 600 * 1024);
  }
  // Steps 3-6 with saves due at 4 and 6 (the last one synchronous): both fail; the run finishes its steps.
  const auto args =
      fx.train(6, ck, {"--ckpt-every", "2", "--log-json", fx.dir / "full.jsonl", "--export", fx.dir / "full.bin"});
  const pid_t pid = tmpfs ? spawn(args, fx.dir / "full.log") : spawn_fsize_limited(args, fx.dir / "full.log", 1 << 20);
  const int code = wait_exit(pid);
  const std::string log = slurp(fx.dir / "full.log");
  CHECK_MESSAGE(code == 0, log);
  CHECK_MESSAGE(log.find("restored step=2") != std::string::npos, log);
  const std::string why = tmpfs ? "No space left on device" : "File too large";
  for (const char* step : {"step=4", "step=6"}) {
    // One line per failed save: "save failed: training goes on, ... step=N error=...<errno text>".
    bool found = false;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      found = found || (line.find("save failed: training goes on") != std::string::npos &&
                        line.find(step) != std::string::npos && line.find(why) != std::string::npos);
    }
    CHECK_MESSAGE(found, step << " " << why << ":\n" << log);
  }
  const auto full = step_losses(fx.dir / "full.jsonl");
  REQUIRE(full.size() == 4);
  for (int s = 3; s <= 6; ++s) CHECK_MESSAGE(full.at(s) == ref.at(s), "step " << s);
  CHECK_MESSAGE(slurp(fx.dir / "full.bin") == slurp(fx.dir / "ref.bin"), "final weights differ");
  // Nothing half-written is left, `latest` still names step 2, and it verifies.
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(ck)) {
    // The commit lock (ckpt::kCommitLockName) stays: it is only ever flocked, never holds data.
    if (e.path().filename() != ".commit.lock") entries.push_back(e.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  CHECK(entries == std::vector<std::string>{"latest", "step-00000002"});
  CHECK(slurp(ck + "/latest").rfind("step-00000002", 0) == 0);
  CHECK(run({"railyard", "ckpt", "verify", ck}, fx.dir / "v.log") == 0);

  // Space again: the next run restores step 2 (the failed saves left nothing it could take for a checkpoint) and
  // saves normally.
  fs::remove(filler);
  REQUIRE(run(fx.train(6, ck, {"--ckpt-every", "2", "--log-json", fx.dir / "again.jsonl"}), fx.dir / "again.log") == 0);
  CHECK(slurp(fx.dir / "again.log").find("restored step=2") != std::string::npos);
  CHECK(step_losses(fx.dir / "again.jsonl").at(6) == ref.at(6));
  CHECK(slurp(ck + "/latest").rfind("step-00000006", 0) == 0);
  CHECK(run({"railyard", "ckpt", "verify", ck, "--step", "6"}, fx.dir / "v6.log") == 0);
}

TEST_CASE("--offload optimizer: the same checkpoint bytes as the in-memory optimizer; resume across on and off") {
  Fixture fx;
  auto train_as = [&](const std::string& ck, bool offload, const std::string& name) {
    // The default asynchronous snapshot: its copy of step k must not race the offloaded update of step k.
    std::vector<std::string> extra = {
        "--ckpt-every", "3", "--log-json", fx.dir / (name + ".jsonl"), "--export", fx.dir / (name + ".bin")};
    if (offload) extra.insert(extra.end(), {"--offload", "optimizer"});
    return run(fx.train(6, ck, extra), fx.dir / (name + ".log"));
  };
  const std::string in_memory = fx.dir / "ck-mem", offloaded = fx.dir / "ck-off";
  REQUIRE_MESSAGE(train_as(in_memory, false, "mem") == 0, slurp(fx.dir / "mem.log"));
  REQUIRE_MESSAGE(train_as(offloaded, true, "off") == 0, slurp(fx.dir / "off.log"));
  CHECK(slurp(fx.dir / "off.log").find("offload=optimizer") != std::string::npos);
  const auto a = step_losses(fx.dir / "mem.jsonl");
  REQUIRE(a.size() == 6);
  CHECK(step_losses(fx.dir / "off.jsonl") == a);
  CHECK(slurp(fx.dir / "off.bin") == slurp(fx.dir / "mem.bin"));
  for (const char* step : {"step-00000003", "step-00000006"}) {
    const std::string x = slurp(in_memory + "/" + step + "/rank-00000.bin");
    CHECK(x.size() > 1000000);  // params + m + v
    CHECK_MESSAGE(x == slurp(offloaded + "/" + step + "/rank-00000.bin"), step);
  }
  // Each checkpoint resumed from step 3 by the other mode continues bitwise.
  for (auto [ck, offload, name] : {std::tuple{offloaded, false, "off-to-mem"}, {in_memory, true, "mem-to-off"}}) {
    INFO(name);
    fs::remove_all(ck + "/step-00000006");
    REQUIRE_MESSAGE(train_as(ck, offload, name) == 0, slurp(fx.dir / (std::string(name) + ".log")));
    CHECK(slurp(fx.dir / (std::string(name) + ".log")).find("restored step=3") != std::string::npos);
    const auto b = step_losses(fx.dir / (std::string(name) + ".jsonl"));
    REQUIRE(b.size() == 3);
    for (int s = 4; s <= 6; ++s) CHECK_MESSAGE(b.at(s) == a.at(s), "step " << s);
    CHECK(slurp(fx.dir / (std::string(name) + ".bin")) == slurp(fx.dir / "mem.bin"));
  }
}
