#pragma once
/// \file
/// Integer dot products of GGUF weight blocks with int8-quantized activations, written once for host and
/// device (`INFER_HD`): the CUDA GEMV (kernels/cuda/gguf_gemv.cu) runs them, the int8 tensor-core matmul
/// (gguf_mmq.cu) decodes its segments with them, and the CPU calls the very same code as the test oracle.
///
/// Why integers: batch-1 decode reads each weight once, so the GEMV must decode blocks as fast as memory
/// delivers them. Widening every 4-bit code to a float and multiplying it by a bf16 activation costs ~6
/// instructions a value, which kept the float GEMV at a third of the copy rate. Here the activations are
/// quantized once per step to int8 in blocks of 32 values with one f32 scale (`Q8Scale`), so a weight word
/// of four codes meets four activation codes in one `dp4a` (4 multiply-adds in int32); a 4-bit block's
/// codes are unpacked four at a time with one mask. The sums are exact integers; floats enter once per
/// 32-value *segment*:
///   Σ w·x = d_x · (a · Σ (q − off)·x_q) + b · d_x · Σ x_q
/// with a the segment's weight scale (Q6_K has one per 16 values), off the format's code offset (8 for
/// Q4_0, 16 for Q5_0, 32 for Q6_K) and b its additive min (Q4_1, Q5_1, Q4_K, Q5_K). Σ x_q of each 16-value
/// half is kept with the scale, so offsets and mins cost no dot product.
///
/// A segment is 32 consecutive values of a block (a Q4_0/Q5_x/Q8_0/IQ4_NL block, a sub-block of Q4_K,
/// Q5_K, IQ4_XS, two sub-blocks of Q6_K); its codes are decoded into eight words (`SegCodes`), word i
/// holding values 4i..4i+3 as int8 bytes.

#include <cmath>
#include <cstdint>

#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"
#include "infer/core/macros.hpp"
#include "infer/quant/gguf_blocks.hpp"

namespace infer::quant {

/// Values per activation block and per weight segment.
inline constexpr int kQ8Block = 32;

/// The rows (tokens) up to which the CUDA backend multiplies GGUF blocks by these integer sums on int8 activations
/// (the GEMV up to 8 rows, the int8 tensor-core MMA up to kernels::cuda::kMmqPreferredRows); above, it dequantizes
/// the weight to bf16 and runs a GEMM. Here for the CPU-side rounding model (no CUDA header).
inline constexpr int kGgufDotMaxRows = 32;

/// One activation block's scale and the sums of its codes: value i ≈ d · q_i.
struct Q8Scale {
  float d;
  std::int16_t sum_lo;  ///< Σ q_i, i = 0..15
  std::int16_t sum_hi;  ///< Σ q_i, i = 16..31
};
static_assert(sizeof(Q8Scale) == 8);

/// Quantizes 32 activations: d = max|x| / 127, q_i = round-to-nearest-even(x_i · 127 / max|x|) (all 0 when
/// x is 0). Division and rounding are IEEE on both sides, so the GPU's warp-parallel version (which takes
/// the same maximum in another order: max is exact) writes the same codes.
INFER_HD Q8Scale quantize_q8_block(const float* x, std::int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < kQ8Block; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int lo = 0, hi = 0;
  for (int i = 0; i < kQ8Block; ++i) {
    const int v = static_cast<int>(rintf(x[i] * id));
    q[i] = static_cast<std::int8_t>(v);
    (i < 16 ? lo : hi) += v;
  }
  return {amax / 127.0f, static_cast<std::int16_t>(lo), static_cast<std::int16_t>(hi)};
}

/// Σ of the four signed byte products of a and b, plus c (`dp4a`).
INFER_HD int dot4(std::uint32_t a, std::uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int k = 0; k < 4; ++k)
    c += static_cast<int>(static_cast<std::int8_t>(a >> (8 * k))) * static_cast<int>(static_cast<std::int8_t>(b >> (8 * k)));
  return c;
#endif
}

/// NW little-endian words from any byte address. On the device p points into shared memory that stays
/// readable 4 bytes past the last word (the GEMV's buffers have that slack): aligned words are read and
/// shifted together, which is cheaper than byte loads.
template <int NW>
INFER_HD void load_le_words(const std::uint8_t* p, std::uint32_t (&w)[NW]) {
#if defined(__CUDA_ARCH__)
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const auto* base = reinterpret_cast<const std::uint32_t*>(addr & ~std::uintptr_t{3});
  const unsigned sh = static_cast<unsigned>(addr & 3u) * 8u;
  std::uint32_t raw[NW + 1];
#pragma unroll
  for (int i = 0; i < NW + 1; ++i) raw[i] = base[i];
#pragma unroll
  for (int i = 0; i < NW; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], sh);
