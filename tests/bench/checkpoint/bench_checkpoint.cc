// Checkpoint benchmark for GPT-2 sized training state (parameters + AdamW m and v, fp32): snapshot stall, background
// persist throughput beside dd's sequential write rate in the same directory, and restore from shared memory vs
// disk (page cache warm and cold). Run by tests/bench/checkpoint/run.sh; never by ctest.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "checkpoint/shm_store.h"
#include "checkpoint/writer.h"

using namespace railyard::ckpt;
using Sec = std::chrono::duration<double>;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Model {
  std::string name;
  int layers, channels;
};

// dd with conv=fsync in the checkpoint directory; returns bytes per second.
double dd_rate(const std::string& dir, uint64_t bytes) {
  const uint64_t mib = bytes >> 20;
  const std::string file = dir + "/dd.tmp";
  const std::string cmd = "dd if=/dev/zero of=" + file + " bs=1M count=" + std::to_string(mib) + " conv=fsync 2>&1";
  double t0 = now_s();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char buf[512];
  std::string out;
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int rc = ::pclose(p);
  double dt = now_s() - t0;
  std::filesystem::remove(file);
  if (rc != 0) {
    std::fprintf(stderr, "dd failed: %s\n", out.c_str());
    return 0;
  }
  return static_cast<double>(mib << 20) / dt;
}

void drop_file_cache(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/railyard-ckpt-bench";
  std::vector<Model> models;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--model" && i + 1 < argc) {
      std::string m = argv[++i];
      if (m == "gpt2-124m") {
        models.push_back({m, 12, 768});
      } else if (m == "gpt2-350m") {
        models.push_back({m, 24, 1024});
      } else {
        std::fprintf(stderr, "--model %s: use gpt2-124m or gpt2-350m\n", m.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench_checkpoint [--dir DIR] [--model gpt2-124m|gpt2-350m]...\n");
      return 2;
    }
  }
  if (models.empty()) models = {{"gpt2-124m", 12, 768}, {"gpt2-350m", 24, 1024}};
  std::filesystem::create_directories(dir);

  {  // CRC32C rate on 256 MiB
    std::vector<unsigned char> buf(256u << 20, 0x5a);
    double t0 = now_s();
    uint32_t c = crc32c(buf.data(), buf.size());
    double hw = static_cast<double>(buf.size()) / (now_s() - t0);
    t0 = now_s();
    uint32_t c2 = crc32c_portable(buf.data(), buf.size());
    double sw = static_cast<double>(buf.size()) / (now_s() - t0);
    std::printf("crc32c: %s %.2f GB/s, slicing-by-8 %.2f GB/s (%s)\n", crc32c_hardware() ? "sse4.2" : "portable",
                hw / 1e9, sw / 1e9, c == c2 ? "agree" : "DISAGREE");
  }

  for (const Model& m : models) {
    auto defs = gpt_tensor_defs(m.layers, m.channels, 1024, 50304, true);
    uint64_t bytes = 0;
    std::vector<std::unique_ptr<float[]>> data;
    std::vector<TensorShard> shards;
    std::vector<LoadTarget> targets;
    for (const auto& d : defs) {
      const auto n = static_cast<size_t>(shape_volume(d.shape));
      data.emplace_back(new float[n]);
      for (size_t i = 0; i < n; ++i) data.back()[i] = static_cast<float>(i % 1000) * 0.001f;
      shards.push_back({d.name, d.dtype, d.shape, full_box(d.shape), data.back().get(), 0, 1});
      targets.push_back({d.name, d.dtype, full_box(d.shape), data.back().get()});
      bytes += n * 4;
    }
    const std::string root = dir + "/" + m.name;
    std::filesystem::remove_all(root);
    std::printf("\n%s: %zu tensors, %.2f GB of fp32 state (params + AdamW m, v)\n", m.name.c_str(), defs.size(),
                static_cast<double>(bytes) / 1e9);
    const double dd = dd_rate(dir, bytes);
    std::printf("  dd conv=fsync, same directory     %7.2f GB/s\n", dd / 1e9);
    WriterOptions o;
    o.root = root;
    o.keep = 1;
    {
      Writer w(o);
      for (int step = 1; step <= 2; ++step) {
        SaveStatus s = w.snapshot(step, shards);
        SaveStatus done = w.wait(step, railyard::ckpt::Clock::now() + std::chrono::minutes(10));
        if (done.state != SaveState::Committed) {
          std::fprintf(stderr, "save failed: %s\n", done.error.c_str());
          return 1;
        }
        std::printf("  save %d: snapshot stall %7.3f s (%s buffer), persist %6.2f s = %5.2f GB/s (%.0f%% of dd)\n",
                    step, s.snapshot_seconds, step == 1 ? "cold" : "warm", done.persist_seconds,
                    static_cast<double>(done.bytes) / done.persist_seconds / 1e9,
                    100.0 * static_cast<double>(done.bytes) / done.persist_seconds / dd);
      }
    }
    {  // What a trainer does at startup: pre-fault the buffer outside the training step.
      Writer fresh(o);
      double r0 = now_s();
      fresh.reserve(snapshot_bytes(shards));
      double reserve_s = now_s() - r0;
      SaveStatus s = fresh.snapshot(3, shards);
      SaveStatus done = fresh.wait(3, railyard::ckpt::Clock::now() + std::chrono::minutes(10));
      std::printf(
          "  save 3: new writer, reserve() %.3f s at startup, then snapshot stall %7.3f s, persist %6.2f s (%s)\n",
          reserve_s, s.snapshot_seconds, done.persist_seconds, std::string(save_state_name(done.state)).c_str());
    }
    // Restores (into the same memory the state lives in).
    Reader reader(root);
    double t0 = now_s();
    LoadResult r = reader.load_latest(targets);
    double warm = now_s() - t0;
    drop_file_cache(root);
    t0 = now_s();
    r = reader.load_latest(targets);
    double cold = now_s() - t0;
    std::printf("  restore from disk: page cache warm %6.3f s, cold %6.3f s (%.2f GB/s), step %lld\n", warm, cold,
                static_cast<double>(r.bytes_read) / cold / 1e9, static_cast<long long>(r.step));
    const std::string shm_name = ShmStore::name_for("bench-" + m.name, 0);
    {
      ShmStore store(shm_name);
      t0 = now_s();
      store.put(3, shards);
      double put_cold = now_s() - t0;
      t0 = now_s();
      store.put(3, shards);
      double put_warm = now_s() - t0;
      std::printf("  shm put (in-memory tier stall): first %6.3f s, again %6.3f s\n", put_cold, put_warm);
      std::string why;
      t0 = now_s();
      auto got = store.get(targets, nullptr, &why, true);
      double get_verified = now_s() - t0;
      t0 = now_s();
      got = store.get(targets, nullptr, &why, false);
      double get_fast = now_s() - t0;
      if (!got) std::fprintf(stderr, "shm get failed: %s\n", why.c_str());
      std::printf("  restore from shm: %6.3f s with CRC check, %6.3f s without (cold disk / shm = %.1fx)\n",
                  get_verified, get_fast, cold / get_verified);
    }
    ShmStore::remove(shm_name);
    std::filesystem::remove_all(root);
  }
  return 0;
}
