// Token embedding gather: bf16 table rows into the f32 residual stream. A flat grid-stride loop over
// 8-value chunks (one 16-byte load, two 16-byte stores) when every row starts 16-byte aligned, else
// over single values. Pure bandwidth: the bf16 -> f32 conversion is exact.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "chained_launch.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGrid = 8192;

__device__ __forceinline__ float lo_bf16(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

/// `chunks_per_row` chunks of 8 values per row; table and out rows 16-byte aligned (dim % 8 == 0).
__global__ void embedding_vec_kernel(const uint4* __restrict__ table, const std::int32_t* __restrict__ ids,
                                     std::int64_t n, std::int64_t chunks_per_row, float4* __restrict__ out) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const std::int64_t total = n * chunks_per_row;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t row = i / chunks_per_row, c = i - row * chunks_per_row;
    const std::int32_t id = __ldg(ids + row);
    const uint4 w = id < 0 ? make_uint4(0, 0, 0, 0) : __ldg(table + static_cast<std::int64_t>(id) * chunks_per_row + c);
    out[2 * i] = make_float4(lo_bf16(w.x), hi_bf16(w.x), lo_bf16(w.y), hi_bf16(w.y));
    out[2 * i + 1] = make_float4(lo_bf16(w.z), hi_bf16(w.z), lo_bf16(w.w), hi_bf16(w.w));
  }
}

__global__ void embedding_scalar_kernel(const std::uint16_t* __restrict__ table, const std::int32_t* __restrict__ ids,
                                        std::int64_t n, std::int64_t dim, float* __restrict__ out) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const std::int64_t total = n * dim;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t row = i / dim, c = i - row * dim;
    out[i] = ids[row] < 0 ? 0.0f : bf16_to_f32(table[static_cast<std::int64_t>(ids[row]) * dim + c]);
  }
}

unsigned grid_for(std::int64_t work) {
  const std::int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

}  // namespace

void embedding(const std::uint16_t* table_bf16, const std::int32_t* ids, std::int64_t n, std::int64_t dim,
               float* out, void* stream) {
  if (n < 0 || dim < 0) throw InvalidArgument(detail::cat("cuda::embedding: negative size (n ", n, ", dim ", dim, ")"));
  if (n == 0 || dim == 0) return;
  if (table_bf16 == nullptr || ids == nullptr || out == nullptr)
    throw InvalidArgument(detail::cat("cuda::embedding: null ",
                                      table_bf16 == nullptr ? "table" : ids == nullptr ? "ids" : "output",
                                      " pointer for ", n, " rows of ", dim));
  const auto s = static_cast<cudaStream_t>(stream);
  const bool vec = dim % 8 == 0 && reinterpret_cast<std::uintptr_t>(table_bf16) % 16 == 0 &&
                   reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  if (vec) {
    const std::int64_t chunks = dim / 8;
    chained::launch(embedding_vec_kernel, grid_for(n * chunks), kThreads, 0, s,
                    reinterpret_cast<const uint4*>(table_bf16), ids, n, chunks, reinterpret_cast<float4*>(out));
  } else {
    chained::launch(embedding_scalar_kernel, grid_for(n * dim), kThreads, 0, s, table_bf16, ids, n, dim, out);
  }
  backend::cuda::check(cudaGetLastError(), "cuda::embedding: kernel launch");
}

}  // namespace infer::kernels::cuda
