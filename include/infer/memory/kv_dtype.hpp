#pragma once
/// \file
/// `KvCacheDtype`: what the KV cache stores, as vLLM's `--kv-cache-dtype`. `automatic` keeps the model's
/// activation type (f32 on the CPU, bf16 on the GPU); `fp8_e4m3` stores each K and V value as an e4m3 code
/// of value / scale, with one scale for K and one for V per layer: the checkpoint's where it ships them
/// (ModelSource::kv_cache_scales), else 1.0, as vLLM does. Half the bytes of bf16 per token, so twice the
/// tokens in the same pool, and half the bytes the decode attention reads.
///
/// Rounding: an e4m3 code keeps 4 significant bits, so a stored value is within 2^-4 of its magnitude
/// (relative) from 2^-6 · scale up to 448 · scale, and within 2^-10 · scale absolute below that; values past
/// ±448 · scale saturate. The attention reads the codes back exactly (code · scale).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "infer/core/error.hpp"

namespace infer {

enum class KvCacheDtype : std::uint8_t { automatic, fp8_e4m3 };

/// "auto", "fp8" or "fp8_e4m3" (vLLM's spellings); InvalidArgument naming the choices otherwise.
inline KvCacheDtype parse_kv_cache_dtype(std::string_view s) {
  if (s == "auto") return KvCacheDtype::automatic;
  if (s == "fp8" || s == "fp8_e4m3") return KvCacheDtype::fp8_e4m3;
  throw InvalidArgument(detail::cat("kv_cache_dtype '", s, "' is not one of auto, fp8, fp8_e4m3"));
}

inline std::string_view to_string(KvCacheDtype d) noexcept {
  return d == KvCacheDtype::fp8_e4m3 ? "fp8_e4m3" : "auto";
}

/// Whether `s` can scale e4m3 codes: positive and finite.
constexpr bool valid_kv_scale(float s) noexcept { return s > 0.0f && s <= std::numeric_limits<float>::max(); }

/// InvalidArgument naming `who` unless both scales are valid_kv_scale.
inline void require_kv_scales(std::string_view who, float k_scale, float v_scale) {
  require<InvalidArgument>(valid_kv_scale(k_scale) && valid_kv_scale(v_scale), who, ": FP8 KV-cache scales ", k_scale,
                           ", ", v_scale, " must be positive and finite");
}

/// Bytes of one stored K or V value: `automatic_bytes` (the backend's own type) or 1 for e4m3.
constexpr std::size_t kv_value_bytes(KvCacheDtype d, std::size_t automatic_bytes) noexcept {
  return d == KvCacheDtype::fp8_e4m3 ? 1 : automatic_bytes;
}

}  // namespace infer
