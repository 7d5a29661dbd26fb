#pragma once
/// \file
/// The GGUF block-quantized layouts and their dequantization, written once for host and device.
///
/// Every function here is `INFER_HD`: the CPU reference (kernels/cpu/dequantize.cpp) and the CUDA
/// kernel (kernels/cuda/dequantize.cu) call the very same code, so the CPU is an exact oracle for the
/// GPU. Work is split into *groups* of `kGroupSize` consecutive output values: a CUDA thread produces
/// one group (8 floats = two 16-byte stores, coalesced across a warp), the CPU loops over all groups of
/// a block. Groups never straddle a sub-block, so each group needs exactly one scale (and min).
///
/// Arithmetic order matches the format's definition (scale products first, then `d*q - m`), and on
/// the device the multiply and add are issued with explicit round-to-nearest intrinsics so that nvcc
/// cannot contract them into an FMA: that keeps GPU results bit-identical to the CPU's.
///
/// The structs mirror the on-disk bytes (little-endian, f16 stored as raw bits). They only need
/// 2-byte alignment; host code that sees arbitrary byte spans copies a block out with memcpy first.

#include <cstddef>
#include <cstdint>

#include "infer/core/dtype.hpp"
#include "infer/core/half.hpp"
#include "infer/core/macros.hpp"

namespace infer::quant {

/// Output values produced per call of a `dequantize_group`.
inline constexpr int kGroupSize = 8;

/// 32 values: value = d * q, q an int8.
struct BlockQ8_0 {
  std::uint16_t d;
  std::int8_t qs[32];
};
/// 32 values: value = d * (q - 8); byte j holds value j (low nibble) and value j + 16 (high nibble).
struct BlockQ4_0 {
  std::uint16_t d;
  std::uint8_t qs[16];
};
/// 32 values: value = d * q + m; nibble layout as Q4_0.
struct BlockQ4_1 {
  std::uint16_t d;
  std::uint16_t m;
  std::uint8_t qs[16];
};
/// 32 values: value = d * (q - 16), q 5 bits: the nibbles laid out as Q4_0's, and bit j of qh (a
/// little-endian u32, kept as bytes: the block is only 2-byte aligned) is the fifth bit of value j.
struct BlockQ5_0 {
  std::uint16_t d;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
/// 32 values: value = d * q + m, q 5 bits laid out as Q5_0's.
struct BlockQ5_1 {
  std::uint16_t d;
  std::uint16_t m;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
/// 256 values in 8 sub-blocks of 32, each with a 6-bit scale and min (packed in `scales`):
/// value = d * scale_s * q - dmin * min_s. Bytes qs[32c .. 32c+31] hold sub-block 2c in their low
/// nibbles and sub-block 2c + 1 in their high nibbles.
struct BlockQ4K {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[12];
  std::uint8_t qs[128];
};
/// As Q4_K with a fifth bit per value: bit s of qh[l] is the high bit of value l of sub-block s.
struct BlockQ5K {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[12];
  std::uint8_t qh[32];
  std::uint8_t qs[128];
};
/// 256 values in 16 sub-blocks of 16 with int8 scales: value = (d * scale) * (q - 32), q 6 bits made
/// of 4 bits from ql and 2 bits from qh. The 256 values are two halves of 128 laid out alike.
struct BlockQ6K {
  std::uint8_t ql[128];
  std::uint8_t qh[64];
  std::int8_t scales[16];
  std::uint16_t d;
};

/// 32 values: value = d * level[q], q a 4-bit index into the 16 levels of kIq4NlLevels, the nibbles laid
/// out as Q4_0's.
struct BlockIQ4NL {
  std::uint16_t d;
  std::uint8_t qs[16];
};
/// 256 values in 8 sub-blocks of 32, each with a 6-bit scale ls (stored + 32): value = (d * (ls - 32)) *
/// level[q]. Bits 0-3 of ls of sub-block s are nibble s % 2 (low first) of scales_l[s / 2], bits 4-5 are
/// bits 2s..2s+1 of scales_h. Sub-block s's indices are qs[16s .. 16s+15], values 0-15 in the low
/// nibbles and 16-31 in the high ones.
struct BlockIQ4XS {
  std::uint16_t d;
  std::uint16_t scales_h;
  std::uint8_t scales_l[4];
  std::uint8_t qs[128];
};

static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockIQ4NL) == 18);
static_assert(sizeof(BlockQ4K) == 144 && sizeof(BlockQ5K) == 176 && sizeof(BlockQ6K) == 210 && sizeof(BlockIQ4XS) == 136);
static_assert(sizeof(BlockQ8_0) == info(DType::q8_0).block_bytes && sizeof(BlockQ4_0) == info(DType::q4_0).block_bytes &&
              sizeof(BlockQ4_1) == info(DType::q4_1).block_bytes && sizeof(BlockQ5_0) == info(DType::q5_0).block_bytes &&
              sizeof(BlockQ5_1) == info(DType::q5_1).block_bytes && sizeof(BlockQ4K) == info(DType::q4_k).block_bytes &&
              sizeof(BlockQ5K) == info(DType::q5_k).block_bytes && sizeof(BlockQ6K) == info(DType::q6_k).block_bytes &&
              sizeof(BlockIQ4NL) == info(DType::iq4_nl).block_bytes &&
              sizeof(BlockIQ4XS) == info(DType::iq4_xs).block_bytes,
              "block structs must match the sizes in core/dtype.hpp");

/// The 16 non-uniform levels IQ4_NL and IQ4_XS index (llama.cpp's kvalues_iq4nl).
inline constexpr std::int8_t kIq4NlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113};