#else
  for (int i = 0; i < NW; ++i)
    w[i] = std::uint32_t{p[4 * i]} | std::uint32_t{p[4 * i + 1]} << 8 | std::uint32_t{p[4 * i + 2]} << 16 |
           std::uint32_t{p[4 * i + 3]} << 24;
#endif
}

/// The 4 low bits of h moved to bit 0 of each byte (bit k to bit 8k): the four products (h mod 16)·2^(7k) do
/// not overlap, and bit k of the k-th lands on bit 8k.
INFER_HD std::uint32_t spread_bits4(std::uint32_t h) { return ((h & 15u) * 0x00204081u) & 0x01010101u; }

/// IQ4's levels for four 4-bit indices (one per byte), as four int8 bytes.
INFER_HD std::uint32_t iq4nl_levels4(std::uint32_t idx) {
#if defined(__CUDA_ARCH__)
  // Two byte permutes pick each index's level from levels 0-7 and 8-15; bit 3 of the index chooses.
  constexpr auto lo = detail::kIq4NlLevelsLo, hi = detail::kIq4NlLevelsHi;
  const std::uint32_t low3 = idx & 0x07070707u;
  const std::uint32_t packed = low3 | (low3 >> 4);  // selector nibbles: idx0 | idx1 << 4 in byte 0, idx2, idx3 in byte 2
  const std::uint32_t sel = (packed & 0xffu) | ((packed >> 8) & 0xff00u);
  const std::uint32_t a = __byte_perm(static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(lo >> 32), sel);
  const std::uint32_t b = __byte_perm(static_cast<std::uint32_t>(hi), static_cast<std::uint32_t>(hi >> 32), sel);
  const std::uint32_t high = ((idx >> 3) & 0x01010101u) * 0xffu;
  return (b & high) | (a & ~high);
#else
  std::uint32_t r = 0;
  for (int k = 0; k < 4; ++k)
    r |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(iq4nl_level(static_cast<int>((idx >> (8 * k)) & 15u))))
         << (8 * k);
  return r;
#endif
}

/// One segment's codes and the floats that turn their integer dot product into a value:
/// value l = a0·(q_l − off) + b for l < 16, a1·(q_l − off) + b for l ≥ 16.
struct SegCodes {
  std::uint32_t q[8];
  float a0, a1, b;
};

/// Per-format constants of the dot product: code offset, whether a segment has two scales, whether a min,
/// and how many segments a block holds.
template <DType T>
struct DotFormat {
  static constexpr int off = T == DType::q4_0 ? 8 : T == DType::q5_0 ? 16 : T == DType::q6_k ? 32 : 0;
  static constexpr bool two_scales = T == DType::q6_k;
  static constexpr bool has_min =
      T == DType::q4_1 || T == DType::q5_1 || T == DType::q4_k || T == DType::q5_k;
  static constexpr int segs = static_cast<int>(info(T).block_elems) / kQ8Block;
};

/// Whether `decode_segment` and `segment_dot` take this type.
[[nodiscard]] constexpr bool dot_supports(DType t) noexcept {
  return t == DType::q8_0 || t == DType::q4_0 || t == DType::q4_1 || t == DType::q5_0 || t == DType::q5_1 ||
         t == DType::q4_k || t == DType::q5_k || t == DType::q6_k || t == DType::iq4_nl || t == DType::iq4_xs;
}

namespace detail {
INFER_HD float f16_at(const std::uint8_t* p) { return f16_to_f32(static_cast<std::uint16_t>(p[0] | (p[1] << 8))); }

/// A Q4_0-style nibble layout (16 bytes: value j low nibble, j + 16 high) as codes 0..15.
INFER_HD void split_nibbles(const std::uint8_t* qs, std::uint32_t (&q)[8]) {
  std::uint32_t w[4];
  load_le_words<4>(qs, w);
  for (int i = 0; i < 4; ++i) {
    q[i] = w[i] & 0x0f0f0f0fu;
    q[4 + i] = (w[i] >> 4) & 0x0f0f0f0fu;
  }
}
/// Adds Q5_0/Q5_1's fifth bits (bit j of qh is value j's) as bit 4 of each code.
INFER_HD void add_q5_high_bits(std::uint32_t qh, std::uint32_t (&q)[8]) {
  for (int i = 0; i < 8; ++i) q[i] |= spread_bits4(qh >> (4 * i)) << 4;
}
}  // namespace detail

