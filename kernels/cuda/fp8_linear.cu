// FP8 (e4m3) linear layers: per-row quantization of activations and weights, and the batch-1 GEMV
// (include/infer/kernels/cuda/fp8.hpp says what each computes).
//
// quantize_rows_e4m3: one block per row; the block's max |x| (a shuffle reduction, then shared memory),
// s = max / 448, then every value divided by s (IEEE f32 division, __fdiv_rn) and converted by
// cvt.rn.satfinite.e4m3x2.f32 (__nv_cvt_float2_to_fp8x2): the arithmetic of the CPU's Fp8::quantize_row, so
// the codes and scales are bit for bit the CPU's for the same f32 inputs.
//
// fp8_gemv: bf16_gemv.cu's layout (gemv_split.cuh) on 16-byte chunks of 16 codes. A weight chunk and the
// matching activation chunk are decoded pairwise to f16 (e4m3 → f16 is exact: every e4m3 value, subnormals
// included, is a normal f16) and then to f32, where each product is exact (4 significant bits each) and
// the sum accumulates with FMA. The two scales multiply the reduced sum once.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/fp8.hpp"
#include "infer/kernels/cuda/fp8.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "gemv_split.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kQuantThreads = 256;

__device__ __forceinline__ float load_f32(const std::uint16_t* p, std::int64_t i) {
  return __uint_as_float(static_cast<unsigned>(p[i]) << 16);
}
__device__ __forceinline__ float load_f32(const float* p, std::int64_t i) { return p[i]; }

template <class In>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(const In* __restrict__ x, std::int64_t K,
                                                                      std::uint8_t* __restrict__ q,
                                                                      float* __restrict__ scale) {
  const In* row = x + static_cast<std::int64_t>(blockIdx.x) * K;
  std::uint8_t* out = q + static_cast<std::int64_t>(blockIdx.x) * K;
  float amax = 0.0f;
  for (std::int64_t k = threadIdx.x; k < K; k += kQuantThreads) amax = fmaxf(amax, fabsf(load_f32(row, k)));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float warp_max[kQuantThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int w = 1; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = __fdiv_rn(amax, kE4m3Max);
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  for (std::int64_t k = threadIdx.x; k < K; k += kQuantThreads)
    out[k] = s > 0.0f ? static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(load_f32(row, k), s), __NV_SATFINITE,
                                                                        __NV_E4M3))
                      : std::uint8_t{0};
}

constexpr int kRows = 2;    // weight rows per row group
constexpr int kUnroll = 4;  // 16-byte chunks per row in flight per lane
using gemv_split::kWarps;

/// Two e4m3 codes (the low and high byte of `v`) as f32, exactly.
__device__ __forceinline__ float2 e4m3x2_to_f32(unsigned short v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(__half2(h));
}

/// Σ of the 16 products of a weight chunk and an activation chunk of codes.
__device__ __forceinline__ float dot16(const uint4& w, const uint4& x) {
  const unsigned wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 w0 = e4m3x2_to_f32(static_cast<unsigned short>(wv[i] & 0xffffu));
    const float2 w1 = e4m3x2_to_f32(static_cast<unsigned short>(wv[i] >> 16));
    const float2 x0 = e4m3x2_to_f32(static_cast<unsigned short>(xv[i] & 0xffffu));
    const float2 x1 = e4m3x2_to_f32(static_cast<unsigned short>(xv[i] >> 16));
    s = fmaf(w0.x, x0.x, s);
    s = fmaf(w0.y, x0.y, s);
    s = fmaf(w1.x, x1.x, s);
    s = fmaf(w1.y, x1.y, s);
  }
  return s;
}

template <int M, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) fp8_gemv_kernel(const uint4* __restrict__ w, const float* __restrict__ w_scale,
                                                               const uint4* __restrict__ x, const float* __restrict__ x_scale,
                                                               std::int64_t N, std::int64_t chunks,
                                                               std::uint16_t* __restrict__ y, bool late) {
  gemv_split::begin(late);
  const int warp_in_block = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t group = static_cast<std::int64_t>(blockIdx.x) * (kWarps / kSplit) + warp_in_block / kSplit;
  const std::int64_t row0 = group * kRows;
  const bool active = row0 < N;  // an inactive group still reaches combine's barrier
  const uint4* wr[kRows];
  for (int r = 0; r < kRows; ++r) wr[r] = w + (row0 + r < N ? row0 + r : row0) * chunks;  // a missing row re-reads row0

  float acc[kRows][M];
  gemv_split::stream_rows<M, kRows, kUnroll, kSplit>(wr, x, chunks, active, acc,
                                                     [](const uint4& a, const uint4& b) { return dot16(a, b); });
  gemv_split::streamed(late);
  if (!gemv_split::combine<kSplit, kRows, M>(acc, active)) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r >= N) break;
    const float sw = w_scale[row0 + r];