/// Block type ↔ DType, and how many groups a block splits into.
template <class Block>
struct BlockTraits;
#define INFER_BLOCK_TRAITS(Block, dt)                                         \
  template <>                                                                 \
  struct BlockTraits<Block> {                                                 \
    static constexpr DType dtype = dt;                                        \
    static constexpr int elems = static_cast<int>(info(dt).block_elems);      \
    static constexpr int groups = elems / kGroupSize;                         \
  }
INFER_BLOCK_TRAITS(BlockQ8_0, DType::q8_0);
INFER_BLOCK_TRAITS(BlockQ4_0, DType::q4_0);
INFER_BLOCK_TRAITS(BlockQ4_1, DType::q4_1);
INFER_BLOCK_TRAITS(BlockQ5_0, DType::q5_0);
INFER_BLOCK_TRAITS(BlockQ5_1, DType::q5_1);
INFER_BLOCK_TRAITS(BlockQ4K, DType::q4_k);
INFER_BLOCK_TRAITS(BlockQ5K, DType::q5_k);
INFER_BLOCK_TRAITS(BlockQ6K, DType::q6_k);
INFER_BLOCK_TRAITS(BlockIQ4NL, DType::iq4_nl);
INFER_BLOCK_TRAITS(BlockIQ4XS, DType::iq4_xs);
#undef INFER_BLOCK_TRAITS

namespace detail {
/// a * b + c rounded twice (never fused), identically on host and device.
INFER_HD float mul_add_unfused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}
/// a * b - c rounded twice (never fused).
INFER_HD float mul_sub_unfused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(__fmul_rn(a, b), c);
#else
  return a * b - c;
#endif
}

/// Levels 8h .. 8h+7 of kIq4NlLevels as the bytes of one word, lowest first.
constexpr std::uint64_t pack_iq4nl_levels(int h) {
  std::uint64_t w = 0;
  for (int i = 0; i < 8; ++i) w |= std::uint64_t{static_cast<std::uint8_t>(kIq4NlLevels[8 * h + i])} << (8 * i);
  return w;
}
// Namespace-scope constexpr scalars are usable in device code; an array indexed at run time would be
// copied to local memory on every call.
inline constexpr std::uint64_t kIq4NlLevelsLo = pack_iq4nl_levels(0);
inline constexpr std::uint64_t kIq4NlLevelsHi = pack_iq4nl_levels(1);
}  // namespace detail

/// kIq4NlLevels[q] for q in 0..15, looked up in registers on the GPU.
INFER_HD int iq4nl_level(int q) {
  const std::uint64_t w = q < 8 ? detail::kIq4NlLevelsLo : detail::kIq4NlLevelsHi;
  return static_cast<std::int8_t>(static_cast<std::uint8_t>(w >> (8 * (q & 7))));
}

