#pragma once
/// \file
/// The CPU attention kernel: one template over any KvView, shared by PagedAttention and
/// FusedContiguousAttention (they differ only in how a token's K/V row is found, which the view says).
///
/// Causal attention for a chunk of `count` query tokens at positions start..start+count-1 of one
/// sequence: query i sees positions 0..start+i. GQA: query head h reads KV head h / (H / KVH).
///
/// Work is organised so that K/V are read from memory once per KV head: positions are walked in tiles
/// of `kv_tile` rows, and each tile (a few KB, L1-resident) serves every query token of the chunk and
/// every query head of the KV head's group before the next tile is touched. Softmax is the online
/// (streaming) kind, one rescale per tile: with m the running max and l the running sum,
///   m' = max(m, max_t s_t),  l' = l·e^(m−m') + Σ e^(s_t−m'),  acc' = acc·e^(m−m') + Σ e^(s_t−m')·v_t,
/// so no exponent ever sees a positive argument (no overflow) and no score row is materialised.
/// Tiles start at absolute multiples of `kv_tile`, so a query's result does not depend on how its
/// sequence was chunked (prefill in one piece and token-by-token decode add in the same order).
///
/// Only rows of positions < start + count are read: an unwritten (e.g. NaN-poisoned) slot beyond the
/// chunk is never touched.
///
/// A view of e4m3 codes (an FP8 KV cache) is decoded a tile at a time (code · scale, one f32 product) into a
/// buffer the tile's queries then read: the arithmetic after that is the f32 cache's, so an FP8 cache's
/// attention equals the f32 kernel's over the decoded values bit for bit.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "infer/attention/kv_view.hpp"
#include "infer/concepts.hpp"
#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"

