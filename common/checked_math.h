// Products of values that come from outside (a TrainingJob's spec, a status someone edited): the one place they are
// multiplied, so that an overflow is a value the caller refuses, never undefined behaviour or a wrapped 0 that a
// later `%` divides by (issue #40: microBatch 2^30 times 4 replicas wrapped to 0 and SIGFPE'd the operator).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace railyard {

// The product of `factors` when it is within [-limit, limit] (limit >= 0), else nullopt: an intermediate that
// overflows int64 or a result beyond `limit` (pass INT32_MAX for a result stored in an int).
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors, int64_t limit = INT64_MAX) {
  int64_t out = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(out, f, &out)) return std::nullopt;
  if (out > limit || out < -limit) return std::nullopt;
  return out;
}

// a + b clamped to the int64 range: totals of values from outside (the resource quantities of every pod on a node,
// which a pod template can set to 9e18 each) stay ordered instead of wrapping negative.
inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return b > 0 ? INT64_MAX : INT64_MIN;
  return out;
}

}  // namespace railyard