/// A K-quant sub-block's 6-bit scale and min.
struct ScaleMin {
  std::uint8_t scale;
  std::uint8_t min;
};

/// Unpacks scale and min of sub-block `j` (0..7) from the 12 packed bytes of Q4_K/Q5_K:
/// bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; the top 2 bits of bytes 0-3
/// (4-7) are bits 4-5 of scales (mins) 4-7, whose low 4 bits are the nibbles of bytes 8-11
/// (scale in the low nibble, min in the high one).
INFER_HD ScaleMin unpack_scale_min_k4(int j, const std::uint8_t* s) {
  if (j < 4) return {static_cast<std::uint8_t>(s[j] & 63u), static_cast<std::uint8_t>(s[j + 4] & 63u)};
  return {static_cast<std::uint8_t>((s[j + 4] & 0x0fu) | ((s[j - 4] >> 6) << 4)),
          static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4))};
}

// ---- per-group dequantization: group g covers values [8g, 8g + 8) of the block ----------------------

INFER_HD void dequantize_group(const BlockQ8_0& b, int g, float* out) {
  const float d = f16_to_f32(b.d);
  for (int i = 0; i < kGroupSize; ++i) out[i] = d * static_cast<float>(b.qs[g * kGroupSize + i]);
}

INFER_HD void dequantize_group(const BlockQ4_0& b, int g, float* out) {
  const float d = f16_to_f32(b.d);
  const int first = g * kGroupSize;  // values 0..15 are low nibbles of qs[0..15], 16..31 high nibbles
  const int shift = first < 16 ? 0 : 4;
  const int byte0 = first & 15;
  for (int i = 0; i < kGroupSize; ++i) {
    const int q = (b.qs[byte0 + i] >> shift) & 0x0f;
    out[i] = d * static_cast<float>(q - 8);
  }
}

INFER_HD void dequantize_group(const BlockQ4_1& b, int g, float* out) {
  const float d = f16_to_f32(b.d);
  const float m = f16_to_f32(b.m);
  const int first = g * kGroupSize;
  const int shift = first < 16 ? 0 : 4;
  const int byte0 = first & 15;
  for (int i = 0; i < kGroupSize; ++i) {
    const int q = (b.qs[byte0 + i] >> shift) & 0x0f;
    out[i] = detail::mul_add_unfused(d, static_cast<float>(q), m);
  }
}

/// The fifth bits of a Q5_0/Q5_1 block: bit j is value j's.
INFER_HD std::uint32_t q5_high_bits(const std::uint8_t* qh) {
  return qh[0] | (std::uint32_t{qh[1]} << 8) | (std::uint32_t{qh[2]} << 16) | (std::uint32_t{qh[3]} << 24);
}

INFER_HD void dequantize_group(const BlockQ5_0& b, int g, float* out) {
  const float d = f16_to_f32(b.d);
  const std::uint32_t qh = q5_high_bits(b.qh);
  const int first = g * kGroupSize;
  const int shift = first < 16 ? 0 : 4;
  const int byte0 = first & 15;
  for (int i = 0; i < kGroupSize; ++i) {
    const int q = ((b.qs[byte0 + i] >> shift) & 0x0f) | static_cast<int>(((qh >> (first + i)) & 1u) << 4);
    out[i] = d * static_cast<float>(q - 16);
  }
}

INFER_HD void dequantize_group(const BlockQ5_1& b, int g, float* out) {
  const float d = f16_to_f32(b.d);
  const float m = f16_to_f32(b.m);
  const std::uint32_t qh = q5_high_bits(b.qh);
  const int first = g * kGroupSize;
  const int shift = first < 16 ? 0 : 4;
  const int byte0 = first & 15;
  for (int i = 0; i < kGroupSize; ++i) {
    const int q = ((b.qs[byte0 + i] >> shift) & 0x0f) | static_cast<int>(((qh >> (first + i)) & 1u) << 4);
    out[i] = detail::mul_add_unfused(d, static_cast<float>(q), m);
  }
}

