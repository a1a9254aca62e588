// Issue 40 item 8, "checkpoints never lose the last good step": a writer killed at every point of the commit (the
// fault-injection points of checkpoint/fs_util.h, in a forked child) leaves the previous or the new committed step
// readable, also when it re-saves a step that is already committed, with and without RENAME_EXCHANGE; a superseded
// generation cannot move `latest` nor delete anything; retention keeps the newest valid step; the shared-memory
// image parser bounds every slice by its box and by the segment.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "checkpoint/fs_util.h"
#include "checkpoint/reader.h"
#include "checkpoint/shm_store.h"
#include "checkpoint/writer.h"
#include "test_util.h"

using namespace railyard::ckpt;
using namespace railyard::ckpt::test;
namespace fs = std::filesystem;

namespace {

const std::string kJob = "ns_job";

// Every saved version of a step has its own contents: seed = step * 100 + version.
GlobalState version_state(int64_t step, int version) {
  return GlobalState::make(small_gpt(true), static_cast<uint64_t>(step * 100 + version));
}

SaveStatus save(const std::string& root, int64_t step, int version, int64_t generation, const std::string& job = kJob,
                int keep = 0) {
  GlobalState g = version_state(step, version);
  RankState rs = rank_state(g, Layout{}, 0);
  WriterOptions o;
  o.root = root;
  o.keep = keep;
  o.job = job;
  o.generation = generation;
  Writer w(o);
  w.snapshot(step, rs.shards, {{"version", version}});
  return w.wait(step, Clock::now() + std::chrono::seconds(60));
}

// Runs save() in a child with RAILYARD_CKPT_CRASH_AT=point; returns the wait status.
int save_in_child(const std::string& root, int64_t step, int version, const std::string& point, bool no_exchange) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("RAILYARD_CKPT_CRASH_AT", point.c_str(), 1);
    if (no_exchange) ::setenv("RAILYARD_CKPT_NO_EXCHANGE", "1", 1);
    int code = 4;
    try {
      code = save(root, step, version, 1).state == SaveState::Committed ? 0 : 3;
    } catch (...) {
    }
    ::_exit(code);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  return st;
}

// Loads the newest step and says which version it holds (-1: neither of the allowed ones).
std::pair<int64_t, int> load_newest(const std::string& root, const std::vector<std::pair<int64_t, int>>& allowed) {
  FullTargets full(small_gpt(true));
  LoadResult r = Reader(root).load_latest(full.targets);
  for (const auto& [step, version] : allowed) {
    if (step == r.step && count_mismatches(version_state(step, version), full.data) == 0) return {step, version};
  }
  return {r.step, -1};
}

std::vector<std::string> leftovers(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (n == kLatestName || n == kCommitLockName) continue;
    if (!parse_step_dir(n) || !fs::exists(e.path() / kManifestName)) out.push_back(n);
  }
  return out;
}

}  // namespace

TEST_CASE("a writer killed at every commit point leaves the previous or the new committed step") {
  const std::vector<std::string> points = {
      "before-rename:manifest.json", "commit-manifest-written", "commit-exchanged",
      "commit-old-moved-aside",      "commit-renamed",          "before-rename:latest",
      "commit-latest-moved",         "commit-replaced-removed", "no-such-point"};
  int killed = 0;
  for (const bool resave : {false, true}) {
    for (const bool no_exchange : {false, true}) {
      for (const auto& point : points) {
        CAPTURE(point);
        CAPTURE(resave);
        CAPTURE(no_exchange);
        TempDir dir("ckpt-commit");
        const std::string root = dir.path();
        REQUIRE(save(root, 1, 0, 1).state == SaveState::Committed);
        REQUIRE(save(root, 2, 0, 1).state == SaveState::Committed);
        // New step 3, or step 2 saved again with other contents (version 1).
        const int64_t step = resave ? 2 : 3;
        const int st = save_in_child(root, step, 1, point, no_exchange);
        const bool was_killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        killed += was_killed;
        if (!was_killed) CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));  // a point this path does not pass
        // The reader finds the old or the new committed step, element-exact, never an older one.
        const auto [got_step, got_version] = load_newest(root, {{2, 0}, {step, 1}});
        CHECK(got_version >= 0);
        CHECK(got_step == step - (resave ? 0 : (got_version == 1 ? 0 : 1)));
        if (!was_killed) CHECK(got_version == 1);
        // `latest` names a step that loads.
        auto latest = Reader(root).latest_pointer();
        REQUIRE(latest.has_value());
        FullTargets full(small_gpt(true));
        CHECK_NOTHROW(Reader(root).load_step(*latest, full.targets));
        // The next writer cleans up (puts a moved-aside step back), commits, and leaves only complete steps.
        REQUIRE(save(root, 5, 0, 1).state == SaveState::Committed);
        CHECK(leftovers(root).empty());
        FullTargets two(small_gpt(true));
        Reader(root).load_step(2, two.targets);
        const bool v0 = count_mismatches(version_state(2, 0), two.data) == 0;
        const bool v1 = count_mismatches(version_state(2, 1), two.data) == 0;
        CHECK((v0 || (resave && v1)));
        for (const auto& info : list_checkpoints(root)) CHECK(info.complete);
      }
    }
  }
  MESSAGE("writers killed inside the commit: " << killed);
  CHECK(killed >= 20);  // every listed point but the exchange (only on re-saves) and no-such-point is reached
}

