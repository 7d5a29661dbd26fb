#pragma once
/// \file
/// FP8 (e4m3) linear layers on the GPU, the kernels behind `Fp8` on the cuda backend (W8A8: weights and
/// activations in e4m3, one f32 scale per weight row and one per activation row, f32 accumulation):
///
/// - `quantize_rows_e4m3`: each row to e4m3 with its scale max|row| / 448, the codes and scales bit for bit
///   what the CPU's `Fp8::quantize_row` makes of the same values (division and rounding alike: IEEE f32
///   division, then round-to-nearest-even saturating to ±448, as `f32_to_e4m3`). For activations (bf16, per
///   token, every step) and for weights quantized at load (f32).
/// - `fp8_gemv`: y[m][n] = s_x[m] · s_w[n] · Σ_k e4m3(x_q[m][k]) · e4m3(w_q[n][k]) for M = 1..kGemvMaxRows, bf16
///   out: the batch-1 decode path, bound by reading the weight codes (half of bf16's bytes). Each product of
///   two e4m3 values is exact; the scales are applied once per output. Two kernels (Fp8GemvPath): on the
///   tensor cores (the default: mma.sync m16n8k32 e4m3, the weights streamed through shared memory; Hopper
///   adds each k-step's products with ~14 significant bits before they reach an f32 accumulator; as fast as
///   the other at batch 1, 15-63% faster at 4-8 rows), or on the CUDA cores (f32 sums throughout).
///
/// Compiled in kernels/cuda/fp8_linear.cu; no CUDA header here (bf16 values are their `std::uint16_t`
/// bits, streams `void*`). Every call only enqueues work.

#if defined(INFER_HAVE_CUDA)

#include <cstdint>

#include "infer/kernels/cuda/ops.hpp"

namespace infer::kernels::cuda {

/// q[r][k] = e4m3(x[r][k] / s[r]), s[r] = max_k |x[r][k]| / 448 (a row of zeros: s = 0, codes 0), for
/// `rows` rows of K values. Finite inputs only (a NaN or an infinity gives an unspecified row).
/// InvalidArgument for rows < 0, K < 1 or null pointers with rows > 0.
void quantize_rows_e4m3(const std::uint16_t* x_bf16, std::int64_t rows, std::int64_t K, std::uint8_t* q, float* scale,
                        void* stream);
void quantize_rows_e4m3(const float* x_f32, std::int64_t rows, std::int64_t K, std::uint8_t* q, float* scale,
                        void* stream);

/// Whether `fp8_gemv` takes these operands: K a multiple of 16 and both code arrays 16-byte aligned.
[[nodiscard]] inline bool fp8_gemv_supports(const void* w_q, const void* x_q, std::int64_t K) noexcept {
  return K % 16 == 0 && reinterpret_cast<std::uintptr_t>(w_q) % 16 == 0 && reinterpret_cast<std::uintptr_t>(x_q) % 16 == 0;
}

/// y[M][N] (bf16) = (x_q · s_x) · (w_q · s_w)ᵀ with w_q [N][K], s_w [N], x_q [M][K], s_x [M] as
/// quantize_rows_e4m3 writes them, 1 ≤ M ≤ kGemvMaxRows. InvalidArgument for sizes out of range or
/// operands fp8_gemv_supports refuses. N of 0 does nothing.
void fp8_gemv(const std::uint8_t* w_q, const float* w_scale, const std::uint8_t* x_q, const float* x_scale, int M,
              std::int64_t N, std::int64_t K, std::uint16_t* y_bf16, void* stream);

/// Which kernel fp8_gemv runs, process-wide: `automatic` (the default) takes the environment variable
/// INFER_FP8_GEMV, read once — `cuda_cores`, else the tensor cores. Returns the previous choice; takes
/// effect at the next call (a captured CUDA graph keeps the kernel it captured). For tests and A/B runs.
enum class Fp8GemvPath : int { automatic = 0, cuda_cores = 1, tensor_cores = 2 };
Fp8GemvPath set_fp8_gemv_path(Fp8GemvPath path);

}  // namespace infer::kernels::cuda

#endif  // INFER_HAVE_CUDA
