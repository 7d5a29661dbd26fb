#pragma once
// The decoder's pre-norm (ops.hpp's ResidualNorm) computed in a GEMV's prologue, as the GGUF GEMV
// (gguf_gemv.cu) does at batch 1: every CTA sums the squares of r = residual +
// delta over the whole row in the same fixed order (so every CTA gets the same inverse norm, bit for bit), then
// forms x = bf16(r · inv · weight) chunk by chunk, rounded as add_rmsnorm_kernel (rmsnorm.cu) rounds it. The r
// and x the next kernels read are written once, shared out: CTA b of a grid of G stores chunk i of each row where
// i mod G = b. Why: a standalone norm kernel between two GEMVs costs a decode step ~2 µs of latency (a small
// chained kernel in a graph, measured by the GGUF paths bench); 64 of them are ~3% of Llama-3-8B's bf16 step.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"

namespace infer::kernels::cuda::prenorm {

/// Chunk c (8 values) of r = residual + delta, the ResidualNorm's sum, as f32.
__device__ __forceinline__ void residual_chunk(const ResidualNorm& n, std::int64_t c, float (&r)[8]) {
  const auto* r4 = reinterpret_cast<const float4*>(n.residual) + 2 * c;
  const float4 a = r4[0], b = r4[1];
  r[0] = a.x, r[1] = a.y, r[2] = a.z, r[3] = a.w, r[4] = b.x, r[5] = b.y, r[6] = b.z, r[7] = b.w;
  if (n.delta != nullptr) {
    const uint4 d = reinterpret_cast<const uint4*>(n.delta)[c];
    const std::uint32_t dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      r[2 * e] += __uint_as_float(dw[e] << 16);
      r[2 * e + 1] += __uint_as_float(dw[e] & 0xffff0000u);
    }
  }
}

/// Each row's rsqrt(mean(r²) + eps) of a ResidualNorm over MM rows of K, into inv[0..MM): every thread's sums, then
/// the warps' in a fixed order through `sums` (kWarpsN·MM floats). Ends with a barrier; the whole CTA calls it.
template <int MM, int kWarpsN>
__device__ __forceinline__ void inv_rms(const ResidualNorm& n, std::int64_t K, float* sums, float* inv) {
  const auto cpr = static_cast<std::uint32_t>(K / 8);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int m = 0; m < MM; ++m) {
    float ss = 0.0f;
    for (std::uint32_t i = threadIdx.x; i < cpr; i += kWarpsN * 32) {
      float r[8];
      residual_chunk(n, static_cast<std::int64_t>(m) * cpr + i, r);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += r[e] * r[e];
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) sums[warp * MM + m] = ss;
  }
  __syncthreads();
  if (threadIdx.x < MM) {
    float t = 0.0f;
    for (int w = 0; w < kWarpsN; ++w) t += sums[w * MM + static_cast<int>(threadIdx.x)];
    inv[threadIdx.x] = rsqrtf(t / static_cast<float>(K) + n.eps);
  }
  __syncthreads();
}

/// Chunk c of x (row m = c / chunks_per_row, chunk i of it) as 8 bf16 values packed in a uint4, given its r
/// (residual_chunk) and the row's inverse norm `s`; where i mod writers = writer, r goes to residual_out and x
/// to normed_out (those given).
__device__ __forceinline__ uint4 normed_chunk_of(const ResidualNorm& n, std::int64_t c, const float (&r)[8],
                                                 std::uint32_t chunks_per_row, float s, std::uint32_t writer,
                                                 std::uint32_t writers) {
  const auto cc = static_cast<std::uint32_t>(c);
  const std::uint32_t i = cc % chunks_per_row;
  const bool mine = i % writers == writer;
  if (mine && n.residual_out != nullptr) {
    auto* o = reinterpret_cast<float4*>(n.residual_out) + 2 * c;
    o[0] = make_float4(r[0], r[1], r[2], r[3]);
    o[1] = make_float4(r[4], r[5], r[6], r[7]);
  }
  const auto* w4 = reinterpret_cast<const float4*>(n.weight) + 2 * i;
  const float4 wa = __ldg(w4), wb = __ldg(w4 + 1);
  const float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
  std::uint32_t packed[4];
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const std::uint16_t lo = f32_to_bf16(r[e] * s * w[e]), hi = f32_to_bf16(r[e + 1] * s * w[e + 1]);
    packed[e / 2] = static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
  }
  const uint4 x = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  if (mine && n.normed_out != nullptr) reinterpret_cast<uint4*>(n.normed_out)[c] = x;
  return x;
}

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// The host's checks of a ResidualNorm a fused kernel takes (`who` names the caller): InvalidArgument for no
/// weight or residual, a misaligned pointer, or residual_out over the residual (other CTAs still read it).
inline void check(const char* who, const ResidualNorm& n) {
  using infer::detail::cat;
  if (n.weight == nullptr || n.residual == nullptr)
    throw InvalidArgument(cat(who, ": the pre-norm has no ", n.weight == nullptr ? "weight" : "residual"));
  if (!(aligned16(n.residual) && aligned16(n.delta) && aligned16(n.weight) && aligned16(n.residual_out) &&
        aligned16(n.normed_out)))
    throw InvalidArgument(cat(who, ": the pre-norm's residual, delta, weight and outputs must be 16-byte aligned"));
  if (n.residual_out != nullptr && static_cast<const void*>(n.residual_out) == static_cast<const void*>(n.residual))
    throw InvalidArgument(cat(who,
                              ": the pre-norm's residual_out must be another buffer than its residual "
                              "(the kernel's CTAs read the residual while others write)"));
}

}  // namespace infer::kernels::cuda::prenorm