TEST_CASE("a superseded generation neither moves latest nor deletes anything") {
  TempDir dir("ckpt-fence");
  const std::string root = dir.path();
  REQUIRE(save(root, 10, 0, 2).state == SaveState::Committed);
  // Looks like an orphan (no manifest), and could be a newer generation's save in flight: the old one must leave it.
  fs::create_directories(root + "/" + step_dir_name(99));
  fs::create_directories(root + "/" + temp_dir_name(12, "gen2-live"));
  SaveStatus old = save(root, 20, 0, 1, kJob, /*keep=*/1);
  CHECK(old.state == SaveState::Failed);
  CHECK_MESSAGE(old.error.find("superseded by generation 2") != std::string::npos, old.error);
  CHECK(Reader(root).latest_pointer() == 10);
  CHECK_FALSE(fs::exists(root + "/" + step_dir_name(20)));
  CHECK(fs::exists(root + "/" + step_dir_name(99)));
  CHECK(fs::exists(root + "/" + temp_dir_name(12, "gen2-live")));
  CHECK(load_newest(root, {{10, 0}}) == std::pair<int64_t, int>{10, 0});
  // The same generation, a newer one, another job and a run by hand (generation 0) are not fenced.
  CHECK(save(root, 11, 0, 2).state == SaveState::Committed);
  CHECK(save(root, 12, 0, 3).state == SaveState::Committed);
  CHECK(current_generation(root, kJob) == 3);
  CHECK(save(root, 13, 0, 2).state == SaveState::Failed);
  CHECK(save(root, 13, 0, 0).state == SaveState::Committed);
  CHECK(save(root, 14, 0, 1, "other_job").state == SaveState::Committed);
  CHECK(Reader(root).latest_pointer() == 14);
}

TEST_CASE("a live writer's temporary directory survives another run's orphan cleanup") {
  TempDir dir("ckpt-live");
  const std::string root = dir.path();
  const std::string live = root + "/" + temp_dir_name(7, "otherrun");
  const std::string dead = root + "/" + temp_dir_name(8, "deadrun");
  fs::create_directories(live);
  fs::create_directories(dead);
  std::ofstream(root + "/latest.tmp-123-abcd") << "step-00000007\n";  // a dead writer's temporary of `latest`
  auto held = detail::FileLock::shared(live);
  REQUIRE(held != nullptr);
  CHECK(detail::FileLock::held(live));
  CHECK_FALSE(detail::FileLock::held(dead));
  auto removed = clean_orphans(root, "mine");
  CHECK(fs::exists(live));
  CHECK_FALSE(fs::exists(dead));
  CHECK_FALSE(fs::exists(root + "/latest.tmp-123-abcd"));
  CHECK(removed.size() == 2);
  held.reset();
  clean_orphans(root, "mine");
  CHECK_FALSE(fs::exists(live));
}

TEST_CASE("retention never deletes the newest valid step nor the one latest names") {
  TempDir dir("ckpt-retention");
  const std::string root = dir.path();
  REQUIRE(save(root, 1, 0, 0, kJob, 1).state == SaveState::Committed);
  // A newer step whose manifest is there but whose shard is damaged (truncated), and `latest` naming it.
  fs::copy(root + "/" + step_dir_name(1), root + "/" + step_dir_name(5), fs::copy_options::recursive);
  fs::resize_file(root + "/" + step_dir_name(5) + "/" + rank_file_name(0), 16);
  std::ofstream(root + "/" + kLatestName) << step_dir_name(5) << "\n";
  auto removed = apply_retention(root, 1);
  CHECK(removed.empty());
  CHECK(fs::exists(root + "/" + step_dir_name(1)));  // the only step that loads
  CHECK(load_newest(root, {{1, 0}}) == std::pair<int64_t, int>{1, 0});
  // Once a newer valid step is committed, retention removes both older ones.
  REQUIRE(save(root, 6, 0, 0, kJob, 1).state == SaveState::Committed);
  CHECK_FALSE(fs::exists(root + "/" + step_dir_name(1)));
  CHECK_FALSE(fs::exists(root + "/" + step_dir_name(5)));
  CHECK(load_newest(root, {{6, 0}}) == std::pair<int64_t, int>{6, 0});
}