#pragma unroll
    for (int m = 0; m < M; ++m) y[m * N + row0 + r] = gemv_split::to_bf16(acc[r][m] * (sw * x_scale[m]));
  }
}

template <int M>
void launch_m(int split, std::int64_t groups, const uint4* w, const float* sw, const uint4* x, const float* sx,
              std::int64_t N, std::int64_t chunks, std::uint16_t* y, cudaStream_t s) {
  const dim3 block(kWarps * 32);
  switch (split) {
    case 1: gemv_split::launch(fp8_gemv_kernel<M, 1>, gemv_split::grid_for(groups, 1), block, s, w, sw, x, sx, N, chunks, y); break;
    case 2: gemv_split::launch(fp8_gemv_kernel<M, 2>, gemv_split::grid_for(groups, 2), block, s, w, sw, x, sx, N, chunks, y); break;
    default: gemv_split::launch(fp8_gemv_kernel<M, 4>, gemv_split::grid_for(groups, 4), block, s, w, sw, x, sx, N, chunks, y); break;
  }
}

template <class In>
void quantize(const In* x, std::int64_t rows, std::int64_t K, std::uint8_t* q, float* scale, void* stream) {
  using detail::cat;
  if (rows < 0 || K < 1 || rows > 0x7fffffffLL)
    throw InvalidArgument(cat("cuda::quantize_rows_e4m3: rows = ", rows, ", K = ", K, "; needs 0 <= rows < 2^31, K >= 1"));
  if (rows == 0) return;
  if (x == nullptr || q == nullptr || scale == nullptr) throw InvalidArgument("cuda::quantize_rows_e4m3: null pointer");
  quantize_rows_kernel<In><<<static_cast<unsigned>(rows), kQuantThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, K, q,
                                                                                                              scale);
  backend::cuda::check(cudaGetLastError(), "cuda::quantize_rows_e4m3: kernel launch");
}

}  // namespace

void quantize_rows_e4m3(const std::uint16_t* x_bf16, std::int64_t rows, std::int64_t K, std::uint8_t* q, float* scale,
                        void* stream) {
  quantize(x_bf16, rows, K, q, scale, stream);
}

void quantize_rows_e4m3(const float* x_f32, std::int64_t rows, std::int64_t K, std::uint8_t* q, float* scale,
                        void* stream) {
  quantize(x_f32, rows, K, q, scale, stream);
}

void fp8_gemv(const std::uint8_t* w_q, const float* w_scale, const std::uint8_t* x_q, const float* x_scale, int M,
              std::int64_t N, std::int64_t K, std::uint16_t* y_bf16, void* stream) {
  using detail::cat;
  if (M < 1 || M > kGemvMaxRows || N < 0 || K < 1)
    throw InvalidArgument(cat("cuda::fp8_gemv: M = ", M, ", N = ", N, ", K = ", K, "; needs 1 <= M <= ", kGemvMaxRows,
                              ", N >= 0, K >= 1"));
  if (!fp8_gemv_supports(w_q, x_q, K))
    throw InvalidArgument(cat("cuda::fp8_gemv: K = ", K, " must be a multiple of 16 and the codes 16-byte aligned"));
  if (w_scale == nullptr || x_scale == nullptr || y_bf16 == nullptr)
    throw InvalidArgument("cuda::fp8_gemv: null scale or output");
  if (N == 0) return;
  const std::int64_t groups = (N + kRows - 1) / kRows, chunks = K / 16;
  const int split = gemv_split::split_for(groups, chunks, kUnroll);
  const auto* w4 = reinterpret_cast<const uint4*>(w_q);
  const auto* x4 = reinterpret_cast<const uint4*>(x_q);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (M) {
    case 1: launch_m<1>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
    case 2: launch_m<2>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
    case 3: launch_m<3>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
    case 4: launch_m<4>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
    case 5: launch_m<5>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
    case 6: launch_m<6>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
    case 7: launch_m<7>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
    default: launch_m<8>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y_bf16, s); break;
  }
  backend::cuda::check(cudaGetLastError(), "cuda::fp8_gemv: kernel launch");
}

}  // namespace infer::kernels::cuda
