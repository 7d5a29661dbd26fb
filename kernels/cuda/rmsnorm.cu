// Fused residual add + RMSNorm: one block per row. Pass 1 adds delta into the f32 residual (written
// back, in place or to another buffer) and sums squares; a warp-shuffle tree reduces the sum across the
// block; pass 2 re-reads the row each thread itself just wrote (L1/L2-resident) and writes
// bf16(x * inv_rms * weight).
// 16-byte loads of residual/delta/weight and 8-byte stores of 4 bf16 when dim % 4 == 0 and aligned.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "chained_launch.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kMaxThreads = 1024;

/// Sum over the block; every thread gets the result. `scratch` holds one float per warp.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warps = static_cast<int>(blockDim.x + 31) / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Four consecutive delta values as f32, from f32 (one 16-byte load) or bf16 (one 8-byte load).
__device__ __forceinline__ float4 load4(const float* d, std::int64_t i) { return __ldg(reinterpret_cast<const float4*>(d) + i); }
__device__ __forceinline__ float4 load4(const std::uint16_t* d, std::int64_t i) {
  const uint2 r = __ldg(reinterpret_cast<const uint2*>(d) + i);
  return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u), __uint_as_float(r.y << 16),
                     __uint_as_float(r.y & 0xffff0000u));
}
__device__ __forceinline__ float load1(const float* d, std::int64_t i) { return d[i]; }
__device__ __forceinline__ float load1(const std::uint16_t* d, std::int64_t i) { return bf16_to_f32(d[i]); }

template <bool kVec, class Delta>
__global__ void add_rmsnorm_kernel(const float* residual, float* residual_out, const Delta* __restrict__ delta,
                                   const float* __restrict__ weight, std::int64_t dim, float eps,
                                   std::uint16_t* __restrict__ out) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const float* xin = residual + row * dim;
  // Where the row's sum goes (may be xin itself); null: nowhere, pass 2 reads xin.
  float* xo = residual_out != nullptr ? residual_out + row * dim : nullptr;
  const float* x = xo != nullptr ? xo : xin;  // what pass 2 reads: each thread its own pass-1 values
  const Delta* d = delta != nullptr ? delta + row * dim : nullptr;
  std::uint16_t* y = out + row * dim;
  const auto tid = static_cast<std::int64_t>(threadIdx.x), nt = static_cast<std::int64_t>(blockDim.x);
  float sum = 0.0f;
  if constexpr (kVec) {
    const auto* x4 = reinterpret_cast<const float4*>(xin);
    const std::int64_t n4 = dim / 4;
    for (std::int64_t i = tid; i < n4; i += nt) {
      float4 v = x4[i];
      if (d != nullptr) {
        const float4 a = load4(d, i);
        v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
      }
      if (xo != nullptr) reinterpret_cast<float4*>(xo)[i] = v;
      sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (std::int64_t i = tid; i < dim; i += nt) {
      float v = xin[i];
      if (d != nullptr) v += load1(d, i);
      if (xo != nullptr) xo[i] = v;
      sum += v * v;
    }
  }
  const float inv = rsqrtf(block_sum(sum, scratch) / static_cast<float>(dim) + eps);
  if constexpr (kVec) {
    const auto* x4 = reinterpret_cast<const float4*>(x);
    const auto* w4 = reinterpret_cast<const float4*>(weight);
    const std::int64_t n4 = dim / 4;
    for (std::int64_t i = tid; i < n4; i += nt) {
      const float4 v = x4[i], w = __ldg(w4 + i);
      uint2 p;
      p.x = static_cast<unsigned>(f32_to_bf16(v.x * inv * w.x)) |
            (static_cast<unsigned>(f32_to_bf16(v.y * inv * w.y)) << 16);
      p.y = static_cast<unsigned>(f32_to_bf16(v.z * inv * w.z)) |
            (static_cast<unsigned>(f32_to_bf16(v.w * inv * w.w)) << 16);
      reinterpret_cast<uint2*>(y)[i] = p;
    }
  } else {
    for (std::int64_t i = tid; i < dim; i += nt) y[i] = f32_to_bf16(x[i] * inv * __ldg(weight + i));
  }
}

bool aligned(const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

template <class Delta>
void launch_add_rmsnorm(const char* who, const float* residual, float* residual_out, const Delta* delta,
                        const float* weight, std::int64_t rows, std::int64_t dim, float eps, std::uint16_t* out_bf16,
                        void* stream) {
  if (rows < 0 || dim < 0) throw InvalidArgument(detail::cat(who, ": negative size (rows ", rows, ", dim ", dim, ")"));
  if (rows == 0 || dim == 0) return;
  if (residual == nullptr || weight == nullptr || out_bf16 == nullptr)
    throw InvalidArgument(detail::cat(who, ": null ",
                                      residual == nullptr ? "residual" : weight == nullptr ? "weight" : "output",
                                      " pointer for ", rows, " rows of ", dim));
  if (rows > 0x7fffffff) throw InvalidArgument(detail::cat(who, ": ", rows, " rows exceed one grid"));
  const bool vec = dim % 4 == 0 && aligned(residual, 16) && aligned(weight, 16) && aligned(out_bf16, 8) &&
                   (residual_out == nullptr || aligned(residual_out, 16)) &&
                   (delta == nullptr || aligned(delta, 4 * sizeof(Delta)));
  // One thread per 4 values (per value when scalar), whole warps, at most 1024; long rows loop.
  const std::int64_t per_row = vec ? dim / 4 : dim;
  std::int64_t threads = (per_row + 31) / 32 * 32;
  if (threads > kMaxThreads) threads = kMaxThreads;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(threads));
  if (vec)
    chained::launch(add_rmsnorm_kernel<true, Delta>, grid, block, 0, s, residual, residual_out, delta, weight, dim, eps,
                    out_bf16);
  else
    chained::launch(add_rmsnorm_kernel<false, Delta>, grid, block, 0, s, residual, residual_out, delta, weight, dim,
                    eps, out_bf16);
  backend::cuda::check(cudaGetLastError(), detail::cat(who, ": kernel launch").c_str());
}

}  // namespace

void add_rmsnorm(float* residual, const float* delta, const float* weight, std::int64_t rows, std::int64_t dim,
                 float eps, std::uint16_t* out_bf16, void* stream) {
  launch_add_rmsnorm("cuda::add_rmsnorm", residual, delta != nullptr ? residual : nullptr, delta, weight, rows, dim,
                     eps, out_bf16, stream);
}

void add_bf16_rmsnorm(float* residual, const std::uint16_t* delta_bf16, const float* weight, std::int64_t rows,
                      std::int64_t dim, float eps, std::uint16_t* out_bf16, void* stream) {
  launch_add_rmsnorm("cuda::add_bf16_rmsnorm", residual, delta_bf16 != nullptr ? residual : nullptr, delta_bf16, weight,
                     rows, dim, eps, out_bf16, stream);
}

void residual_norm(const ResidualNorm& n, std::int64_t rows, std::int64_t dim, void* stream) {
  launch_add_rmsnorm("cuda::residual_norm", n.residual, n.residual_out, n.delta, n.weight, rows, dim, n.eps,
                     n.normed_out, stream);
}

}  // namespace infer::kernels::cuda