namespace infer::kernels::cpu {

namespace detail {

/// Eight independent partial sums: the compiler vectorizes this without -ffast-math (a single
/// accumulator would force it to add in order, one lane at a time).
inline float dot(const float* a, const float* b, std::int32_t n) {
  float acc[8] = {};
  std::int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::int32_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

/// The KV tile of a Tuning type: `Tuning::cpu_kv_tile` when it has one, else 64 rows (64 rows of a
/// 128-wide head are 32 KB of K: still within L1+L2 next to V on current cores).
template <class Tuning>
consteval std::int32_t cpu_kv_tile() {
  if constexpr (requires { Tuning::cpu_kv_tile; }) return static_cast<std::int32_t>(Tuning::cpu_kv_tile);
  else return 64;
}

}  // namespace detail

/// out[i][h][:] = softmax_p(q[i][h] · K[p][h/group] · scale) · V[p][h/group], p ≤ start + i.
/// q and out are [count][num_heads][head_dim]. InvalidArgument when the shape disagrees with the view.
/// Thread-safe: the small softmax state is a thread_local buffer, grown once and then reused.
template <std::int32_t KvTile = 64, KvView View>
void attention(const AttentionShape& shape, const float* q, float* out, std::int32_t start, std::int32_t count,
               const View& kv) {
  static_assert(KvTile >= 1 && KvTile <= 1024, "cpu::attention: KvTile must be in [1, 1024]");
  using infer::detail::cat;
  const std::int32_t H = shape.num_heads, KVH = shape.num_kv_heads, D = shape.head_dim;
  if (H <= 0 || KVH <= 0 || D <= 0 || H % KVH != 0)
    throw InvalidArgument(cat("attention: num_heads = ", H, ", num_kv_heads = ", KVH, ", head_dim = ", D,
                              "; all must be positive and num_kv_heads must divide num_heads"));
  if (kv.kv_heads != KVH || kv.head_dim != D)
    throw InvalidArgument(cat("attention: the KV view has ", kv.kv_heads, " heads of ", kv.head_dim,
                              " values, the shape asks for ", KVH, " of ", D));
  if (start < 0 || count < 0)
    throw InvalidArgument(cat("attention: start = ", start, " and count = ", count, " must not be negative"));
  if (count == 0) return;

  const std::int32_t G = H / KVH;
  const std::int32_t end = start + count;
  // Running max and sum per (query token, head of the group); grown once, reused every call.
  thread_local std::vector<float> state;
  const auto n_state = static_cast<std::size_t>(count) * static_cast<std::size_t>(G);
  if (state.size() < 2 * n_state) state.resize(2 * n_state);
  float* m = state.data();
  float* l = state.data() + n_state;

  const auto at = [&](std::int32_t i, std::int32_t h) {
    return (static_cast<std::size_t>(i) * static_cast<std::size_t>(H) + static_cast<std::size_t>(h)) *
           static_cast<std::size_t>(D);
  };
  const float* kp[KvTile];
  const float* vp[KvTile];
  float s[KvTile];
  // An FP8 view: the tile's K rows, then its V rows, decoded.
  using Stored = std::remove_cv_t<std::remove_pointer_t<decltype(kv.k_at(0, 0))>>;
  constexpr bool kCodes = std::is_same_v<Stored, std::uint8_t>;
  static_assert(kCodes || std::is_same_v<Stored, float>, "cpu::attention reads f32 values or e4m3 codes");
  thread_local std::vector<float> decoded;
  const auto tile_values = static_cast<std::size_t>(KvTile) * static_cast<std::size_t>(D);
  const float* e4m3_values = kCodes ? e4m3_table().data() : nullptr;  // every code's value
  if constexpr (kCodes) {
    if (decoded.size() < 2 * tile_values) decoded.resize(2 * tile_values);
  }

  for (std::int32_t g = 0; g < KVH; ++g) {
    for (std::int32_t i = 0; i < count; ++i)
      for (std::int32_t j = 0; j < G; ++j) {
        m[i * G + j] = -std::numeric_limits<float>::infinity();
        l[i * G + j] = 0.0f;
        std::fill_n(out + at(i, g * G + j), D, 0.0f);
      }
    for (std::int32_t p0 = 0; p0 < end; p0 += KvTile) {
      const std::int32_t p1 = std::min(p0 + KvTile, end);
      for (std::int32_t p = p0; p < p1; ++p) {
        if constexpr (kCodes) {
          float* kd = decoded.data() + static_cast<std::size_t>(p - p0) * static_cast<std::size_t>(D);
          float* vd = kd + tile_values;
          const std::uint8_t* kc = kv.k_at(p, g);
          const std::uint8_t* vc = kv.v_at(p, g);
          for (std::int32_t d = 0; d < D; ++d) {
            kd[d] = e4m3_values[kc[d]] * kv.k_scale;
            vd[d] = e4m3_values[vc[d]] * kv.v_scale;
          }
          kp[p - p0] = kd;
          vp[p - p0] = vd;
        } else {
          kp[p - p0] = kv.k_at(p, g);
          vp[p - p0] = kv.v_at(p, g);
        }
      }
      // Query i sees positions up to start + i: the tile is visible from i = p0 - start on.
      for (std::int32_t i = std::max(0, p0 - start); i < count; ++i) {
        const std::int32_t n = std::min(p1, start + i + 1) - p0;
        for (std::int32_t j = 0; j < G; ++j) {
          const std::int32_t h = g * G + j;
          const float* qr = q + at(i, h);
          float* o = out + at(i, h);
          float mx = -std::numeric_limits<float>::infinity();
          for (std::int32_t t = 0; t < n; ++t) {
            s[t] = detail::dot(qr, kp[t], D) * shape.scale;
            mx = std::max(mx, s[t]);
          }
          float& mi = m[i * G + j];
          float& li = l[i * G + j];
          const float m_new = std::max(mi, mx);
          const float corr = std::exp(mi - m_new);  // 0 on the first tile (mi = -inf)
          if (corr != 1.0f) {
            li *= corr;
            for (std::int32_t d = 0; d < D; ++d) o[d] *= corr;
          }
          for (std::int32_t t = 0; t < n; ++t) {
            const float e = std::exp(s[t] - m_new);
            li += e;
            const float* vr = vp[t];
            for (std::int32_t d = 0; d < D; ++d) o[d] += e * vr[d];
          }
          mi = m_new;
        }
      }
    }
    for (std::int32_t i = 0; i < count; ++i)
      for (std::int32_t j = 0; j < G; ++j) {
        const float inv = 1.0f / l[i * G + j];
        float* o = out + at(i, g * G + j);
        for (std::int32_t d = 0; d < D; ++d) o[d] *= inv;
      }
  }
}

}  // namespace infer::kernels::cpu
