#pragma once
/// \file
/// The 64-value *units* of the CUDA GGUF GEMV's unit walks (kernels/cuda/gguf_gemv.cu), written once for host
/// and device (`INFER_HD`): the kernel runs them on blocks in shared memory, and the CPU test
/// (tests/unit/quant/test_gguf_units.cpp) runs the very same code against quant::segment_dot, so the layouts are
/// pinned in CI, where no GPU runs.
///
/// Why units: a 32-value segment (gguf_dot.hpp) is the natural piece of a GGUF block, but reading one costs
/// byte loads of its header and unaligned word loads; the GEMV then spent ~3 instructions a value and read
/// Q4_K at 1.2-1.5 TB/s, issue-bound. A unit is the 64 values that share the bytes one lane should load:
///   - a *pair* of Q4_K/Q5_K sub-blocks 2p, 2p+1, whose codes are the low and high nibbles of the same 32
///     bytes (two 16-byte loads) under one 16-byte header;
///   - a Q6_K *run unit* (h, t): positions 16t..16t+15 of each of the four 32-value runs of half h, which
///     share 16 bytes of high bits and two 16-byte spans of low nibbles;
///   - a *Q8_0 pair*: two neighbouring 34-byte blocks, 68 bytes at a 4-byte aligned address.
/// x is laid out for them in 16-value *pieces*: piece r of unit u of a row at (r·U + u)·16 bytes, U = K / 64
/// units a row, so eight lanes on neighbouring units read 128 contiguous bytes of shared memory. Where a
/// value of the row goes is `pair_piece_of` (pairs of both kinds) or `q6_run_piece_of`.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "infer/core/half.hpp"
#include "infer/core/macros.hpp"
#include "infer/quant/gguf_dot.hpp"

namespace infer::quant {

/// Values of one unit.
inline constexpr int kUnitVals = 64;

/// A value's place in the piece layout: unit `unit`, 16-value piece `piece` (0..3) of it, and offset `at`
/// (0..15) in the piece.
struct PiecePos {
  std::uint32_t unit, piece, at;
};
/// Pairs (Q4_K, Q5_K, Q8_0): unit u holds values 64u..64u+63, piece r values 64u + 16r...
INFER_HD PiecePos pair_piece_of(std::uint32_t v) { return {v / 64, (v % 64) / 16, v % 16}; }
/// Q6_K: value v is position l = v % 32 of run q = (v / 32) % 4 of half h = (v / 128) % 2 of block v / 256; its
/// unit is 4·block + 2h + l / 16 and its piece q.
INFER_HD PiecePos q6_run_piece_of(std::uint32_t v) {
  return {(v / 256) * 4 + ((v / 128) % 2) * 2 + (v % 32) / 16, (v / 32) % 4, v % 16};
}

namespace detail {
/// NW little-endian words from a 4-byte aligned address (16-byte aligned where NW is a multiple of 4, on the
/// device: vector loads).
template <int NW>
INFER_HD void load_words_aligned(const std::uint8_t* p, std::uint32_t (&w)[NW]) {
#if defined(__CUDA_ARCH__)
  if constexpr (NW % 4 == 0) {
    const auto* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < NW / 4; ++i) {
      const uint4 u = v[i];
      w[4 * i] = u.x;
      w[4 * i + 1] = u.y;
      w[4 * i + 2] = u.z;
      w[4 * i + 3] = u.w;
    }
  } else {
    const auto* v = reinterpret_cast<const std::uint32_t*>(p);
#pragma unroll
    for (int i = 0; i < NW; ++i) w[i] = v[i];
  }
#else
  for (int i = 0; i < NW; ++i) std::memcpy(&w[i], p + 4 * i, 4);  // little-endian hosts, as the formats are
#endif
}

/// The two f16 halves of a word as floats (low half first).
INFER_HD void f16x2_to_f32(std::uint32_t w, float& lo, float& hi) {
#if defined(__CUDA_ARCH__)
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
  lo = f.x;
  hi = f.y;
#else
  lo = f16_to_f32(static_cast<std::uint16_t>(w & 0xffffu));
  hi = f16_to_f32(static_cast<std::uint16_t>(w >> 16));
#endif
}

/// dot4 over n words of two code arrays.
template <int N>
INFER_HD int dot_words(const std::uint32_t* a, const std::uint32_t* b) {
  int s = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < N; ++i) s = dot4(a[i], b[i], s);
  return s;
}
}  // namespace detail

