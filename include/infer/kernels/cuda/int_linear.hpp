#pragma once
/// \file
/// Weight-only integer linear layers on the GPU, the kernels behind `Int8WeightOnly` and `Int4` on the cuda
/// backend (W8A16 and W4A16: integer weights with their scales, bf16 activations, f32 sums, bf16 out):
///
/// - INT8, per output row: w[n][k] = q[n][k] · s[n], q in -127..127.
///   - `quantize_rows_int8`: a weight quantized at load, bit for bit what the CPU's Int8WeightOnly::quantize
///     makes of the same f32 values (s = max|row| / 127, q = round-to-nearest-even(w / s), IEEE f32 division);
///   - `int8_gemv`: y = x · wᵀ for M = 1..kGemvMaxRows (decode), s applied once per output;
///   - `dequantize_int8_bf16`: bf16(q · s) into [N][K], for the bf16 GEMM of a longer step (prefill).
/// - INT4, in groups of G inputs along each row: w[n][k] = s[n][g] · (q[n][k] − z[n][g]), q in 0..15, g = k / G.
///   On the GPU: codes packed eight to a 32-bit word, code c of inputs 8j..8j+7 in word j of the row at nibble
///   int4_nibble(c) ([N][K / 8] words); per group one 32-bit pair (bf16 s, bf16 m = −s·z) ([N][K / G],
///   int4_scale_min_bits), so that each weight decodes to bf16(q·s + m) with two bf16x2 instructions.
///   - `quantize_groups_int4`: a weight quantized at load, with the codes, s and z the CPU's Int4::quantize
///     makes of the same f32 values bit for bit (the group's range widened to hold 0, s = (max − min) / 15,
///     z = round(−min / s)), then packed;
///   - `int4_gemv`: y = x · wᵀ for M = 1..kGemvMaxRows, on the tensor cores (mma.sync, bf16 weights decoded
///     in registers, f32 sums);
///   - `dequantize_int4_bf16`: the same bf16 weights into [N][K], for the bf16 GEMM of a longer step.
///   G is a multiple of 32 dividing K (a 16-byte chunk of codes never straddles two groups).
///   Rounding: each weight is bf16(q·s_b + m_b) with s_b, m_b the bf16 roundings of s and −s·z, so it is
///   within ~2^-7·s·(q + |z|) of s·(q − z): the GEMM path's precision, not the exact f32 values of the CPU.
///
/// Compiled in kernels/cuda/int_linear.cu; no CUDA header here (bf16 values are their `std::uint16_t` bits,
/// streams `void*`). Every call only enqueues work; InvalidArgument for sizes out of range, null pointers
/// or operands the `*_supports` check refuses.

#if defined(INFER_HAVE_CUDA)

#include <cstdint>

namespace infer::kernels::cuda {

/// Whether int8_gemv takes these operands: K a multiple of 16, the codes and x 16-byte aligned.
[[nodiscard]] inline bool int8_gemv_supports(const void* w_q, const void* x, std::int64_t K) noexcept {
  return K % 16 == 0 && reinterpret_cast<std::uintptr_t>(w_q) % 16 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
}

/// The nibble of a word of eight INT4 codes that holds code c (0..7): the even codes in nibbles 0..3, the
/// odd ones in 4..7, so that (word >> 4k) & 0x000f000f holds codes 2k and 2k + 1 in its two halves.
constexpr int int4_nibble(int c) { return (c % 2) * 4 + c / 2; }

/// A group's packed pair: bf16 bits of s in the low half, of m = −s·z in the high half.
constexpr std::uint32_t int4_scale_min_bits(std::uint16_t s_bf16, std::uint16_t m_bf16) {
  return static_cast<std::uint32_t>(s_bf16) | (static_cast<std::uint32_t>(m_bf16) << 16);
}

/// Whether the INT4 kernels take K inputs in groups of G: K and G multiples of 32, G dividing K.
[[nodiscard]] inline bool int4_shape_supported(std::int64_t K, std::int64_t G) noexcept {
  return K > 0 && G > 0 && K % 32 == 0 && G % 32 == 0 && K % G == 0;
}

/// q[r][k], s[r] of `rows` rows of K f32 values (finite; a row of zeros gives s = 0, q = 0).
void quantize_rows_int8(const float* w, std::int64_t rows, std::int64_t K, std::int8_t* q, float* scale, void* stream);

/// y[M][N] (bf16) = x[M][K] (bf16) · (q · s)ᵀ, q [N][K], s [N]; 1 ≤ M ≤ kGemvMaxRows. N of 0 does nothing.
void int8_gemv(const std::int8_t* q, const float* scale, const std::uint16_t* x, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y, void* stream);

/// out[N][K] (bf16) = q · s.
void dequantize_int8_bf16(const std::int8_t* q, const float* scale, std::int64_t N, std::int64_t K, std::uint16_t* out,
                          void* stream);

/// codes [N][K / 8] words (4-byte aligned) and scale_min [N][K / G] of N rows of K f32 values (finite) in
/// groups of G.
void quantize_groups_int4(const float* w, std::int64_t N, std::int64_t K, std::int64_t G, std::uint8_t* codes,
                          std::uint32_t* scale_min, void* stream);

/// y[M][N] (bf16) = x[M][K] (bf16) · wᵀ for the INT4 weight (codes, scale_min, groups of G); 1 ≤ M ≤
/// kGemvMaxRows; the codes and x 16-byte aligned. N of 0 does nothing.
void int4_gemv(const std::uint8_t* codes, const std::uint32_t* scale_min, std::int64_t G, const std::uint16_t* x, int M,
               std::int64_t N, std::int64_t K, std::uint16_t* y, void* stream);

/// out[N][K] (bf16) = bf16(q·s_b + m_b), the weights int4_gemv multiplies.
void dequantize_int4_bf16(const std::uint8_t* codes, const std::uint32_t* scale_min, std::int64_t G, std::int64_t N,
                          std::int64_t K, std::uint16_t* out, void* stream);

}  // namespace infer::kernels::cuda

#endif  // INFER_HAVE_CUDA
