// half_bits.h: float <-> bf16 and f16 bit patterns, round to nearest even, NaN kept a quiet
// NaN with its top payload bits (bit for bit what F16C's vcvtps2ph / vcvtph2ps give, so every
// ISA variant agrees), overflow to infinity, f16 subnormals exact. The one implementation of these
// conversions: the public gdn::bf16_bits / gdn::f16_bits (src/api/tensor.cc), the float64
// reference and the portable kernel variant all use it.
//
// The functions are `static inline` on purpose: each translation unit, including the per-ISA
// kernel units compiled with AVX flags, keeps its own copy, so the linker can never hand a
// generic caller a copy compiled for another ISA (an inline function with external linkage
// would be merged across units).
#pragma once

#include <cstdint>

namespace gdn::detail {

static inline std::uint32_t float_bits(float f) {
  std::uint32_t x;
  __builtin_memcpy(&x, &f, sizeof x);
  return x;
}
static inline float bits_float(std::uint32_t x) {
  float f;
  __builtin_memcpy(&f, &x, sizeof f);
  return f;
}

static inline std::uint16_t bf16_from_float(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float float_from_bf16(std::uint16_t h) {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

static inline std::uint16_t f16_from_float(float f) {
  std::uint32_t x = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  // NaN: quiet, keeping the top 10 payload bits (as the F16C instructions do).
  if (x > 0x7f800000u) return sign | 0x7e00u | static_cast<std::uint16_t>((x >> 13) & 0x3ffu);
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // at or past halfway above 65504: infinity
  if (x < 0x38800000u) {
    // Below 2^-14: a multiple of 2^-24. |f| 2^24 is exact; rounding it to an integer (ties to
    // even, by the 2^23 trick) gives the subnormal's bits, or 0x400 (2^-14) when it rounds up.
    const float scaled = bits_float(x) * 16777216.0f;
    const float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return sign | static_cast<std::uint16_t>(rounded);
  }
  x += 0xfffu + ((x >> 13) & 1u);  // round the 13 dropped bits, carrying into the exponent
  return sign | static_cast<std::uint16_t>((x >> 13) - (112u << 10));
}
static inline float float_from_f16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) {  // infinity, or a NaN made quiet (as the F16C instructions do)
    return bits_float(sign | (mantissa != 0 ? 0x7fc00000u : 0x7f800000u) | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace gdn::detail