INFER_HD void dequantize_group(const BlockQ4K& b, int g, float* out) {
  const int sub = g / 4;              // sub-block of 32 values
  const int l0 = (g % 4) * kGroupSize;  // first value within the sub-block
  const ScaleMin sm = unpack_scale_min_k4(sub, b.scales);
  const float d = f16_to_f32(b.d) * static_cast<float>(sm.scale);
  const float m = f16_to_f32(b.dmin) * static_cast<float>(sm.min);
  const std::uint8_t* q = b.qs + 32 * (sub / 2);
  const int shift = 4 * (sub & 1);
  for (int i = 0; i < kGroupSize; ++i) {
    const int v = (q[l0 + i] >> shift) & 0x0f;
    out[i] = detail::mul_sub_unfused(d, static_cast<float>(v), m);
  }
}

INFER_HD void dequantize_group(const BlockQ5K& b, int g, float* out) {
  const int sub = g / 4;
  const int l0 = (g % 4) * kGroupSize;
  const ScaleMin sm = unpack_scale_min_k4(sub, b.scales);
  const float d = f16_to_f32(b.d) * static_cast<float>(sm.scale);
  const float m = f16_to_f32(b.dmin) * static_cast<float>(sm.min);
  const std::uint8_t* q = b.qs + 32 * (sub / 2);
  const int shift = 4 * (sub & 1);
  for (int i = 0; i < kGroupSize; ++i) {
    const int l = l0 + i;
    const int v = ((q[l] >> shift) & 0x0f) | (((b.qh[l] >> sub) & 1) << 4);
    out[i] = detail::mul_sub_unfused(d, static_cast<float>(v), m);
  }
}

INFER_HD void dequantize_group(const BlockQ6K& b, int g, float* out) {
  const int first = g * kGroupSize;
  const int half = first / 128;       // two halves of 128 values, laid out alike
  const int quarter = (first % 128) / 32;  // 32-value run within the half
  const int l0 = first % 32;
  // Runs 0/1 take the low nibbles of ql[0..31]/ql[32..63] of the half, runs 2/3 the high nibbles;
  // run k takes bits 2k..2k+1 of qh[l].
  const std::uint8_t* ql = b.ql + 64 * half + 32 * (quarter & 1);
  const std::uint8_t* qh = b.qh + 32 * half;
  const int lshift = 4 * (quarter >> 1);
  const int hshift = 2 * quarter;
  // A group of 8 lies inside one 16-value sub-block: scale index 8*half + l/16 + 2*run.
  const float d = f16_to_f32(b.d) * static_cast<float>(b.scales[8 * half + l0 / 16 + 2 * quarter]);
  for (int i = 0; i < kGroupSize; ++i) {
    const int l = l0 + i;
    const int q = (((ql[l] >> lshift) & 0x0f) | (((qh[l] >> hshift) & 3) << 4)) - 32;
    out[i] = d * static_cast<float>(q);
  }
}

INFER_HD void dequantize_group(const BlockIQ4NL& b, int g, float* out) {
  const float d = f16_to_f32(b.d);
  const int first = g * kGroupSize;
  const int shift = first < 16 ? 0 : 4;
  const int byte0 = first & 15;
  for (int i = 0; i < kGroupSize; ++i)
    out[i] = d * static_cast<float>(iq4nl_level((b.qs[byte0 + i] >> shift) & 0x0f));
}

INFER_HD void dequantize_group(const BlockIQ4XS& b, int g, float* out) {
  const int sub = g / 4;                // sub-block of 32 values
  const int l0 = (g % 4) * kGroupSize;  // first value within it
  const int ls = ((b.scales_l[sub / 2] >> (4 * (sub & 1))) & 0x0f) | (((b.scales_h >> (2 * sub)) & 3) << 4);
  const float dl = f16_to_f32(b.d) * static_cast<float>(ls - 32);
  const std::uint8_t* q = b.qs + 16 * sub + (l0 & 15);  // values 0-15: low nibbles, 16-31: high nibbles
  const int shift = l0 < 16 ? 0 : 4;
  for (int i = 0; i < kGroupSize; ++i) out[i] = dl * static_cast<float>(iq4nl_level((q[i] >> shift) & 0x0f));
}

/// All values of one block, in order.
template <class Block>
INFER_HD void dequantize_block(const Block& b, float* out) {
  for (int g = 0; g < BlockTraits<Block>::groups; ++g) dequantize_group(b, g, out + g * kGroupSize);
}

}  // namespace infer::quant
