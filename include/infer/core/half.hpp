#pragma once
/// \file
/// Bit-exact conversions between f32 and the 16-bit float formats, usable on host and device.
/// Host code (file readers, the CPU reference) stores f16/bf16 as raw `uint16_t`; these functions are
/// the single definition of how those bits become floats, so the CPU oracle and CUDA kernels agree.

#include <bit>
#include <cstdint>
#include <cstring>

#include "infer/core/macros.hpp"

namespace infer {

namespace detail {
INFER_HD std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
INFER_HD float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

/// IEEE binary16 → f32, exact (subnormals, infinities and NaN included).
INFER_HD float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return detail::bits_f32(sign);
    // Subnormal: value = mant * 2^-24, exactly representable in f32.
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return detail::bits_f32(sign | 0x7f800000u | (mant << 13));
  return detail::bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/// f32 → IEEE binary16 with round-to-nearest-even; overflow gives ±inf, NaN stays NaN.
INFER_HD std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = detail::f32_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale into the subnormal range and round once.
    const float a = detail::bits_f32(abs);
    const float scaled = a * 16777216.0f;  // a / 2^-24
    auto m = static_cast<std::uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  const std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

/// bfloat16 → f32, exact.
INFER_HD float bf16_to_f32(std::uint16_t b) { return detail::bits_f32(static_cast<std::uint32_t>(b) << 16); }

/// f32 → bfloat16 with round-to-nearest-even; NaN stays NaN.
INFER_HD std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = detail::f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace infer
