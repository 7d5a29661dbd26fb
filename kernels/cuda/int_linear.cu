// Weight-only integer linear layers (INT8 per row, INT4 in groups): quantization at load, the decode GEMVs
// and the dequantization for the prefill GEMM (include/infer/kernels/cuda/int_linear.hpp says what each
// computes).
//
// The GEMVs take bf16_gemv.cu's layout (gemv_split.cuh): a row group of kSplit warps streams 16-byte
// chunks of two weight rows, kUnroll chunks in flight per lane. A chunk holds 16 INT8 codes or 32 INT4
// codes, so it meets 2 or 4 chunks of bf16 activations (gemv_split::XChunks). Codes become f32 exactly
// through the exponent trick: a byte b placed in the low bits of 2^23's pattern is the float 2^23 + b, and
// subtracting 2^23 (INT8: 2^23 + 128, the codes being stored offset by 128 after an XOR) leaves b. One
// PRMT and one FADD per code, where a conversion instruction (I2F) would run at a quarter of the rate.
// Sums are f32: INT8 adds x·q over the row and applies s once; INT4 adds Σ x·q and Σ x over each chunk (32
// codes, one group) and folds the group's scale and zero in: s·(Σ x·q − z·Σ x).
//
// The quantizers run the CPU's arithmetic (quant/int8_weight_only.hpp, quant/int4.hpp) with IEEE f32
// division (__fdiv_rn) and round-to-nearest-even (rintf, std::nearbyint's default mode), so the codes and
// scales are the CPU's bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/kernels/cuda/int_linear.hpp"
#include "gemv_split.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kRows = 2;    // weight rows per row group
constexpr int kUnroll = 4;  // 16-byte chunks per row in flight per lane
using gemv_split::kWarps;
using gemv_split::XChunks;

constexpr float kTwo23 = 8388608.0f;

/// The two bf16 values of a 32-bit word as f32: the low half and the high half.
__device__ __forceinline__ float bf16_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

/// Byte k of `v` as the float 2^23 + byte.
__device__ __forceinline__ float byte_plus_2_23(unsigned v, int k) {
  return __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7540u | static_cast<unsigned>(k)));
}

/// Σ of the 16 products of an INT8 chunk (codes 0..15 of the chunk, in the four words) and its 16 bf16 values.
__device__ __forceinline__ float dot_int8(const uint4& w, const XChunks<2>& x) {
  const unsigned wv[4] = {w.x, w.y, w.z, w.w};
  const unsigned xv[8] = {x.v[0].x, x.v[0].y, x.v[0].z, x.v[0].w, x.v[1].x, x.v[1].y, x.v[1].z, x.v[1].w};
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned u = wv[j] ^ 0x80808080u;  // signed codes -128..127 as bytes 0..255, offset by 128
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float q = byte_plus_2_23(u, k) - (kTwo23 + 128.0f);
      const unsigned xw = xv[2 * j + k / 2];
      s = fmaf(q, k % 2 == 0 ? bf16_lo(xw) : bf16_hi(xw), s);
    }
  }
  return s;
}

/// Σ x·q and Σ x over an INT4 chunk: 32 codes (word j holds codes 8j..8j+7, code 8j + i at bits 4i) and
/// their 32 bf16 values (x.v[j] holds values 8j..8j+7, two to a word).
__device__ __forceinline__ float2 dot_int4(const uint4& w, const XChunks<4>& x) {
  const unsigned wv[4] = {w.x, w.y, w.z, w.w};
  float sq = 0.0f, sx = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned even = wv[j] & 0x0f0f0f0fu, odd = (wv[j] >> 4) & 0x0f0f0f0fu;  // codes 8j + 2t, 8j + 2t + 1 in byte t
    const unsigned xw[4] = {x.v[j].x, x.v[j].y, x.v[j].z, x.v[j].w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const float x0 = bf16_lo(xw[t]), x1 = bf16_hi(xw[t]);
      sq = fmaf(byte_plus_2_23(even, t) - kTwo23, x0, sq);
      sq = fmaf(byte_plus_2_23(odd, t) - kTwo23, x1, sq);
      sx += x0 + x1;
    }
  }
  return make_float2(sq, sx);
}