/// Two 32-value halves of a pair unit: sub-blocks 2p and 2p + 1 of a Q4_K or Q5_K block, or two neighbouring
/// Q8_0 blocks. Word i of q[h] holds values 4i..4i+3 of half h, and value = a[h]·q + b[h] (b: K-quants' mins;
/// Q8_0 leaves it unset, pair_dot<q8_0> never reads it).
struct PairCodes {
  std::uint32_t q[2][8];
  float a[2], b[2];
};
template <DType T>
INFER_HD void decode_kpair(const std::uint8_t* blk, int p, PairCodes& g) {
  static_assert(T == DType::q4_k || T == DType::q5_k, "decode_kpair: Q4_K or Q5_K");
  std::uint32_t hdr[4];  // d, dmin (f16), then the 12 bytes of scales
  detail::load_words_aligned<4>(blk, hdr);
  // The 6-bit scale and min of sub-block j (unpack_scale_min_k4): bytes j of words 1 and 2, & 63, for j < 4;
  // for j >= 4 the low (scales) and high (mins) nibbles of word 3's byte j - 4, topped by the spare two bits
  // of words 1 and 2.
  const std::uint32_t sc = p < 2 ? hdr[1] & 0x3f3f3f3fu : (hdr[3] & 0x0f0f0f0fu) | ((hdr[1] >> 2) & 0x30303030u);
  const std::uint32_t mn =
      p < 2 ? hdr[2] & 0x3f3f3f3fu : ((hdr[3] >> 4) & 0x0f0f0f0fu) | ((hdr[2] >> 2) & 0x30303030u);
  const unsigned sh = 16u * static_cast<unsigned>(p & 1);
  float d, dmin;
  detail::f16x2_to_f32(hdr[0], d, dmin);
  for (int h = 0; h < 2; ++h) {
    g.a[h] = d * static_cast<float>((sc >> (sh + 8 * h)) & 0xffu);
    g.b[h] = -(dmin * static_cast<float>((mn >> (sh + 8 * h)) & 0xffu));
  }
  constexpr int qs = T == DType::q4_k ? 16 : 48;  // Q5_K keeps 32 bytes of fifth bits before its nibbles
  std::uint32_t w[8];
  detail::load_words_aligned<8>(blk + qs + 32 * p, w);
  for (int i = 0; i < 8; ++i) {
    g.q[0][i] = w[i] & 0x0f0f0f0fu;
    g.q[1][i] = (w[i] >> 4) & 0x0f0f0f0fu;
  }
  if constexpr (T == DType::q5_k) {  // bit s of qh byte l: the fifth bit of value l of sub-block s
    std::uint32_t hw[8];
    detail::load_words_aligned<8>(blk + 16, hw);
    const unsigned s0 = 2u * static_cast<unsigned>(p);
    for (int i = 0; i < 8; ++i) {
      g.q[0][i] |= ((hw[i] >> s0) & 0x01010101u) << 4;
      g.q[1][i] |= ((hw[i] >> (s0 + 1)) & 0x01010101u) << 4;
    }
  }
}

