// bfloat16 stored as uint16_t: the upper half of an fp32. Conversions used by the Gloo backend (which reduces bf16 in
// fp32) and by tests that build bf16 inputs.
#pragma once

#include <cstdint>
#include <cstring>

namespace railyard::worker::comm {

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest, ties to even (what hardware converters do); NaN stays a quiet NaN instead of rounding to inf.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace railyard::worker::comm
