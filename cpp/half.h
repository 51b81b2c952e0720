// fp16 / bf16 storage types and round-to-nearest-even conversions for the CPU ops (no CUDA
// headers on CPU-only builds). Results match torch's CPU casts bit for bit.
#pragma once
#include <cstdint>
#include <cstring>

namespace opforge::cpu {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
inline float to_float(T v);
template <>
inline float to_float<float>(float v) { return v; }
template <>
inline float to_float<BFloat16>(BFloat16 v) { return bits_float(uint32_t(v.bits) << 16); }
template <>
inline float to_float<Half>(Half v) {
  const uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  const uint32_t exp = (v.bits >> 10) & 0x1fu;
  const uint32_t mant = v.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  // zero or subnormal: mant * 2^-24 is exact in fp32
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

template <typename T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
template <>
inline BFloat16 from_float<BFloat16>(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40u)};  // quiet the NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the 16 dropped bits
  return BFloat16{uint16_t(u >> 16)};
}
template <>
inline Half from_float<Half>(float f) {
  uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u >= 0x47800000u) {  // |f| >= 65536 (or inf/nan): nan stays nan, the rest overflow to inf
    return Half{uint16_t(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  }
  if (u < 0x38800000u) {
    // Below 2^-14 the result is subnormal: adding 0.5 (2^-1) aligns the value so that the fp32
    // adder's own round-to-nearest-even drops exactly the bits a half subnormal cannot hold.
    const float shifted = bits_float(u) + 0.5f;
    return Half{uint16_t(sign | (float_bits(shifted) - 0x3f000000u))};
  }
  // Normal range: rebias the exponent and round the 13 dropped mantissa bits half to even. A
  // carry out of the mantissa correctly bumps the exponent (and 65520 and up becomes inf).
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // (15 - 127) << 23, plus the rounding bias
  return Half{uint16_t(sign | (u >> 13))};
}

}  // namespace opforge::cpu