/// The INT8 GEMV: y[m][n] = bf16(s[n] · Σ_k x[m][k]·q[n][k]).
template <int M, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) int8_gemv_kernel(const uint4* __restrict__ w, const float* __restrict__ scale,
                                                                const XChunks<2>* __restrict__ x, std::int64_t N,
                                                                std::int64_t chunks, std::uint16_t* __restrict__ y) {
  const int warp_in_block = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t row0 =
      (static_cast<std::int64_t>(blockIdx.x) * (kWarps / kSplit) + warp_in_block / kSplit) * kRows;
  const bool active = row0 < N;  // an inactive group still reaches combine's barrier
  const uint4* wr[kRows];
  for (int r = 0; r < kRows; ++r) wr[r] = w + (row0 + r < N ? row0 + r : row0) * chunks;  // a missing row re-reads row0
  gemv_split::begin();
  float acc[kRows][M];
  gemv_split::stream_rows<M, kRows, kUnroll, kSplit>(
      wr, x, chunks, active, acc, [](const uint4& a, const XChunks<2>& b, int, std::int64_t) { return dot_int8(a, b); });
  if (!gemv_split::combine<kSplit, kRows, M>(acc, active)) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r >= N) break;
    const float s = scale[row0 + r];
#pragma unroll
    for (int m = 0; m < M; ++m) y[m * N + row0 + r] = gemv_split::to_bf16(acc[r][m] * s);
  }
}

/// The INT4 GEMV: each chunk c of row n adds s·(Σ x·q − z·Σ x) with (s, z) = scale_zero[n][c / chunks_per_group].
template <int M, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) int4_gemv_kernel(const uint4* __restrict__ w,
                                                                const float2* __restrict__ scale_zero,
                                                                std::int64_t groups, std::int64_t chunks_per_group,
                                                                const XChunks<4>* __restrict__ x, std::int64_t N,
                                                                std::int64_t chunks, std::uint16_t* __restrict__ y) {
  const int warp_in_block = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t row0 =
      (static_cast<std::int64_t>(blockIdx.x) * (kWarps / kSplit) + warp_in_block / kSplit) * kRows;
  const bool active = row0 < N;
  const uint4* wr[kRows];
  const float2* sz[kRows];
  for (int r = 0; r < kRows; ++r) {
    const std::int64_t row = row0 + r < N ? row0 + r : row0;
    wr[r] = w + row * chunks;
    sz[r] = scale_zero + row * groups;
  }
  gemv_split::begin();
  float acc[kRows][M];
  gemv_split::stream_rows<M, kRows, kUnroll, kSplit>(
      wr, x, chunks, active, acc, [&](const uint4& a, const XChunks<4>& b, int r, std::int64_t c) {
        const float2 d = dot_int4(a, b);
        const float2 p = __ldg(sz[r] + c / chunks_per_group);
        return p.x * fmaf(-p.y, d.y, d.x);
      });
  if (!gemv_split::combine<kSplit, kRows, M>(acc, active)) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r >= N) break;
#pragma unroll
    for (int m = 0; m < M; ++m) y[m * N + row0 + r] = gemv_split::to_bf16(acc[r][m]);
  }
}

template <int M, class Launch>
void with_split(int split, Launch&& launch) {
  switch (split) {
    case 1: launch.template operator()<M, 1>(); break;
    case 2: launch.template operator()<M, 2>(); break;
    default: launch.template operator()<M, 4>(); break;
  }
}

/// Calls launch.template operator()<M, kSplit>() for the runtime M (1..8) and split.
template <class Launch>
void with_m_split(int M, int split, Launch&& launch) {
  switch (M) {
    case 1: with_split<1>(split, launch); break;
    case 2: with_split<2>(split, launch); break;
    case 3: with_split<3>(split, launch); break;
    case 4: with_split<4>(split, launch); break;
    case 5: with_split<5>(split, launch); break;
    case 6: with_split<6>(split, launch); break;
    case 7: with_split<7>(split, launch); break;
    default: with_split<8>(split, launch); break;
  }
}

