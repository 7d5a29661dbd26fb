#pragma once
/// \file
/// Dummy-weight fills on the device (kernels/cuda/fill.cu): element i = dummy_value(seed, i, center,
/// spread) (model/dummy.hpp), as bf16 (rounded to nearest even) or f32 rounded through bf16, so the CPU,
/// which computes the same function, builds a bit-identical model. Asynchronous on `stream`.

#if defined(INFER_HAVE_CUDA)

#include <cstddef>
#include <cstdint>

namespace infer::kernels::cuda {

/// Which part of the whole tensor a fill is (DummyFill's slice, model/dummy.hpp's dummy_index): element j is
/// element dummy_index(j, cols, row0, col0, full_cols) of the whole. Default: the whole tensor.
struct DummySlice {
  std::uint64_t cols = 0, row0 = 0, col0 = 0, full_cols = 0;
};

void fill_dummy_bf16(std::uint16_t* dst, std::size_t n, std::uint64_t seed, float center, float spread, void* stream,
                     DummySlice slice = {});
void fill_dummy_f32(float* dst, std::size_t n, std::uint64_t seed, float center, float spread, void* stream,
                    DummySlice slice = {});

}  // namespace infer::kernels::cuda

#endif
