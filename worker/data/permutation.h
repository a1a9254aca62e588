// Seeded permutations that are pure functions of their key, so a loader's shuffle needs no stored RNG state and
// gives the same order on every rank, machine and standard library (std:: distributions are not portable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace railyard::worker {

// splitmix64 step: advances state and returns the next 64 random bits.
uint64_t splitmix64(uint64_t& state);
// Hashes a few words into one key.
uint64_t mix_key(uint64_t a, uint64_t b, uint64_t c);

// A bijection on [0, n) chosen by key: a balanced Feistel network on the next power of four >= n with cycle
// walking. O(1) memory and time per lookup, so permuting billions of samples costs nothing up front.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t encrypt(uint64_t x) const;

  uint64_t n_;
  uint64_t key_;
  int half_bits_ = 1;
  uint64_t mask_ = 1;
};

// Fisher-Yates shuffle of 0..n-1 driven by splitmix64(key).
std::vector<size_t> shuffled_indices(size_t n, uint64_t key);

}  // namespace railyard::worker
