#pragma once
/// \file
/// FP8 E4M3 (the OCP "E4M3FN" format Hopper's tensor cores take, `__nv_fp8_e4m3`): 1 sign bit, 4 exponent
/// bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN; the largest finite value is 448; the
/// subnormals are m/8 · 2^-6. The host's definition of those bits, for the CPU reference of FP8 weights and
/// activations (quant/fp8.hpp) and for checking the GPU's conversions against.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

namespace infer {

/// e4m3 → f32, exact.
constexpr float e4m3_to_f32(std::uint8_t v) {
  const std::uint32_t e = (v >> 3) & 0xfu, m = v & 0x7u;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  float r = e == 0 ? static_cast<float>(m) * 0x1p-9f : (1.0f + static_cast<float>(m) * 0.125f);
  for (std::uint32_t k = 7; k < e; ++k) r *= 2.0f;  // 2^(e - 7), exact
  for (std::uint32_t k = e; k < 7 && e != 0; ++k) r *= 0.5f;
  return (v & 0x80u) ? -r : r;
}

/// Every e4m3 code's value (e4m3_to_f32 of 0..255), for decoding many codes: one load each instead of the
/// exponent loop. A table rather than bit tricks, so it is exactly e4m3_to_f32.
inline const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (std::size_t c = 0; c < t.size(); ++c) t[c] = e4m3_to_f32(static_cast<std::uint8_t>(c));
    return t;
  }();
  return table;
}

inline constexpr float kE4m3Max = 448.0f;

/// f32 → e4m3, rounding to nearest (ties to the even code) and saturating to ±448, as the GPU's
/// `cvt.rn.satfinite.e4m3x2.f32` does; NaN → 0x7f. The positive codes 0x00..0x7e are increasing values, so
/// the nearest is found by binary search, and a midpoint (exact in f32: at most 5 significant bits) goes to
/// the code whose last mantissa bit is 0.
inline std::uint8_t f32_to_e4m3(float f) {
  static const std::array<float, 127> values = [] {
    std::array<float, 127> v{};
    for (std::size_t c = 0; c < v.size(); ++c) v[c] = e4m3_to_f32(static_cast<std::uint8_t>(c));
    return v;
  }();
  if (std::isnan(f)) return 0x7f;
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= kE4m3Max) return sign | 0x7e;
  // The largest code whose value is <= a, then the nearer of it and the next.
  const auto c = static_cast<std::uint8_t>(std::upper_bound(values.begin(), values.end(), a) - values.begin() - 1);
  const float lo = values[c], hi = values[c + 1u], mid = 0.5f * (lo + hi);
  const std::uint8_t code = a < mid ? c : a > mid ? static_cast<std::uint8_t>(c + 1) : (c % 2 == 0 ? c : static_cast<std::uint8_t>(c + 1));
  return sign | code;
}

}  // namespace infer
