#pragma once
/// \file
/// Dummy-weight fills on the device (kernels/cuda/fill.cu): element i = dummy_value(seed, i, center,
/// spread) (model/dummy.hpp), as bf16 (rounded to nearest even) or f32 rounded through bf16, so the CPU,
/// which computes the same function, builds a bit-identical model. Asynchronous on `stream`.

#if defined(INFER_HAVE_CUDA)

#include <cstddef>
#include <cstdint>

namespace infer::kernels::cuda {

void fill_dummy_bf16(std::uint16_t* dst, std::size_t n, std::uint64_t seed, float center, float spread, void* stream);
void fill_dummy_f32(float* dst, std::size_t n, std::uint64_t seed, float center, float spread, void* stream);

}  // namespace infer::kernels::cuda

#endif
