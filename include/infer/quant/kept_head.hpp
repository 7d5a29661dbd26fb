#pragma once
/// \file
/// `detail::KeptHead`: the LM head a low-precision Quantizer keeps out of its format. The field's tools leave
/// it wide: GPTQ and AWQ checkpoints ship `lm_head` unquantized, ModelOpt's and vLLM's FP8 skip it, llama.cpp's
/// Q4 files keep `output.weight` at Q6_K or wider. It is one layer of the model's ~7 per block, but every
/// logit comes out of it, and on SmolLM2 (a tied 49,152 x 576 head) rounding it to INT4 was all of the INT4
/// quantizer's perplexity loss (docs/benchmarks.md). A quantizer's CPU linear derives from KeptHead and, for
/// a LinearRequest with `lm_head` set that its checkpoint did not quantize, holds the weight in f32, as F32
/// does; its matmul is then F32's.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "infer/kernels/cpu_ops.hpp"
#include "infer/quant/f32.hpp"
#include "infer/quant/linear_request.hpp"

namespace infer::detail {

struct KeptHead {
  std::vector<float> dense;  ///< [out][in] f32 for the LM head kept out of the format; empty for every other layer

  [[nodiscard]] bool is_dense() const noexcept { return !dense.empty(); }

  /// The head of `r` decoded to f32 into `l` (a linear deriving from KeptHead, with out_features and
  /// in_features), as F32 loads it.
  template <class L>
  static L keep(const LinearRequest& r) {
    L l;
    l.out_features = r.out;
    l.in_features = r.in;
    l.dense.resize(static_cast<std::size_t>(r.out * r.in));
    dequantize_to_f32(r.checked_weight(), l.dense);
    return l;
  }

  /// For a linear's consistent(): a kept head has its f32 matrix and nothing of the format (`format_empty`).
  [[nodiscard]] bool dense_consistent(std::int64_t out, std::int64_t in, bool format_empty) const noexcept {
    return out > 0 && in > 0 && dense.size() == static_cast<std::size_t>(out * in) && format_empty;
  }

  /// y = x · denseᵀ when this is a kept head (F32's matmul); false, nothing done, otherwise.
  bool dense_matmul(std::int64_t out, std::int64_t in, const float* x, std::int32_t rows, float* y) const {
    if (!is_dense()) return false;
    kernels::cpu::gemm_xwt(x, dense.data(), y, rows, out, in);
    return true;
  }
};

}  // namespace infer::detail