namespace {

// A snapshot image as put() writes it, read back from /dev/shm, with the metadata's room for edits: the state holds
// a padding string that an edit shrinks so the metadata keeps its length.
struct ShmImage {
  std::string name;
  std::vector<unsigned char> bytes;
  GlobalState g = GlobalState::make(small_gpt(false), 7);
  std::vector<LoadTarget> targets() {
    out.clear();
    for (const auto& d : g.defs) out[d.name].assign(static_cast<size_t>(shape_volume(d.shape)), 0);
    std::vector<LoadTarget> t;
    for (const auto& d : g.defs) t.push_back({d.name, DType::F32, full_box(d.shape), out[d.name].data()});
    return t;
  }
  std::map<std::string, std::vector<float>> out;

  explicit ShmImage(const std::string& n) : name(n) {
    ShmStore::remove(name);
    ShmStore store(name);
    RankState rs = rank_state(g, Layout{}, 0);
    store.put(3, rs.shards, {{"pad", std::string(200, 'x')}});
    std::ifstream in("/dev/shm" + name, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ~ShmImage() { ShmStore::remove(name); }
  // Applies `edit` to the metadata JSON (at byte 4096, up to the first NUL or the data) and re-seals the image.
  void edit_meta(const std::function<void(nlohmann::json&)>& edit) {
    auto* meta = reinterpret_cast<char*>(bytes.data() + 4096);
    const size_t len = std::strlen(meta);
    nlohmann::json j = nlohmann::json::parse(std::string(meta, len));
    edit(j);
    j["state"]["pad"] = "";
    std::string text = j.dump();
    REQUIRE(text.size() <= len);
    text.resize(len, ' ');
    std::memcpy(meta, text.data(), len);
    ShmStore::seal_image(bytes.data(), bytes.size());
  }
  std::optional<int64_t> read(std::string* why) {
    return ShmStore::read_image(name, bytes.data(), bytes.size(), targets(), nullptr, why);
  }
};

}  // namespace

TEST_CASE("shm: a slice is bounded by its box, the data section and the segment") {
  const std::string name = "/railyard-commit-test-" + std::to_string(::getpid());
  std::string why;
  {
    ShmImage img(name);
    REQUIRE(img.read(&why) == 3);
    CHECK(count_mismatches(img.g, img.out) == 0);
  }
  {
    ShmImage img(name);  // a box larger than the bytes stored for it: copy_region would read past them
    img.edit_meta([](nlohmann::json& j) { j["slices"][0]["size"] = {4, 8000}; });
    CHECK_FALSE(img.read(&why));
    CHECK_MESSAGE(why.find("shared memory " + name + ": slice") != std::string::npos, why);
    CHECK_MESSAGE(why.find("not inside the tensor's shape") != std::string::npos, why);
  }
  {
    ShmImage img(name);  // box and shape agree, bytes claimed beyond the data section
    img.edit_meta([](nlohmann::json& j) {
      j["tensors"][0]["shape"] = {4, 800000};
      j["slices"][0]["size"] = {4, 800000};
      j["slices"][0]["bytes"] = 4 * 800000 * 4;
    });
    CHECK_FALSE(img.read(&why));
    CHECK_MESSAGE(why.find("outside the segment's data section") != std::string::npos, why);
  }
  {
    ShmImage img(name);  // bytes that disagree with the box
    img.edit_meta([](nlohmann::json& j) { j["slices"][0]["bytes"] = 8; });
    CHECK_FALSE(img.read(&why));
    CHECK_MESSAGE(why.find("its box needs") != std::string::npos, why);
  }
  {
    ShmImage img(name);  // an offset near 2^64 must not wrap around
    img.edit_meta([](nlohmann::json& j) { j["slices"][1]["at"] = UINT64_MAX - 7; });
    CHECK_FALSE(img.read(&why));
    CHECK_MESSAGE(why.find("outside the segment's data section") != std::string::npos, why);
  }
  {
    ShmImage img(name);  // a truncated image, and the same truncation of the real segment through get()
    const size_t full = img.bytes.size();
    img.bytes.resize(full - 64);
    CHECK_FALSE(img.read(&why));
    CHECK_MESSAGE(why.find("exceeds the segment") != std::string::npos, why);
    REQUIRE(::truncate(("/dev/shm" + name).c_str(), static_cast<off_t>(full - 64)) == 0);
    ShmStore store(name);
    auto t = img.targets();
    CHECK_FALSE(store.get(t, nullptr, &why));
    CHECK_MESSAGE(why.find("shared memory " + name) != std::string::npos, why);
    CHECK_MESSAGE(why.find("exceeds the segment") != std::string::npos, why);
  }
}
