// The shared-memory tier: a snapshot put by one process is restored by another; torn or damaged snapshots are
// detected (and the caller would use storage instead).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "checkpoint/peer_held.h"
#include "checkpoint/shm_store.h"
#include "test_util.h"
#include "tests/ctest_env.h"

using namespace railyard::ckpt;
using namespace railyard::ckpt::test;

namespace {

std::string unique_name(const char* what) {
  return ShmStore::name_for(std::string("test-") + what + "-" + std::to_string(::getpid()), 0);
}

// Forks a child that puts the (2,2,2)-layout rank 5 state of `seed` at `step` and exits.
int put_in_child(const std::string& name, const GlobalState& g, int64_t step) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    try {
      RankState rs = rank_state(g, Layout{2, 2, 2, 1}, 5);
      ShmStore store(name);
      store.put(step, rs.shards, {{"rng", 1234}, {"step", step}});
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct Targets {
  RankState want;
  std::vector<std::vector<float>> got;
  std::vector<LoadTarget> targets;
  Targets(const GlobalState& g, const Layout& l, int rank) : want(rank_state(g, l, rank)) {
    for (const auto& b : want.boxes) got.emplace_back(static_cast<size_t>(b.box.volume()), -1.0f);
    for (size_t i = 0; i < got.size(); ++i)
      targets.push_back({want.boxes[i].tensor, DType::F32, want.boxes[i].box, got[i].data()});
  }
  bool equal() const {
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(got[i].data(), want.buffers[i].data(), got[i].size() * 4) != 0) return false;
    }
    return true;
  }
};

}  // namespace

TEST_CASE("shm: a snapshot put by another process restores element-exact") {
  const std::string name = unique_name("rt");
  GlobalState g = GlobalState::make(small_gpt(true), 42);
  REQUIRE(put_in_child(name, g, 300) == 0);
  ShmStore store(name);
  Targets t(g, Layout{2, 2, 2, 1}, 5);
  nlohmann::json state;
  std::string why;
  auto step = store.get(t.targets, &state, &why);
  REQUIRE_MESSAGE(step.has_value(), why);
  CHECK(*step == 300);
  CHECK(state["rng"] == 1234);
  CHECK(t.equal());
  // A different layout's boxes are not all in this rank's snapshot: refused with a reason, not garbage.
  Targets other(g, Layout{1, 1, 1, 0}, 0);
  CHECK_FALSE(store.get(other.targets, nullptr, &why));
  CHECK_MESSAGE(why.find("stored") != std::string::npos, why);
  // A newer put replaces it.
  GlobalState g2 = GlobalState::make(small_gpt(true), 43);
  REQUIRE(put_in_child(name, g2, 301) == 0);
  Targets t2(g2, Layout{2, 2, 2, 1}, 5);
  CHECK(store.get(t2.targets, nullptr, &why) == 301);
  CHECK(t2.equal());
  ShmStore::remove(name);
  CHECK_FALSE(store.get(t2.targets, nullptr, &why));
  CHECK(why.find("no snapshot") != std::string::npos);
}

