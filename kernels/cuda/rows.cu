// Row-wise helpers of the decoder step: the q/k/v bias add (bf16 in place, f32 bias) and the gather of
// the sampled rows of the residual stream. Both are tiny next to the GEMMs; plain grid-stride loops.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(std::int64_t work) {
  const std::int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < 8192 ? blocks : 8192);
}

__global__ void add_bias_kernel(std::uint16_t* __restrict__ x, const float* __restrict__ bias, std::int64_t total,
                                std::int64_t cols) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    x[i] = f32_to_bf16(bf16_to_f32(x[i]) + __ldg(bias + i % cols));
}

__global__ void gather_rows_kernel(const float* __restrict__ src, const std::int32_t* __restrict__ rows,
                                   std::int64_t n, std::int64_t dim, float* __restrict__ dst) {
  const std::int64_t total = n * dim;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t r = i / dim, c = i - r * dim;
    dst[i] = src[static_cast<std::int64_t>(__ldg(rows + r)) * dim + c];
  }
}

}  // namespace

void add_bias(std::uint16_t* x_bf16, const float* bias, std::int64_t T, std::int64_t cols, void* stream) {
  if (T < 0 || cols < 0) throw InvalidArgument(detail::cat("cuda::add_bias: negative size (T ", T, ", cols ", cols, ")"));
  if (T == 0 || cols == 0) return;
  if (x_bf16 == nullptr || bias == nullptr) throw InvalidArgument("cuda::add_bias: null pointer");
  add_bias_kernel<<<grid_for(T * cols), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x_bf16, bias, T * cols, cols);
  backend::cuda::check(cudaGetLastError(), "cuda::add_bias: kernel launch");
}

void gather_rows(const float* src, const std::int32_t* rows, std::int64_t n, std::int64_t dim, float* dst,
                 void* stream) {
  if (n < 0 || dim < 0) throw InvalidArgument(detail::cat("cuda::gather_rows: negative size (n ", n, ", dim ", dim, ")"));
  if (n == 0 || dim == 0) return;
  if (src == nullptr || rows == nullptr || dst == nullptr) throw InvalidArgument("cuda::gather_rows: null pointer");
  gather_rows_kernel<<<grid_for(n * dim), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, rows, n, dim, dst);
  backend::cuda::check(cudaGetLastError(), "cuda::gather_rows: kernel launch");
}

}  // namespace infer::kernels::cuda