void check_gemv_args(const char* who, const void* w, const void* scale, const std::uint16_t* x, int M, std::int64_t N,
                     std::int64_t K, const std::uint16_t* y) {
  using detail::cat;
  if (M < 1 || M > kGemvMaxRows || N < 0 || K < 1)
    throw InvalidArgument(cat(who, ": M = ", M, ", N = ", N, ", K = ", K, "; needs 1 <= M <= ", kGemvMaxRows,
                              ", N >= 0, K >= 1"));
  if (N > 0x7fffffffLL * kRows) throw InvalidArgument(cat(who, ": N = ", N, " exceeds one grid"));
  if (w == nullptr || scale == nullptr || x == nullptr || y == nullptr) throw InvalidArgument(cat(who, ": null pointer"));
  if (reinterpret_cast<std::uintptr_t>(w) % 16 != 0 || reinterpret_cast<std::uintptr_t>(x) % 16 != 0)
    throw InvalidArgument(cat(who, ": the codes and x must be 16-byte aligned"));
}

// ---- quantization at load and dequantization for the GEMM ------------------------------------------------

constexpr int kQuantThreads = 256;

/// One block per row: max |w| by shuffles and shared memory, s = max / 127, then each code.
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_int8_kernel(const float* __restrict__ w, std::int64_t K,
                                                                           std::int8_t* __restrict__ q,
                                                                           float* __restrict__ scale) {
  const float* row = w + static_cast<std::int64_t>(blockIdx.x) * K;
  std::int8_t* out = q + static_cast<std::int64_t>(blockIdx.x) * K;
  float amax = 0.0f;
  for (std::int64_t k = threadIdx.x; k < K; k += kQuantThreads) amax = fmaxf(amax, fabsf(row[k]));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float warp_max[kQuantThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int i = 1; i < kQuantThreads / 32; ++i) amax = fmaxf(amax, warp_max[i]);
  const float s = __fdiv_rn(amax, 127.0f);
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  for (std::int64_t k = threadIdx.x; k < K; k += kQuantThreads) {
    const float v = s > 0.0f ? rintf(__fdiv_rn(row[k], s)) : 0.0f;
    out[k] = static_cast<std::int8_t>(fminf(fmaxf(v, -127.0f), 127.0f));
  }
}

/// One thread per (row, group), as Int4::quantize: the group's range widened to hold 0, then its codes
/// packed two to a byte.
__global__ void quantize_groups_int4_kernel(const float* __restrict__ w, std::int64_t N, std::int64_t K, std::int64_t G,
                                            std::uint8_t* __restrict__ codes, float2* __restrict__ scale_zero) {
  const std::int64_t groups = K / G;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * groups) return;
  const std::int64_t n = i / groups, g = i % groups;
  const float* v = w + n * K + g * G;
  float lo = 0.0f, hi = 0.0f;
  for (std::int64_t k = 0; k < G; ++k) {
    lo = fminf(lo, v[k]);
    hi = fmaxf(hi, v[k]);
  }
  const float s = __fdiv_rn(__fsub_rn(hi, lo), 15.0f);
  const float z = s > 0.0f ? fminf(fmaxf(rintf(__fdiv_rn(-lo, s)), 0.0f), 15.0f) : 0.0f;
  scale_zero[i] = make_float2(s, z);
  std::uint8_t* out = codes + (n * K + g * G) / 2;
  const auto code = [&](std::int64_t k) {
    return s > 0.0f ? static_cast<unsigned>(fminf(fmaxf(__fadd_rn(rintf(__fdiv_rn(v[k], s)), z), 0.0f), 15.0f)) : 0u;
  };
  for (std::int64_t k = 0; k < G; k += 2) out[k / 2] = static_cast<std::uint8_t>(code(k) | (code(k + 1) << 4));
}

__device__ __forceinline__ std::uint16_t bf16_of(float f) { return gemv_split::to_bf16(f); }