TEST_CASE("shm: torn header and damaged contents are detected") {
  const std::string name = unique_name("torn");
  GlobalState g = GlobalState::make(small_gpt(true), 7);
  REQUIRE(put_in_child(name, g, 10) == 0);
  int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  const size_t size = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  auto* p = static_cast<unsigned char*>(::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  Targets t(g, Layout{2, 2, 2, 1}, 5);
  std::string why;
  REQUIRE(ShmStore(name).get(t.targets, nullptr, &why) == 10);

  uint32_t state_word;
  std::memcpy(&state_word, p + 12, 4);  // magic[8], version, state
  const uint32_t writing = 1;
  std::memcpy(p + 12, &writing, 4);  // as a writer killed mid-put leaves it
  CHECK_FALSE(ShmStore(name).get(t.targets, nullptr, &why));
  CHECK(why.find("torn") != std::string::npos);
  std::memcpy(p + 12, &state_word, 4);

  p[24] ^= 0x10;  // the step field: the header checksum no longer matches
  CHECK_FALSE(ShmStore(name).get(t.targets, nullptr, &why));
  CHECK(why.find("header checksum") != std::string::npos);
  p[24] ^= 0x10;

  p[size - 100] ^= 0xFF;  // inside the data
  CHECK_FALSE(ShmStore(name).get(t.targets, nullptr, &why));
  CHECK(why.find("CRC32C mismatch") != std::string::npos);
  p[size - 100] ^= 0xFF;
  CHECK(ShmStore(name).get(t.targets, nullptr, &why) == 10);
  ::munmap(p, size);
  ShmStore::remove(name);
}

TEST_CASE("shm: a writer killed mid-put never yields a wrong snapshot") {
  const std::string name = unique_name("kill");
  const auto defs = gpt_tensor_defs(4, 256, 256, 2048, true);  // ~24 MiB
  GlobalState g1 = GlobalState::make(defs, 1);
  std::mt19937 rng(5);
  int torn = 0, complete = 0;
  for (int i = 0; i < 8; ++i) {
    const int64_t step = 100 + i;
    GlobalState g = GlobalState::make(defs, static_cast<uint64_t>(step));
    const auto [pid, fd] = fork_child([&](int ready) {
      RankState rs = rank_state(g, Layout{}, 0);
      ShmStore store(name);
      store.put(step, rs.shards);
      char b = 'x';
      if (::write(ready, &b, 1) != 1) ::_exit(2);
      for (int k = 0; k < 1000; ++k) store.put(step, rs.shards);  // keep writing until killed
      return 0;
    });
    wait_ready(fd);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30000));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    FullTargets full(defs);
    std::string why;
    auto got = ShmStore(name).get(full.targets, nullptr, &why);
    if (got) {
      ++complete;
      CHECK(*got == step);
      CHECK(count_mismatches(g, full.data) == 0);
    } else {
      ++torn;
      CHECK_MESSAGE(why.find("torn") != std::string::npos, why);
    }
  }
  MESSAGE("killed puts: " << torn << " torn (detected), " << complete << " complete and exact");
  ShmStore::remove(name);
}

