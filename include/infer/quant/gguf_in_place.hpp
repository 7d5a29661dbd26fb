#pragma once
/// \file
/// `infer::GgufInPlace`: the CUDA backend's Quantizer for GGUF files — every tensor in GGUF blocks (Q4_0,
/// Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) stays in its blocks on the GPU, the embedding
/// and the LM head included, so a step reads the file's bytes (2-5x fewer than bf16, which is what batch-1
/// decode is bound by): multiplied by the integer-dot GEMV for up to 8 rows and by dequantize-to-bf16 +
/// cuBLASLt GEMM for more (prefill). Stacked projections whose parts have different block types are kept
/// as parts. Every other weight (bf16/f16/f32 tensors, dummy weights) is stored as bf16, as Bf16 does. The
/// CUDA default.

#include <span>
#include <string_view>

#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/quant/weight_tensor.hpp"

#if defined(INFER_HAVE_CUDA)
#include "infer/quant/cuda_linear.hpp"
#endif

namespace infer {

namespace detail {
template <class B>
struct GgufInPlaceLinear;  ///< only the cuda backend keeps GGUF blocks
#if defined(INFER_HAVE_CUDA)
template <>
struct GgufInPlaceLinear<cuda> : CudaLinear {};
#endif
}  // namespace detail

struct GgufInPlace {
  static constexpr std::string_view name = "gguf-in-place";

  template <class B>
  using linear = detail::GgufInPlaceLinear<B>;

#if defined(INFER_HAVE_CUDA)
  /// A linear layer's weight [out, in], in its blocks where a kernel reads them, else bf16.
  template <class B>
  static linear<B> load(const WeightTensor& t, CudaWeightStore& store) {
    return load_stacked<B>(std::span<const WeightTensor>(&t, 1), store);
  }

  /// Several weights with one input width stacked row-wise; in blocks when they share one block type.
  template <class B>
  static linear<B> load_stacked(std::span<const WeightTensor> parts, CudaWeightStore& store) {
    return {detail::load_stacked_in_place(parts, store)};
  }

  /// The optional stacking test: false for parts in blocks of different types, which the model then loads
  /// apart (each through `load`, so each stays in its blocks) instead of widening them to bf16.
  static bool stacks(std::span<const WeightTensor> parts) { return detail::stacks_in_place(parts); }

  /// The optional strided matmul for parts loaded apart: writes y's columns in place (row m at y + m·ldy)
  /// and returns true, or returns false having done nothing (the caller copies the columns).
  static bool matmul_into(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                          std::uint16_t* y, std::int64_t ldy) {
    return detail::cuda_matmul_into(ctx, w, x, rows, y, ldy);
  }

  /// The optional table hooks: the embedding and the LM head load through `load` (so they stay in their
  /// blocks), rows are gathered by `embed` and logits made by `logits` (f32).
  static void embed(const linear<cuda>& table, const std::int32_t* ids, std::int64_t n, float* x, void* stream) {
    detail::cuda_embed(table, ids, n, x, stream);
  }
  static void logits(CudaMatmulContext& ctx, const linear<cuda>& head, const std::uint16_t* x, std::int32_t rows,
                     float* y) {
    detail::cuda_logits(ctx, head, x, rows, y);
  }

  static void matmul(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                     std::uint16_t* y) {
    detail::cuda_matmul(ctx, w, x, rows, y);
  }

  /// The optional SwiGLU hook: y = silu(x·gateᵀ) * (x·upᵀ) for a stacked [gate; up] weight in one kernel where
  /// one exists (the GEMV's rows: bf16 weights, GGUF blocks up to kGemvMaxRows); false when it does not, and the
  /// caller runs matmul + swiglu.
  static bool matmul_swiglu(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                            std::uint16_t* y) {
    return detail::cuda_matmul_swiglu(ctx, w, x, rows, y);
  }

  /// The optional pre-norm hooks: matmul (into columns, ldy 0: dense), matmul_swiglu and logits with x given as the
  /// decoder's pending residual add and RMSNorm, computed inside the GEMV (kernels::cuda::ResidualNorm); true
  /// where that runs (blocks, up to kGemvMaxRows rows), false having done nothing otherwise (the model runs the
  /// norm kernel, then the plain hook).
  static bool matmul_normed(CudaMatmulContext& ctx, const linear<cuda>& w, const kernels::cuda::ResidualNorm& x,
                            std::int32_t rows, std::uint16_t* y, std::int64_t ldy) {
    return detail::cuda_matmul_normed(ctx, w, x, rows, y, ldy);
  }
  static bool matmul_swiglu_normed(CudaMatmulContext& ctx, const linear<cuda>& w, const kernels::cuda::ResidualNorm& x,
                                   std::int32_t rows, std::uint16_t* y) {
    return detail::cuda_matmul_swiglu_normed(ctx, w, x, rows, y);
  }
  static bool logits_normed(CudaMatmulContext& ctx, const linear<cuda>& head, const kernels::cuda::ResidualNorm& x,
                            std::int32_t rows, float* y) {
    return detail::cuda_logits_normed(ctx, head, x, rows, y);
  }
#endif
};

#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<GgufInPlace, cuda>);
#endif

}  // namespace infer