/// Decodes segment s of the block at `blk` (bytes as in the file).
template <DType T>
INFER_HD void decode_segment(const std::uint8_t* blk, int s, SegCodes& g) {
  static_assert(dot_supports(T), "decode_segment: no integer dot product for this type");
  using detail::f16_at;
  g.b = 0.0f;
  if constexpr (T == DType::q8_0) {
    g.a0 = g.a1 = f16_at(blk);
    load_le_words<8>(blk + 2, g.q);
  } else if constexpr (T == DType::q4_0 || T == DType::iq4_nl) {
    g.a0 = g.a1 = f16_at(blk);
    detail::split_nibbles(blk + 2, g.q);
    if constexpr (T == DType::iq4_nl)
      for (int i = 0; i < 8; ++i) g.q[i] = iq4nl_levels4(g.q[i]);
  } else if constexpr (T == DType::q4_1) {
    g.a0 = g.a1 = f16_at(blk);
    g.b = f16_at(blk + 2);
    detail::split_nibbles(blk + 4, g.q);
  } else if constexpr (T == DType::q5_0) {
    g.a0 = g.a1 = f16_at(blk);
    std::uint32_t qh[1];
    load_le_words<1>(blk + 2, qh);
    detail::split_nibbles(blk + 6, g.q);
    detail::add_q5_high_bits(qh[0], g.q);
  } else if constexpr (T == DType::q5_1) {
    g.a0 = g.a1 = f16_at(blk);
    g.b = f16_at(blk + 2);
    std::uint32_t qh[1];
    load_le_words<1>(blk + 4, qh);
    detail::split_nibbles(blk + 8, g.q);
    detail::add_q5_high_bits(qh[0], g.q);
  } else if constexpr (T == DType::q4_k || T == DType::q5_k) {
    const ScaleMin sm = unpack_scale_min_k4(s, blk + 4);
    g.a0 = g.a1 = f16_at(blk) * static_cast<float>(sm.scale);
    g.b = -(f16_at(blk + 2) * static_cast<float>(sm.min));
    constexpr int qs = T == DType::q4_k ? 16 : 48;  // Q5_K keeps 32 bytes of fifth bits before its nibbles
    std::uint32_t w[8];
    load_le_words<8>(blk + qs + 32 * (s >> 1), w);
    const unsigned shift = 4u * static_cast<unsigned>(s & 1);
    for (int i = 0; i < 8; ++i) g.q[i] = (w[i] >> shift) & 0x0f0f0f0fu;
    if constexpr (T == DType::q5_k) {
      std::uint32_t h[8];
      load_le_words<8>(blk + 16, h);  // bit s of qh[l] is the fifth bit of value l of sub-block s
      for (int i = 0; i < 8; ++i) g.q[i] |= ((h[i] >> s) & 0x01010101u) << 4;
    }
  } else if constexpr (T == DType::q6_k) {
    const int half = s >> 2, quarter = s & 3;  // 32-value run `quarter` of 128-value half `half`
    std::uint32_t wl[8], wh[8];
    load_le_words<8>(blk + 64 * half + 32 * (quarter & 1), wl);
    load_le_words<8>(blk + 128 + 32 * half, wh);
    const unsigned lshift = 4u * static_cast<unsigned>(quarter >> 1), hshift = 2u * static_cast<unsigned>(quarter);
    for (int i = 0; i < 8; ++i) g.q[i] = ((wl[i] >> lshift) & 0x0f0f0f0fu) | (((wh[i] >> hshift) & 0x03030303u) << 4);
    const float d = f16_at(blk + 208);
    const auto* scales = reinterpret_cast<const std::int8_t*>(blk + 192);
    g.a0 = d * static_cast<float>(scales[8 * half + 2 * quarter]);
    g.a1 = d * static_cast<float>(scales[8 * half + 2 * quarter + 1]);
  } else if constexpr (T == DType::iq4_xs) {
    const int sl = (blk[4 + s / 2] >> (4 * (s & 1))) & 0x0f;
    const int sh = ((blk[2] | (blk[3] << 8)) >> (2 * s)) & 3;
    g.a0 = g.a1 = f16_at(blk) * static_cast<float>((sl | (sh << 4)) - 32);
    detail::split_nibbles(blk + 8 + 16 * s, g.q);
    for (int i = 0; i < 8; ++i) g.q[i] = iq4nl_levels4(g.q[i]);
  }
}

/// The segment's contribution to w·x for one activation block: its eight code words `x` and scale `sc`.
template <DType T>
INFER_HD float segment_dot(const SegCodes& g, const std::uint32_t (&x)[8], Q8Scale sc) {
  using F = DotFormat<T>;
  int lo = 0, hi = 0;
  for (int i = 0; i < 4; ++i) lo = dot4(g.q[i], x[i], lo);
  for (int i = 4; i < 8; ++i) hi = dot4(g.q[i], x[i], hi);
  const int slo = sc.sum_lo, shi = sc.sum_hi;
  float r;
  if constexpr (F::two_scales)
    r = g.a0 * static_cast<float>(lo - F::off * slo) + g.a1 * static_cast<float>(hi - F::off * shi);
  else
    r = g.a0 * static_cast<float>(lo + hi - F::off * (slo + shi));
  if constexpr (F::has_min) r += g.b * static_cast<float>(slo + shi);
  return sc.d * r;
}

}  // namespace infer::quant
