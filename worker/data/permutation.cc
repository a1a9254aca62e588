#include "worker/data/permutation.h"

#include <numeric>

namespace railyard::worker {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t mix_key(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = a;
  uint64_t h = splitmix64(s);
  s = h ^ b;
  h = splitmix64(s);
  s = h ^ c;
  return splitmix64(s);
}

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t IndexPermutation::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & mask_;
  constexpr int kRounds = 6;
  for (int r = 0; r < kRounds; ++r) {
    uint64_t s = key_ ^ (static_cast<uint64_t>(r) << 56) ^ right;
    uint64_t f = splitmix64(s) & mask_;
    uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  // The domain is < 4n, so the walk takes fewer than 4 steps on average; it ends because encrypt is a bijection
  // and i is inside [0, n).
  uint64_t x = encrypt(i);
  while (x >= n_) x = encrypt(x);
  return x;
}

std::vector<size_t> shuffled_indices(size_t n, uint64_t key) {
  std::vector<size_t> v(n);
  std::iota(v.begin(), v.end(), size_t{0});
  uint64_t state = key;
  for (size_t i = n; i > 1; --i) {
    // Unbiased draw in [0, i): reject the few values above the largest multiple of i.
    const uint64_t bound = static_cast<uint64_t>(i);
    const uint64_t threshold = (0 - bound) % bound;
    uint64_t r = splitmix64(state);
    while (r < threshold) r = splitmix64(state);
    std::swap(v[i - 1], v[r % bound]);
  }
  return v;
}

}  // namespace railyard::worker
