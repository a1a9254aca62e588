// Helpers shared by the checkpoint tests: temp directories, deterministic synthetic model state, and the shards a
// rank of a given layout holds.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "common/error.h"
#include "tests/temp_dir.h"

namespace railyard::ckpt::test {

class TempDir : public railyard::test::ScopedTempDir {
 public:
  explicit TempDir(const std::string& prefix = "ckpt-test") : ScopedTempDir(prefix), path_(dir().string()) {}
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& s) const { return path_ + "/" + s; }

 private:
  std::string path_;
};

inline uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// The global contents of every tensor: a deterministic function of (seed, tensor name, element index).
struct GlobalState {
  std::vector<TensorDef> defs;
  std::map<std::string, std::vector<float>> data;

  static GlobalState make(const std::vector<TensorDef>& defs, uint64_t seed) {
    GlobalState g;
    g.defs = defs;
    for (const auto& d : defs) {
      auto& v = g.data[d.name];
      v.resize(static_cast<size_t>(shape_volume(d.shape)));
      const uint64_t base = splitmix(seed ^ name_hash(d.name));
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<float>(static_cast<int64_t>(splitmix(base + i) >> 40) - (1 << 23)) / 1048576.0f;
      }
    }
    return g;
  }
  const TensorDef& def(const std::string& name) const {
    for (const auto& d : defs) {
      if (d.name == name) return d;
    }
    FAIL("no tensor " << name);
    return defs.front();
  }
};

// A rank's copy of its boxes (what a worker would hold in memory), as TensorShards for the writer.
struct RankState {
  std::vector<std::vector<float>> buffers;
  std::vector<TensorShard> shards;
  std::vector<PlacedBox> boxes;
};

inline RankState rank_state(const GlobalState& g, const Layout& layout, int rank) {
  RankState rs;
  rs.boxes = rank_boxes(layout, rank, g.defs);
  rs.buffers.reserve(rs.boxes.size());
  for (const auto& pb : rs.boxes) {
    const TensorDef& d = g.def(pb.tensor);
    rs.buffers.emplace_back(static_cast<size_t>(pb.box.volume()));
    copy_region(g.data.at(pb.tensor).data(), full_box(d.shape), rs.buffers.back().data(), pb.box, pb.box, 4);
    TensorShard s;
    s.name = pb.tensor;
    s.dtype = DType::F32;
    s.global_shape = d.shape;
    s.box = pb.box;
    s.data = rs.buffers.back().data();
    s.replica_index = pb.replica_index;
    s.num_replicas = pb.num_replicas;
    rs.shards.push_back(s);
  }
  return rs;
}

// Load targets for the full global tensors.
struct FullTargets {
  std::map<std::string, std::vector<float>> data;
  std::vector<LoadTarget> targets;
  explicit FullTargets(const std::vector<TensorDef>& defs) {
    for (const auto& d : defs) data[d.name].assign(static_cast<size_t>(shape_volume(d.shape)), -12345.0f);
    for (const auto& d : defs) targets.push_back({d.name, d.dtype, full_box(d.shape), data[d.name].data()});
  }
};

// Number of elements that differ between what was loaded and the global state.
inline size_t count_mismatches(const GlobalState& g, const std::map<std::string, std::vector<float>>& got) {
  size_t bad = 0;
  for (const auto& d : g.defs) {
    const auto& want = g.data.at(d.name);
    const auto& have = got.at(d.name);
    if (want.size() != have.size()) return want.size();
    if (std::memcmp(want.data(), have.data(), want.size() * sizeof(float)) != 0) {
      for (size_t i = 0; i < want.size(); ++i) bad += std::memcmp(&want[i], &have[i], sizeof(float)) != 0;
    }
  }
  return bad;
}

inline std::vector<TensorDef> small_gpt(bool with_optimizer) {
  // L=4 C=32 maxT=16 Vp=128: divisible by tp up to 4, layers by pp up to 4.
  return gpt_tensor_defs(4, 32, 16, 128, with_optimizer);
}

// Forks a child that runs `child(fd)`, fd the write end of a pipe to the parent, and _exits with what it returns.
// Returns the child's pid and the read end: the crash tests' way to learn that a child has got to a given point.
template <class Child>
std::pair<pid_t, int> fork_child(Child&& child) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::_exit(child(fds[1]));
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Waits for the byte a fork_child child writes when it is ready, and closes the pipe.
inline void wait_ready(int fd) {
  char b = 0;
  ssize_t n = ::read(fd, &b, 1);
  ::close(fd);
  REQUIRE(n == 1);
}

}  // namespace railyard::ckpt::test