// The Python flash checkpoint module (worker/agent/python/railyard_flash.py) writes the same layout with zlib's CRC-32
// (format version 2): the C++ side reads it, rejects a flipped byte, and the peer copy's receive path accepts it.
TEST_CASE("shm: a version-2 image written by railyard_flash.py reads, verifies and copies") {
  const std::string name = unique_name("py");
  const std::string copy_name = unique_name("pycopy");
  ShmStore::remove(name);
  ShmStore::remove(copy_name);
  std::vector<float> w(3 * 5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.25f * static_cast<float>(i) - 1.0f;
  std::string hex;
  for (unsigned char c : std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4)) {
    static const char* d = "0123456789abcdef";
    hex += d[c >> 4];
    hex += d[c & 15];
  }
  // No torch needed: the module's raw writer, into /dev/shm as the agent's workers name their slots.
  const std::string script =
      "import os, sys\n"
      "sys.path.insert(0, '" +
      railyard::test::source_path("worker/agent/python") +
      "')\n"
      "import railyard_flash as rf\n"
      "t = [('w', 'f32', [3, 5], bytes.fromhex('" +
      hex +
      "')), ('n', 'i64', [2], (7).to_bytes(8, 'little') * 2)]\n"
      "meta, offs, total = rf.image_layout([(a, b, c, len(d)) for a, b, c, d in t], {'flash': {'x': 1}})\n"
      "p = '/dev/shm" +
      name +
      "'\n"
      "with open(p, 'wb') as f: f.truncate(total)\n"
      "import mmap\n"
      "fd = os.open(p, os.O_RDWR); m = mmap.mmap(fd, total); os.close(fd)\n"
      "rf.write_image_raw(m, 41, 1, t, {'flash': {'x': 1}})\n"
      "m.flush()\n";
  const std::string py = "/tmp/railyard-shm-test-" + std::to_string(::getpid()) + ".py";
  {
    FILE* f = std::fopen(py.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(script.c_str(), f);
    std::fclose(f);
  }
  REQUIRE(std::system(("python3 " + py).c_str()) == 0);
  std::remove(py.c_str());

  ShmStore store(name);
  std::string why;
  REQUIRE_MESSAGE(store.peek(&why) == std::optional<int64_t>(41), why);
  std::vector<float> got(w.size(), 0.0f);
  std::vector<int64_t> n(2, 0);
  std::vector<LoadTarget> targets = {{"w", DType::F32, Box{{0, 0}, {3, 5}}, got.data()},
                                     {"n", DType::I64, Box{{0}, {2}}, n.data()}};
  nlohmann::json state;
  REQUIRE_MESSAGE(store.get(targets, &state, &why) == std::optional<int64_t>(41), why);
  CHECK(got == w);
  CHECK(n == std::vector<int64_t>{7, 7});
  CHECK(state["flash"]["x"] == 1);

  // The peer copy's path: the image travels whole and is verified on arrival.
  {
    auto img = store.map_image(&why);
    REQUIRE_MESSAGE(img != nullptr, why);
    CHECK(img->step() == 41);
    ShmStore dest(copy_name);
    dest.begin_image(img->size());
    dest.write_image(img->data(), img->size());
    REQUIRE_MESSAGE(dest.commit_image(&why) == std::optional<int64_t>(41), why);
    std::vector<float> again(w.size(), 0.0f);
    REQUIRE(dest.get({{"w", DType::F32, Box{{0, 0}, {3, 5}}, again.data()}}, nullptr, &why).has_value());
    CHECK(again == w);
    // A byte flipped on the way: refused, naming the checksum.
    std::vector<unsigned char> bad(img->data(), img->data() + img->size());
    bad[bad.size() - 70] ^= 0x40;
    ShmStore dest2(copy_name);
    dest2.begin_image(bad.size());
    dest2.write_image(bad.data(), bad.size());
    CHECK_FALSE(dest2.commit_image(&why));
    CHECK_MESSAGE(why.find("CRC-32 mismatch") != std::string::npos, why);
  }
  // A byte flipped in place (inside w's data, whose offset the header holds at byte 40): get() refuses it.
  {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    void* p = ::mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    uint64_t data_offset = 0;
    std::memcpy(&data_offset, static_cast<unsigned char*>(p) + 40, 8);
    ::munmap(p, 64);
    unsigned char b = 0;
    REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(data_offset) + 5) == 1);
    b ^= 0x01;
    REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(data_offset) + 5) == 1);
    ::close(fd);
  }
  CHECK_FALSE(store.get(targets, nullptr, &why));
  CHECK_MESSAGE(why.find("CRC-32 mismatch") != std::string::npos, why);
  ShmStore::remove(name);
  ShmStore::remove(copy_name);
}

TEST_CASE("peer held record: written and read back newest first, missing or damaged reads as nothing held") {
  const std::string base = "/railyard-shmtest-held-" + std::to_string(::getpid()) + "-r0";
  const std::string name = peer_held_name(base);
  CHECK(name == base + "-held");
  CHECK(read_peer_held(name).empty());  // missing
  write_peer_held(name, {11, 12});
  CHECK(read_peer_held(name) == std::vector<int64_t>{12, 11});
  write_peer_held(name, {-1, 7});  // -1: an empty or torn slot of the peer
  CHECK(read_peer_held(name) == std::vector<int64_t>{7});
  write_peer_held(name, {3, 9, 5});  // at most two: the newest
  CHECK(read_peer_held(name) == std::vector<int64_t>{9, 5});
  write_peer_held(name, {});
  CHECK(read_peer_held(name).empty());
  // A record caught half written (one step changed, its check word not yet): nothing held, never a wrong step.
  write_peer_held(name, {20, 19});
  {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    const int64_t other = 21;
    REQUIRE(::pwrite(fd, &other, sizeof other, 0) == static_cast<ssize_t>(sizeof other));
    ::close(fd);
  }
  CHECK(read_peer_held(name).empty());
  ShmStore::remove_prefix(base);
  CHECK(read_peer_held(name).empty());
}
