#pragma once
/// \file
/// `infer::Bf16`: the CUDA backend's unquantized Quantizer. Every weight — bf16, f16, f32 or any GGUF
/// block format — is stored as bf16 [out][in] in the weight arena (decoded on the device at load), and
/// the matmul is a cuBLASLt bf16 GEMM with f32 accumulation. What TensorRT-LLM and vLLM run for a bf16
/// checkpoint; for a GGUF file it trades 2-5x more weight bytes per token for tensor-core GEMMs.

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
struct Bf16Linear;  ///< only the cuda backend stores bf16 weights
#if defined(INFER_HAVE_CUDA)
template <>
struct Bf16Linear<cuda> : CudaLinear {};
#endif
}  // namespace detail

struct Bf16 {
  static constexpr std::string_view name = "bf16";

  template <class B>
  using linear = detail::Bf16Linear<B>;

#if defined(INFER_HAVE_CUDA)
  /// A linear layer's weight [out, in] as bf16. InvalidArgument when `t` is not 2-D.
  template <class B>
  static linear<B> load(const WeightTensor& t, CudaWeightStore& store) {
    return load_stacked<B>(std::span<const WeightTensor>(&t, 1), store);
  }

  /// Several weights with one input width, stacked row-wise into one [sum of out, in] weight.
  template <class B>
  static linear<B> load_stacked(std::span<const WeightTensor> parts, CudaWeightStore& store) {
    return {detail::load_stacked_bf16(parts, store)};
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
static_assert(Quantizer<Bf16, cuda>);
#endif

}  // namespace infer