/// One thread per 8 values (K is a multiple of 16): out = bf16(q · s).
__global__ void dequantize_int8_kernel(const std::int8_t* __restrict__ q, const float* __restrict__ scale,
                                       std::int64_t N, std::int64_t K, std::uint16_t* __restrict__ out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K / 8) return;
  const std::int64_t n = i / (K / 8);
  const float s = scale[n];
  const uint2 c = reinterpret_cast<const uint2*>(q)[i];
  const unsigned cv[2] = {c.x ^ 0x80808080u, c.y ^ 0x80808080u};
  unsigned o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float a = (byte_plus_2_23(cv[j / 2], (2 * j) % 4) - (kTwo23 + 128.0f)) * s;
    const float b = (byte_plus_2_23(cv[j / 2], (2 * j) % 4 + 1) - (kTwo23 + 128.0f)) * s;
    o[j] = static_cast<unsigned>(bf16_of(a)) | (static_cast<unsigned>(bf16_of(b)) << 16);
  }
  reinterpret_cast<uint4*>(out)[i] = make_uint4(o[0], o[1], o[2], o[3]);
}

/// One thread per 8 values (a word of codes; K is a multiple of 32): out = bf16(s · (q − z)).
__global__ void dequantize_int4_kernel(const std::uint32_t* __restrict__ codes, const float2* __restrict__ scale_zero,
                                       std::int64_t G, std::int64_t N, std::int64_t K, std::uint16_t* __restrict__ out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K / 8) return;
  const std::int64_t n = i / (K / 8), k = (i % (K / 8)) * 8;
  const float2 p = scale_zero[n * (K / G) + k / G];
  const unsigned c = codes[i];
  unsigned o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float a = p.x * (static_cast<float>((c >> (8 * j)) & 15u) - p.y);
    const float b = p.x * (static_cast<float>((c >> (8 * j + 4)) & 15u) - p.y);
    o[j] = static_cast<unsigned>(bf16_of(a)) | (static_cast<unsigned>(bf16_of(b)) << 16);
  }
  reinterpret_cast<uint4*>(out)[i] = make_uint4(o[0], o[1], o[2], o[3]);
}

unsigned blocks_for(std::int64_t threads, int per_block) {
  return static_cast<unsigned>((threads + per_block - 1) / per_block);
}

}  // namespace

void quantize_rows_int8(const float* w, std::int64_t rows, std::int64_t K, std::int8_t* q, float* scale, void* stream) {
  using detail::cat;
  if (rows < 0 || rows > 0x7fffffffLL || K < 1)
    throw InvalidArgument(cat("cuda::quantize_rows_int8: rows = ", rows, ", K = ", K, "; needs 0 <= rows < 2^31, K >= 1"));
  if (rows == 0) return;
  if (w == nullptr || q == nullptr || scale == nullptr) throw InvalidArgument("cuda::quantize_rows_int8: null pointer");
  quantize_rows_int8_kernel<<<static_cast<unsigned>(rows), kQuantThreads, 0, static_cast<cudaStream_t>(stream)>>>(w, K, q,
                                                                                                                 scale);
  backend::cuda::check(cudaGetLastError(), "cuda::quantize_rows_int8: kernel launch");
}

void int8_gemv(const std::int8_t* q, const float* scale, const std::uint16_t* x, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y, void* stream) {
  check_gemv_args("cuda::int8_gemv", q, scale, x, M, N, K, y);
  if (K % 16 != 0) throw InvalidArgument(detail::cat("cuda::int8_gemv: K = ", K, " must be a multiple of 16"));
  if (N == 0) return;
  const std::int64_t chunks = K / 16, groups = (N + kRows - 1) / kRows;
  const int split = gemv_split::split_for(groups, chunks, kUnroll);
  const auto* w4 = reinterpret_cast<const uint4*>(q);
  const auto* x2 = reinterpret_cast<const XChunks<2>*>(x);
  const auto s = static_cast<cudaStream_t>(stream);
  with_m_split(M, split, [&]<int kM, int kSplit>() {
    gemv_split::launch(int8_gemv_kernel<kM, kSplit>, dim3(gemv_split::grid_for(groups, kSplit)), dim3(kWarps * 32), s,
                       w4, scale, x2, N, chunks, y);
  });
  backend::cuda::check(cudaGetLastError(), "cuda::int8_gemv: kernel launch");
}

