// Dummy-weight fills: a grid-stride loop over a counter-based hash (dummy_value), so any element is
// computed independently and 16 GB of weights take a few milliseconds at memory bandwidth.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/fill.hpp"
#include "infer/model/dummy.hpp"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void fill_dummy_kernel(T* __restrict__ dst, std::size_t n, std::uint64_t seed, float center, float spread,
                                  DummySlice sl) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint16_t b =
        f32_to_bf16(dummy_value(seed, dummy_index(i, sl.cols, sl.row0, sl.col0, sl.full_cols), center, spread));
    if constexpr (sizeof(T) == 2) dst[i] = b;
    else dst[i] = bf16_to_f32(b);
  }
}

template <class T>
void launch(T* dst, std::size_t n, std::uint64_t seed, float center, float spread, DummySlice slice, void* stream,
            const char* what) {
  if (n == 0) return;
  if (dst == nullptr) throw InvalidArgument(detail::cat(what, ": null destination for ", n, " values"));
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  fill_dummy_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(dst, n, seed, center, spread, slice);
  backend::cuda::check(cudaGetLastError(), what);
}

}  // namespace

void fill_dummy_bf16(std::uint16_t* dst, std::size_t n, std::uint64_t seed, float center, float spread, void* stream,
                     DummySlice slice) {
  launch(dst, n, seed, center, spread, slice, stream, "cuda::fill_dummy_bf16");
}

void fill_dummy_f32(float* dst, std::size_t n, std::uint64_t seed, float center, float spread, void* stream,
                    DummySlice slice) {
  launch(dst, n, seed, center, spread, slice, stream, "cuda::fill_dummy_f32");
}

}  // namespace infer::kernels::cuda
