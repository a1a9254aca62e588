// Save under (dp,tp,pp)=(2,2,2) from several writer ranks (threads, and forked processes) into one directory, then
// load under other layouts and compare every element with the original global tensors.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "checkpoint/cli.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "test_util.h"

using namespace railyard::ckpt;
using namespace railyard::ckpt::test;

namespace {

WriterOptions writer_options(const std::string& root, const Layout& l, int rank, const std::string& run) {
  WriterOptions o;
  o.root = root;
  o.rank = rank;
  o.world_size = l.world_size();
  o.run_id = run;
  o.layout = l.to_json();
  o.commit_timeout = std::chrono::seconds(60);
  return o;
}

// Every rank of `layout` saves `step` from its own thread; returns the statuses.
std::vector<SaveStatus> save_with_threads(const std::string& root, const GlobalState& g, const Layout& layout,
                                          int64_t step, const std::string& run) {
  std::vector<SaveStatus> statuses(static_cast<size_t>(layout.world_size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < layout.world_size(); ++r) {
    threads.emplace_back([&, r] {
      RankState rs = rank_state(g, layout, r);
      Writer w(writer_options(root, layout, r, run));
      w.snapshot(step, rs.shards, {{"rank", r}, {"rng", r * 7 + 1}});
      statuses[static_cast<size_t>(r)] = w.wait(step, Clock::now() + std::chrono::seconds(60));
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

// Loads what every rank of `layout` holds and compares it element by element with the global state. Returns the
// number of wrong elements.
size_t load_and_compare(const std::string& root, const GlobalState& g, const Layout& layout) {
  Reader reader(root);
  size_t wrong = 0;
  for (int r = 0; r < layout.world_size(); ++r) {
    RankState want = rank_state(g, layout, r);  // what the rank should hold
    std::vector<std::vector<float>> got(want.boxes.size());
    std::vector<LoadTarget> targets;
    for (size_t i = 0; i < want.boxes.size(); ++i) {
      got[i].assign(want.buffers[i].size(), std::nanf(""));
      targets.push_back({want.boxes[i].tensor, DType::F32, want.boxes[i].box, got[i].data()});
    }
    LoadResult res = reader.load_latest(targets);
    CHECK(res.skipped.empty());
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(got[i].data(), want.buffers[i].data(), got[i].size() * sizeof(float)) != 0) ++wrong;
    }
  }
  return wrong;
}

}  // namespace

TEST_CASE("round trip: (2,2,2) saved by 8 writer threads, loaded under (1,1,1), (4,1,2), (2,2,1)") {
  for (int zero : {0, 1}) {
    CAPTURE(zero);
    TempDir dir;
    GlobalState g = GlobalState::make(small_gpt(true), 11);
    Layout saved{2, 2, 2, zero};
    auto statuses = save_with_threads(dir.path(), g, saved, 100, "rt" + std::to_string(zero));
    for (const auto& s : statuses) {
      CHECK_MESSAGE(s.state == SaveState::Committed, "rank error: " << s.error);
    }
    Reader reader(dir.path());
    Manifest m = reader.read_manifest(100);
    CHECK(m.world_size == 8);
    CHECK(Layout::from_json(m.layout).zero == zero);
    CHECK(m.rank_state.size() == 8);
    CHECK(m.rank_state.at(5)["rng"] == 36);
    // Replicas split the work: the shard files hold each element once.
    uint64_t slice_bytes = 0, tensor_bytes = 0;
    for (const auto& s : m.slices) slice_bytes += s.bytes;
    for (const auto& t : m.tensors) tensor_bytes += static_cast<uint64_t>(shape_volume(t.shape)) * 4;
    CHECK(slice_bytes == tensor_bytes);
    CHECK(verify_checkpoint(dir.path(), 100).ok);

    FullTargets full(g.defs);
    LoadResult r = reader.load_latest(full.targets);
    CHECK(r.step == 100);
    CHECK(count_mismatches(g, full.data) == 0);
    for (Layout to :
         {Layout{1, 1, 1, 0}, Layout{4, 1, 2, 0}, Layout{2, 2, 1, 0}, Layout{4, 1, 2, 1}, Layout{2, 2, 1, 1}}) {
      CAPTURE(to.to_json().dump());
      CHECK(load_and_compare(dir.path(), g, to) == 0);
    }
  }
}

TEST_CASE("round trip: 8 forked writer processes share one directory") {
  TempDir dir;
  GlobalState g = GlobalState::make(small_gpt(true), 99);
  Layout saved{2, 2, 2, 1};
  std::vector<pid_t> pids;
  for (int r = 0; r < saved.world_size(); ++r) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 1;
      try {
        RankState rs = rank_state(g, saved, r);
        Writer w(writer_options(dir.path(), saved, r, "procs"));
        w.snapshot(7, rs.shards);
        code = w.wait(7, Clock::now() + std::chrono::seconds(60)).state == SaveState::Committed ? 0 : 3;
      } catch (...) {
        code = 4;
      }
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  }
  FullTargets full(g.defs);
  CHECK(Reader(dir.path()).load_latest(full.targets).step == 7);
  CHECK(count_mismatches(g, full.data) == 0);
  CHECK(load_and_compare(dir.path(), g, Layout{1, 2, 2, 0}) == 0);
}

TEST_CASE("asynchronous saves: several steps in flight, retention keeps the last K, status reports each") {
  TempDir dir;
  auto defs = small_gpt(false);
  for (int buffers : {1, 2}) {
    CAPTURE(buffers);
    WriterOptions o;
    o.root = dir / ("b" + std::to_string(buffers));
    o.keep = 2;
    o.buffers = buffers;
    std::atomic<int> finished{0};
    o.on_finished = [&](const SaveStatus& st) { finished += st.state == SaveState::Committed ? 1 : 0; };
    Writer w(o);
    std::vector<GlobalState> states;
    for (int step = 1; step <= 5; ++step) {
      states.push_back(GlobalState::make(defs, static_cast<uint64_t>(step)));
      RankState rs = rank_state(states.back(), Layout{}, 0);
      w.snapshot(step * 10, rs.shards, {{"step", step}});
      // The writer copied the data: scribbling over it now must not change what is saved.
      for (auto& b : rs.buffers) std::fill(b.begin(), b.end(), 0.0f);
    }
    w.flush();
    CHECK(finished == 5);
    for (int step = 1; step <= 5; ++step) CHECK(w.status(step * 10).state == SaveState::Committed);
    CHECK(w.status(999).state == SaveState::Failed);
    Reader reader(o.root);
    CHECK(reader.complete_steps() == std::vector<int64_t>{50, 40});
    CHECK(reader.latest_pointer() == 50);
    FullTargets full(defs);
    LoadResult r = reader.load_latest(full.targets);
    CHECK(r.step == 50);
    CHECK(r.manifest.rank_state.at(0)["step"] == 5);
    CHECK(count_mismatches(states.back(), full.data) == 0);
  }
}

TEST_CASE("save_now_and_wait commits before the deadline") {
  TempDir dir;
  WriterOptions o;
  o.root = dir.path();
  Writer w(o);
  GlobalState g = GlobalState::make(small_gpt(true), 5);
  RankState rs = rank_state(g, Layout{}, 0);
  SaveStatus s = w.save_now_and_wait(77, rs.shards, {{"why", "SIGTERM"}}, Clock::now() + std::chrono::seconds(30));
  CHECK(s.state == SaveState::Committed);
  CHECK(s.bytes > 0);
  CHECK(s.snapshot_seconds >= 0);
  CHECK(Reader(dir.path()).latest_pointer() == 77);
}

TEST_CASE("bad input is refused with a message naming the tensor") {
  TempDir dir;
  WriterOptions o;
  o.root = dir.path();
  Writer w(o);
  std::vector<float> data(8);
  TensorShard s{"qkvw", DType::F32, {4, 2}, Box{{2, 0}, {4, 2}}, data.data(), 0, 1};
  CHECK_THROWS_WITH_AS(w.snapshot(1, {s}), doctest::Contains("'qkvw': box [2:6,0:2] is not inside"), railyard::Error);
  s.box = Box{{0, 0}, {4, 2}};
  s.replica_index = 2;
  s.num_replicas = 2;
  CHECK_THROWS_WITH_AS(w.snapshot(1, {s}), doctest::Contains("replica_index 2"), railyard::Error);
  WriterOptions multi;
  multi.root = dir.path();
  multi.world_size = 2;
  CHECK_THROWS_WITH_AS(Writer{multi}, doctest::Contains("run_id is required"), railyard::ConfigError);
  // Loading a tensor the checkpoint lacks, or with the wrong dtype, names it.
  s.replica_index = 0;
  s.num_replicas = 1;
  w.snapshot(1, {s});
  w.flush();
  Reader reader(dir.path());
  std::vector<float> out(8);
  CHECK_THROWS_WITH_AS(reader.load_step(1, {{"nope", DType::F32, Box{{0}, {1}}, out.data()}}),
                       doctest::Contains("tensor 'nope' is not in the checkpoint"), railyard::Error);
  CHECK_THROWS_WITH_AS(reader.load_step(1, {{"qkvw", DType::BF16, Box{{0, 0}, {1, 1}}, out.data()}}),
                       doctest::Contains("is f32, asked for bf16"), railyard::Error);
}

TEST_CASE("CLI: ls, inspect, verify and reshard") {
  TempDir dir;
  GlobalState g = GlobalState::make(small_gpt(true), 3);
  Layout saved{2, 2, 2, 0};
  for (const auto& s : save_with_threads(dir.path(), g, saved, 5, "cli")) CHECK(s.state == SaveState::Committed);
  auto run = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return cli_main(static_cast<int>(argv.size()), argv.data());
  };
  // Captures what a CLI command prints on stdout.
  auto output_of = [&](std::vector<std::string> args, int* code) {
    const std::string file = dir / "stdout.txt";
    std::fflush(stdout);
    int saved_fd = ::dup(1);
    FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    ::dup2(::fileno(f), 1);
    *code = run(std::move(args));
    std::fflush(stdout);
    ::dup2(saved_fd, 1);
    ::close(saved_fd);
    std::fclose(f);
    std::string text = railyard::read_file(file);
    std::filesystem::remove(file);
    return text;
  };
  int code = -1;
  std::string ls = output_of({"ckpt", "ls", dir.path()}, &code);
  CHECK(code == 0);
  CHECK_MESSAGE(ls.find("step-00000005") != std::string::npos, ls);
  CHECK_MESSAGE(ls.find("complete") != std::string::npos, ls);
  CHECK_MESSAGE(ls.find("latest") != std::string::npos, ls);
  std::string inspect = output_of({"ckpt", "inspect", dir.path()}, &code);
  CHECK(code == 0);
  CHECK_MESSAGE(inspect.find("qkvw") != std::string::npos, inspect);
  CHECK_MESSAGE(inspect.find("(4,96,32)") != std::string::npos, inspect);
  CHECK_MESSAGE(inspect.find("8 ranks") != std::string::npos, inspect);
  CHECK(run({"ckpt", "inspect", dir.path(), "--step", "5", "--json"}) == 0);
  CHECK(run({"ckpt", "verify", dir.path()}) == 0);
  CHECK(run({"ckpt", "verify", dir.path(), "--step", "6"}) == 1);
  CHECK(run({"ckpt", "bogus", dir.path()}) == 2);
  CHECK(run({"ckpt", "reshard", dir.path(), "--to-dp", "1"}) == 2);  // no --out
  CHECK(run({"ckpt", "inspect", dir.path(), "--step", "x"}) == 2);
  const std::string out = dir / "resharded";
  CHECK(run({"ckpt", "reshard", dir.path(), "--to-dp", "1", "--to-tp", "4", "--to-pp", "2", "--to-zero", "1", "--out",
             out}) == 0);
  Manifest m = Reader(out).read_manifest(5);
  Layout l = Layout::from_json(m.layout);
  CHECK(l.tp == 4);
  CHECK(l.pp == 2);
  CHECK(m.world_size == 8);
  CHECK(m.files.size() == 8);
  CHECK(run({"ckpt", "verify", out}) == 0);
  FullTargets full(g.defs);
  CHECK(Reader(out).load_latest(full.targets).step == 5);
  CHECK(count_mismatches(g, full.data) == 0);
  CHECK(load_and_compare(out, g, Layout{2, 2, 2, 1}) == 0);
}

TEST_CASE("multi-rank failure: one rank cannot write, every rank's save fails and the previous step stays") {
  TempDir dir;
  GlobalState g1 = GlobalState::make(small_gpt(false), 1), g2 = GlobalState::make(small_gpt(false), 2);
  Layout l{2, 1, 1, 0};
  for (const auto& s : save_with_threads(dir.path(), g1, l, 1, "ok")) REQUIRE(s.state == SaveState::Committed);
  // Rank 1's shard path is a directory, so its open() fails with EISDIR.
  std::filesystem::create_directories(dir / (temp_dir_name(2, "bad") + "/" + rank_file_name(1)));
  auto statuses = save_with_threads(dir.path(), g2, l, 2, "bad");
  REQUIRE(statuses.size() == 2);
  CHECK(statuses[1].state == SaveState::Failed);
  CHECK(statuses[1].error.find("Is a directory") != std::string::npos);
  CHECK(statuses[0].state == SaveState::Failed);
  CHECK_MESSAGE(statuses[0].error.find("rank 1 failed to write its shard") != std::string::npos, statuses[0].error);
  Reader reader(dir.path());
  CHECK(reader.latest_pointer() == 1);
  FullTargets full(g1.defs);
  CHECK(reader.load_latest(full.targets).step == 1);
  CHECK(count_mismatches(g1, full.data) == 0);
}

TEST_CASE("multi-rank barrier: a missing rank times out with the rank named") {
  TempDir dir;
  GlobalState g = GlobalState::make(small_gpt(false), 1);
  Layout l{2, 1, 1, 0};
  WriterOptions o = writer_options(dir.path(), l, 0, "lonely");
  o.commit_timeout = std::chrono::milliseconds(300);
  Writer w(o);
  RankState rs = rank_state(g, l, 0);
  w.snapshot(1, rs.shards);
  SaveStatus s = w.wait(1, Clock::now() + std::chrono::seconds(10));
  CHECK(s.state == SaveState::Failed);
  CHECK_MESSAGE(s.error.find("waiting for rank(s) 1") != std::string::npos, s.error);
  CHECK(Reader(dir.path()).complete_steps().empty());
  CHECK_FALSE(std::filesystem::exists(dir / temp_dir_name(1, "lonely")));
}

TEST_CASE("abandon: a save waiting for a rank that is gone ends at once, for rank 0 and for the others") {
  TempDir dir;
  GlobalState g = GlobalState::make(small_gpt(false), 1);
  Layout l{3, 1, 1, 0};
  for (int rank : {0, 1}) {  // rank 0 waits in gather for rank 2; rank 1 waits in wait_commit for rank 0's commit
    CAPTURE(rank);
    WriterOptions o = writer_options(dir.path(), l, rank, "gone" + std::to_string(rank));
    o.commit_timeout = std::chrono::minutes(10);  // without abandon() the save would wait this long
    Writer w(o);
    RankState rs = rank_state(g, l, rank);
    w.snapshot(1, rs.shards);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(w.idle());  // still waiting for the missing rank
    const auto t0 = Clock::now();
    w.abandon();
    SaveStatus s = w.wait(1, Clock::now() + std::chrono::seconds(10));
    CHECK(Clock::now() - t0 < std::chrono::seconds(2));
    CHECK(s.state == SaveState::Failed);
    if (rank == 0) CHECK_MESSAGE(s.error.find("abandoned waiting for rank(s) 1,2") != std::string::npos, s.error);
    CHECK(w.idle());
    // A save queued after abandon() fails at once without writing anything.
    w.snapshot(2, rs.shards);
    s = w.wait(2, Clock::now() + std::chrono::seconds(10));
    CHECK(s.state == SaveState::Failed);
    CHECK_MESSAGE(s.error.find("save abandoned") != std::string::npos, s.error);
  }
  CHECK(Reader(dir.path()).complete_steps().empty());
}

TEST_CASE("llm.c-style flat buffer: save from one contiguous buffer, load into another") {
  TempDir dir;
  auto defs = small_gpt(true);
  GlobalState g = GlobalState::make(defs, 8);
  std::vector<float> flat, back;
  for (const auto& d : defs) flat.insert(flat.end(), g.data.at(d.name).begin(), g.data.at(d.name).end());
  back.assign(flat.size(), 0.0f);
  std::vector<TensorShard> shards;
  for (const auto& v : flat_views(defs, flat.data())) {
    shards.push_back({v.def.name, v.def.dtype, v.def.shape, full_box(v.def.shape), v.data, 0, 1});
  }
  std::vector<LoadTarget> targets;
  for (const auto& v : flat_views(defs, back.data())) {
    targets.push_back({v.def.name, v.def.dtype, full_box(v.def.shape), v.data});
  }
  WriterOptions o;
  o.root = dir.path();
  Writer w(o);
  REQUIRE(w.save_now_and_wait(3, shards, {}, Clock::now() + std::chrono::seconds(30)).state == SaveState::Committed);
  CHECK(Reader(dir.path()).load_latest(targets).step == 3);
  CHECK(std::memcmp(flat.data(), back.data(), flat.size() * sizeof(float)) == 0);
}

TEST_CASE("replicas with less data than ranks: empty parts write no file, scalars are written once") {
  TempDir dir;
  const int world = 8;
  std::vector<float> scale = {1.5f, -2.0f, 3.25f};
  int32_t counter = 424242;
  std::vector<SaveStatus> statuses(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      WriterOptions o;
      o.root = dir.path();
      o.rank = r;
      o.world_size = world;
      o.run_id = "tiny";
      Writer w(o);
      std::vector<TensorShard> shards = {
          {"scale", DType::F32, {3}, Box{{0}, {3}}, scale.data(), r, world},
          {"counter", DType::I32, {}, Box{{}, {}}, &counter, r, world},
      };
      statuses[static_cast<size_t>(r)] = w.save_now_and_wait(1, shards, {}, Clock::now() + std::chrono::seconds(30));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : statuses) CHECK_MESSAGE(s.state == SaveState::Committed, s.error);
  Manifest m = Reader(dir.path()).read_manifest(1);
  // "scale" splits into parts of 0/1 elements: ranks 2, 5, 7 write one each, rank 0 the scalar, the rest nothing.
  CHECK(m.files.size() == 4);
  CHECK(m.files.count(rank_file_name(1)) == 0);
  CHECK(m.slices.size() == 4);
  std::vector<float> scale_back(3, 0.0f);
  int32_t counter_back = 0;
  Reader(dir.path())
      .load_step(1, {{"scale", DType::F32, Box{{0}, {3}}, scale_back.data()},
                     {"counter", DType::I32, Box{{}, {}}, &counter_back}});
  CHECK(scale_back == scale);
  CHECK(counter_back == 424242);
}