void dequantize_int8_bf16(const std::int8_t* q, const float* scale, std::int64_t N, std::int64_t K, std::uint16_t* out,
                          void* stream) {
  using detail::cat;
  if (N < 0 || K < 1 || K % 16 != 0)
    throw InvalidArgument(cat("cuda::dequantize_int8_bf16: N = ", N, ", K = ", K, "; K must be a positive multiple of 16"));
  if (N == 0) return;
  if (q == nullptr || scale == nullptr || out == nullptr) throw InvalidArgument("cuda::dequantize_int8_bf16: null pointer");
  dequantize_int8_kernel<<<blocks_for(N * K / 8, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(q, scale, N, K, out);
  backend::cuda::check(cudaGetLastError(), "cuda::dequantize_int8_bf16: kernel launch");
}

void quantize_groups_int4(const float* w, std::int64_t N, std::int64_t K, std::int64_t G, std::uint8_t* codes,
                          float* scale_zero, void* stream) {
  using detail::cat;
  if (N < 0 || !int4_shape_supported(K, G))
    throw InvalidArgument(cat("cuda::quantize_groups_int4: N = ", N, ", K = ", K, ", G = ", G,
                              "; K and G must be multiples of 32, G dividing K"));
  if (N == 0) return;
  if (w == nullptr || codes == nullptr || scale_zero == nullptr) throw InvalidArgument("cuda::quantize_groups_int4: null pointer");
  quantize_groups_int4_kernel<<<blocks_for(N * (K / G), 128), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      w, N, K, G, codes, reinterpret_cast<float2*>(scale_zero));
  backend::cuda::check(cudaGetLastError(), "cuda::quantize_groups_int4: kernel launch");
}

void int4_gemv(const std::uint8_t* codes, const float* scale_zero, std::int64_t G, const std::uint16_t* x, int M,
               std::int64_t N, std::int64_t K, std::uint16_t* y, void* stream) {
  check_gemv_args("cuda::int4_gemv", codes, scale_zero, x, M, N, K, y);
  if (!int4_shape_supported(K, G))
    throw InvalidArgument(detail::cat("cuda::int4_gemv: K = ", K, ", G = ", G, "; K and G must be multiples of 32, G dividing K"));
  if (reinterpret_cast<std::uintptr_t>(scale_zero) % 8 != 0)
    throw InvalidArgument("cuda::int4_gemv: scale_zero must be 8-byte aligned");
  if (N == 0) return;
  const std::int64_t chunks = K / 32, groups = (N + kRows - 1) / kRows;
  const int split = gemv_split::split_for(groups, chunks, kUnroll);
  const auto* w4 = reinterpret_cast<const uint4*>(codes);
  const auto* sz = reinterpret_cast<const float2*>(scale_zero);
  const auto* x4 = reinterpret_cast<const XChunks<4>*>(x);
  const auto s = static_cast<cudaStream_t>(stream);
  with_m_split(M, split, [&]<int kM, int kSplit>() {
    gemv_split::launch(int4_gemv_kernel<kM, kSplit>, dim3(gemv_split::grid_for(groups, kSplit)), dim3(kWarps * 32), s,
                       w4, sz, K / G, G / 32, x4, N, chunks, y);
  });
  backend::cuda::check(cudaGetLastError(), "cuda::int4_gemv: kernel launch");
}

void dequantize_int4_bf16(const std::uint8_t* codes, const float* scale_zero, std::int64_t G, std::int64_t N,
                          std::int64_t K, std::uint16_t* out, void* stream) {
  using detail::cat;
  if (N < 0 || !int4_shape_supported(K, G))
    throw InvalidArgument(cat("cuda::dequantize_int4_bf16: N = ", N, ", K = ", K, ", G = ", G,
                              "; K and G must be multiples of 32, G dividing K"));
  if (N == 0) return;
  if (codes == nullptr || scale_zero == nullptr || out == nullptr)
    throw InvalidArgument("cuda::dequantize_int4_bf16: null pointer");
  dequantize_int4_kernel<<<blocks_for(N * K / 8, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const std::uint32_t*>(codes), reinterpret_cast<const float2*>(scale_zero), G, N, K, out);
  backend::cuda::check(cudaGetLastError(), "cuda::dequantize_int4_bf16: kernel launch");
}

}  // namespace infer::kernels::cuda
