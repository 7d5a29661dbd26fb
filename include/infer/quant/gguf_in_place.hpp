#pragma once
/// \file
/// `infer::GgufInPlace`: the CUDA backend's Quantizer for GGUF files — weights in Q8_0, Q4_0, Q4_1,
/// Q4_K and Q6_K stay in their blocks on the GPU (2-5x fewer bytes than bf16, which is what batch-1
/// decode is bound by), multiplied by the fused dequantize-GEMV for up to 8 rows and by
/// dequantize-to-bf16 + cuBLASLt GEMM for more (prefill). Every other weight (bf16/f16/f32 tensors, the
/// block types without a GEMV kernel: Q5_K, Q5_0, Q5_1, IQ4_NL, IQ4_XS; dummy weights) is stored as bf16, as
/// Bf16 does (blocks decoded once at load by kernels::cuda::dequantize). The CUDA default.

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

  static void matmul(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                     std::uint16_t* y) {
    detail::cuda_matmul(ctx, w, x, rows, y);
  }

  /// The optional SwiGLU hook: y = silu(x·gateᵀ) * (x·upᵀ) for a stacked [gate; up] weight in one kernel where
  /// one exists (bf16 weights at batch 1); false when it does not, and the caller runs matmul + swiglu.
  static bool matmul_swiglu(CudaMatmulContext& ctx, const linear<cuda>& w, const std::uint16_t* x, std::int32_t rows,
                            std::uint16_t* y) {
    return detail::cuda_matmul_swiglu(ctx, w, x, rows, y);
  }
#endif
};

#if defined(INFER_HAVE_CUDA)
static_assert(Quantizer<GgufInPlace, cuda>);
#endif

}  // namespace infer
