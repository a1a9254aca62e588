// Helpers shared by the worker unit tests: temp directories, in-memory batch sources, a byte-level corpus.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker/train/trainer.h"

namespace railyard::worker::testing {

// A fresh directory under TMPDIR (or /tmp), removed with its contents when the object dies.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/railyard-worker-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

template <typename T>
inline void write_binary(const std::string& path, const T* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

template <typename T>
inline std::vector<T> read_binary(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot read " + path);
  const auto bytes = static_cast<size_t>(f.tellg());
  std::vector<T> v(bytes / sizeof(T));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  return v;
}

// The same batch every time (overfitting tests and the PyTorch reference).
class FixedBatch : public BatchSource {
 public:
  FixedBatch(std::vector<int32_t> inputs, std::vector<int32_t> targets)
      : inputs_(std::move(inputs)), targets_(std::move(targets)) {}
  void next_batch(int32_t* inputs, int32_t* targets) override {
    std::memcpy(inputs, inputs_.data(), inputs_.size() * sizeof(int32_t));
    std::memcpy(targets, targets_.data(), targets_.size() * sizeof(int32_t));
  }

 private:
  std::vector<int32_t> inputs_, targets_;
};

// Random (seeded) windows of T+1 tokens from an in-memory token stream; reset() replays the same windows.
class WindowSource : public BatchSource {
 public:
  WindowSource(std::vector<int32_t> tokens, int B, int T, uint64_t seed)
      : tokens_(std::move(tokens)), B_(B), T_(T), seed_(seed), rng_(seed) {}
  void next_batch(int32_t* inputs, int32_t* targets) override {
    std::uniform_int_distribution<size_t> pick(0, tokens_.size() - T_ - 2);
    for (int b = 0; b < B_; ++b) {
      const size_t start = pick(rng_);
      for (int t = 0; t < T_; ++t) {
        inputs[b * T_ + t] = tokens_[start + t];
        targets[b * T_ + t] = tokens_[start + t + 1];
      }
    }
  }
  void reset() override { rng_.seed(seed_); }

 private:
  std::vector<int32_t> tokens_;
  int B_, T_;
  uint64_t seed_;
  std::mt19937_64 rng_;
};

// Bytes of every file in /usr/share/common-licenses, in name order (Debian ships it on every system), as tokens.
inline std::vector<int32_t> license_corpus() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (e.is_regular_file()) names.push_back(e.path().string());
  }
  std::sort(names.begin(), names.end());
  std::vector<int32_t> tokens;
  for (const auto& n : names) {
    std::ifstream f(n, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    for (unsigned char ch : ss.str()) tokens.push_back(ch);
  }
  return tokens;
}

}  // namespace railyard::worker::testing
