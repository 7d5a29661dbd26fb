#pragma once
/// \file
/// Weight-only integer linear layers on the GPU, the kernels behind `Int8WeightOnly` and `Int4` on the cuda
/// backend (W8A16 and W4A16: integer weights with f32 scales, bf16 activations, f32 sums, bf16 out):
///
/// - INT8, per output row: w[n][k] = q[n][k] · s[n], q in -127..127.
///   - `quantize_rows_int8`: a weight quantized at load, bit for bit what the CPU's Int8WeightOnly::quantize
///     makes of the same f32 values (s = max|row| / 127, q = round-to-nearest-even(w / s), IEEE f32 division);
///   - `int8_gemv`: y = x · wᵀ for M = 1..kGemvMaxRows (decode), s applied once per output;
///   - `dequantize_int8_bf16`: bf16(q · s) into [N][K], for the bf16 GEMM of a longer step (prefill).
/// - INT4, in groups of G inputs along each row: w[n][k] = s[n][g] · (q[n][k] − z[n][g]), q in 0..15, g = k / G.
///   Codes packed two to a byte, code k of a row in byte k / 2 at bits 4·(k % 2) ([N][K / 2] bytes); s and z
///   as f32 pairs, [N][K / G] (z is a float: an integer for AWQ, GPTQ and round-to-nearest, not for GGUF Q4_1).
///   - `quantize_groups_int4`: a weight quantized at load, bit for bit what the CPU's Int4::quantize makes
///     of the same f32 values (the group's range widened to hold 0, s = (max − min) / 15, z = round(−min / s));
///   - `int4_gemv`: y = x · wᵀ for M = 1..kGemvMaxRows; each 32-code chunk adds s·(Σ x·q − z·Σ x);
///   - `dequantize_int4_bf16`: bf16(s · (q − z)) into [N][K], for the bf16 GEMM of a longer step.
///   G is a multiple of 32 dividing K (a 16-byte chunk of codes never straddles two groups).
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

/// codes [N][K / 2] and scale_zero [N][K / G][2] of N rows of K f32 values (finite) in groups of G.
void quantize_groups_int4(const float* w, std::int64_t N, std::int64_t K, std::int64_t G, std::uint8_t* codes,
                          float* scale_zero, void* stream);

/// y[M][N] (bf16) = x[M][K] (bf16) · wᵀ for the INT4 weight (codes, scale_zero, groups of G); 1 ≤ M ≤
/// kGemvMaxRows; the codes and x 16-byte aligned. N of 0 does nothing.
void int4_gemv(const std::uint8_t* codes, const float* scale_zero, std::int64_t G, const std::uint16_t* x, int M,
               std::int64_t N, std::int64_t K, std::uint16_t* y, void* stream);

/// out[N][K] (bf16) = s · (q − z).
void dequantize_int4_bf16(const std::uint8_t* codes, const float* scale_zero, std::int64_t G, std::int64_t N,
                          std::int64_t K, std::uint16_t* out, void* stream);

}  // namespace infer::kernels::cuda

#endif  // INFER_HAVE_CUDA
