// SwiGLU and the bf16 residual add: flat grid-stride loops, 8 values per thread per step through
// 16-byte loads/stores when the rows allow it, single values otherwise. silu in f32 with the accurate
// expf (no fast-math), so results differ from the CPU reference only by f32 rounding before the final
// bf16 rounding.
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
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  return static_cast<unsigned>(f32_to_bf16(lo)) | (static_cast<unsigned>(f32_to_bf16(hi)) << 16);
}
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ unsigned swiglu2(unsigned g, unsigned u) {
  return pack_bf16(silu_mul(lo_bf16(g), lo_bf16(u)), silu_mul(hi_bf16(g), hi_bf16(u)));
}

/// I % 8 == 0, pointers 16-byte aligned: chunk c of row t covers values [8c, 8c + 8).
__global__ void swiglu_vec_kernel(const uint4* __restrict__ gate_up, std::int64_t T, std::int64_t chunks,
                                  uint4* __restrict__ out) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const std::int64_t total = T * chunks;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t t = i / chunks, c = i - t * chunks;
    const uint4 g = __ldg(gate_up + t * 2 * chunks + c);
    const uint4 u = __ldg(gate_up + t * 2 * chunks + chunks + c);
    out[i] = make_uint4(swiglu2(g.x, u.x), swiglu2(g.y, u.y), swiglu2(g.z, u.z), swiglu2(g.w, u.w));
  }
}

__global__ void swiglu_scalar_kernel(const std::uint16_t* __restrict__ gate_up, std::int64_t T, std::int64_t I,
                                     std::uint16_t* __restrict__ out) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const std::int64_t total = T * I;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t t = i / I, c = i - t * I;
    const float g = bf16_to_f32(gate_up[t * 2 * I + c]), u = bf16_to_f32(gate_up[t * 2 * I + I + c]);
    out[i] = f32_to_bf16(silu_mul(g, u));
  }
}

__global__ void add_vec_kernel(float4* __restrict__ residual, const uint4* __restrict__ delta, std::int64_t chunks) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += stride) {
    const uint4 d = __ldg(delta + i);
    float4 a = residual[2 * i], b = residual[2 * i + 1];
    a.x += lo_bf16(d.x), a.y += hi_bf16(d.x), a.z += lo_bf16(d.y), a.w += hi_bf16(d.y);
    b.x += lo_bf16(d.z), b.y += hi_bf16(d.z), b.z += lo_bf16(d.w), b.w += hi_bf16(d.w);
    residual[2 * i] = a;
    residual[2 * i + 1] = b;
  }
}

__global__ void add_scalar_kernel(float* __restrict__ residual, const std::uint16_t* __restrict__ delta,
                                  std::int64_t begin, std::int64_t n) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = begin + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    residual[i] += bf16_to_f32(delta[i]);
}

unsigned grid_for(std::int64_t work) {
  const std::int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < kMaxGrid ? blocks : kMaxGrid);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void swiglu(const std::uint16_t* gate_up, std::int64_t T, std::int64_t I, std::uint16_t* out, void* stream) {
  if (T < 0 || I < 0) throw InvalidArgument(detail::cat("cuda::swiglu: negative size (T ", T, ", I ", I, ")"));
  if (T == 0 || I == 0) return;
  if (gate_up == nullptr || out == nullptr)
    throw InvalidArgument(detail::cat("cuda::swiglu: null ", gate_up == nullptr ? "gate_up" : "output", " pointer for ",
                                      T, " rows of ", I));
  const auto s = static_cast<cudaStream_t>(stream);
  if (I % 8 == 0 && aligned16(gate_up) && aligned16(out)) {
    const std::int64_t chunks = I / 8;
    chained::launch(swiglu_vec_kernel, grid_for(T * chunks), kThreads, 0, s, reinterpret_cast<const uint4*>(gate_up), T,
                    chunks, reinterpret_cast<uint4*>(out));
  } else {
    chained::launch(swiglu_scalar_kernel, grid_for(T * I), kThreads, 0, s, gate_up, T, I, out);
  }
  backend::cuda::check(cudaGetLastError(), "cuda::swiglu: kernel launch");
}

void add(float* residual, const std::uint16_t* delta_bf16, std::int64_t n, void* stream) {
  if (n < 0) throw InvalidArgument(detail::cat("cuda::add: negative size ", n));
  if (n == 0) return;
  if (residual == nullptr || delta_bf16 == nullptr)
    throw InvalidArgument(detail::cat("cuda::add: null ", residual == nullptr ? "residual" : "delta", " pointer for ",
                                      n, " values"));
  const auto s = static_cast<cudaStream_t>(stream);
  std::int64_t done = 0;
  if (aligned16(residual) && aligned16(delta_bf16)) {
    const std::int64_t chunks = n / 8;
    if (chunks > 0)
      chained::launch(add_vec_kernel, grid_for(chunks), kThreads, 0, s, reinterpret_cast<float4*>(residual),
                      reinterpret_cast<const uint4*>(delta_bf16), chunks);
    done = chunks * 8;
  }
  if (done < n) chained::launch(add_scalar_kernel, grid_for(n - done), kThreads, 0, s, residual, delta_bf16, done, n);
  backend::cuda::check(cudaGetLastError(), "cuda::add: kernel launch");
}

}  // namespace infer::kernels::cuda