/// Unit (h, t) of a Q6_K block (2-byte aligned: shared memory readable 4 bytes past the block, as
/// load_le_words needs): codes c[q] (0..63; word i = positions 16t + 4i.. of run q of half h) and
/// a[q] = d·scale of those 16 values; value = a[q]·(c − 32).
struct Q6RunCodes {
  std::uint32_t c[4][4];
  float a[4];
};
INFER_HD void decode_q6_run(const std::uint8_t* blk, int h, int t, Q6RunCodes& g) {
  std::uint32_t lo[4], hi[4], qh[4], sc[2];
  load_le_words<4>(blk + 64 * h + 16 * t, lo);       // runs 0 (low nibbles) and 2 (high)
  load_le_words<4>(blk + 64 * h + 32 + 16 * t, hi);  // runs 1 and 3
  load_le_words<4>(blk + 128 + 32 * h + 16 * t, qh);  // bits 2q, 2q + 1: run q's top two bits
  load_le_words<2>(blk + 192 + 8 * h, sc);            // the scale of run q, positions 16t..: byte 2q + t
  const float d = detail::f16_at(blk + 208);
  for (int i = 0; i < 4; ++i) {
    g.c[0][i] = (lo[i] & 0x0f0f0f0fu) | ((qh[i] << 4) & 0x30303030u);
    g.c[1][i] = (hi[i] & 0x0f0f0f0fu) | ((qh[i] << 2) & 0x30303030u);
    g.c[2][i] = ((lo[i] >> 4) & 0x0f0f0f0fu) | (qh[i] & 0x30303030u);
    g.c[3][i] = ((hi[i] >> 4) & 0x0f0f0f0fu) | ((qh[i] >> 2) & 0x30303030u);
  }
  const unsigned sh = 8u * static_cast<unsigned>(t);
  for (int q = 0; q < 4; ++q) {
    const std::uint32_t w = sc[q / 2] >> (16u * static_cast<unsigned>(q % 2) + sh);
    g.a[q] = d * static_cast<float>(static_cast<std::int8_t>(w & 0xffu));
  }
}

/// Two neighbouring Q8_0 blocks at a 4-byte aligned address (a[h] block h's scale). 17 aligned words hold both:
/// block 0's codes straddle words 0-8 (2 bytes in), block 1's scale is word 8's upper half and its codes are
/// words 9-16.
INFER_HD void decode_q8_pair(const std::uint8_t* p, PairCodes& g) {
  std::uint32_t r[17];
  detail::load_words_aligned<17>(p, r);
  for (int i = 0; i < 8; ++i) {
#if defined(__CUDA_ARCH__)
    g.q[0][i] = __funnelshift_r(r[i], r[i + 1], 16);
#else
    g.q[0][i] = (r[i] >> 16) | (r[i + 1] << 16);
#endif
    g.q[1][i] = r[9 + i];
  }
  float unused;
  detail::f16x2_to_f32(r[0], g.a[0], unused);
  detail::f16x2_to_f32(r[8], unused, g.a[1]);
}

/// One activation piece's scale in the unit walks: {d, d·Σ codes} of its 32-value block (pairs: one per
/// sub-block, the sum over all 32) or of the piece itself (Q6_K runs: the sum over its 16).
struct PieceScale {
  float d, dsum;
};

/// A pair's contribution to one row of x (T: Q4_K, Q5_K or Q8_0): xp[r] the four pieces' codes (4 words each),
/// s[h] half h's scale.
template <DType T>
INFER_HD float pair_dot(const PairCodes& g, const std::uint32_t (&xp)[4][4], const PieceScale (&s)[2]) {
  float v = 0.0f;
  for (int h = 0; h < 2; ++h) {
    const int dot = detail::dot_words<4>(g.q[h], xp[2 * h]) + detail::dot_words<4>(g.q[h] + 4, xp[2 * h + 1]);
    v = fmaf(g.a[h] * static_cast<float>(dot), s[h].d, v);
    if constexpr (DotFormat<T>::has_min) v = fmaf(g.b[h], s[h].dsum, v);
  }
  return v;
}
/// A Q6_K run unit's contribution: xp[q] piece q's codes, s[q] its scale (the sum over the piece).
INFER_HD float q6_run_dot(const Q6RunCodes& g, const std::uint32_t (&xp)[4][4], const PieceScale (&s)[4]) {
  float v = 0.0f;
  for (int q = 0; q < 4; ++q)  // a·(c − 32)·x: a·(d_x·Σ c·x_q − 32·d_x·Σ x_q)
    v = fmaf(g.a[q], fmaf(s[q].d, static_cast<float>(detail::dot_words<4>(g.c[q], xp[q])), -32.0f * s[q].dsum), v);
  return v;
}

}  // namespace infer::quant
