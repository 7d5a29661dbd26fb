// Weight-only integer linear layers (INT8 per row, INT4 in groups): quantization at load, the decode GEMVs
// and the dequantization for the prefill GEMM (include/infer/kernels/cuda/int_linear.hpp says what each
// computes).
//
// The INT8 GEMV takes bf16_gemv.cu's layout (gemv_split.cuh): a row group of kSplit warps streams 16-byte
// chunks of two weight rows, kUnroll chunks in flight per lane; a chunk of 16 codes meets 2 chunks of bf16
// activations (gemv_split::XChunks). Codes become f32 exactly through the exponent trick: a byte b placed in
// the low bits of 2^23's pattern is the float 2^23 + b, and subtracting 2^23 + 128 leaves the code (stored
// offset by 128 after an XOR). One PRMT and one FADD per code, where a conversion instruction (I2F) would run
// at a quarter of the rate. Sums are f32; s is applied once per output.
// The INT4 GEMV runs on the tensor cores (its section below says why and how).
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
#include "mma_bf16.cuh"

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
      wr, x, chunks, active, acc, [](const uint4& a, const XChunks<2>& b) { return dot_int8(a, b); });
  if (!gemv_split::combine<kSplit, kRows, M>(acc, active)) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r >= N) break;
    const float s = scale[row0 + r];
#pragma unroll
    for (int m = 0; m < M; ++m) y[m * N + row0 + r] = gemv_split::to_bf16(acc[r][m] * s);
  }
}

// ---- the INT4 GEMV, on the tensor cores ----------------------------------------------------------------
// On the CUDA cores a 4-bit code costs ~5 instructions (extract, convert, multiply-add, and Σ x for the zero),
// which made the GEMV compute-bound at ~1.4 TB/s on the H100 (309 tok/s at Llama-3-8B batch 1, c7747c3). Here
// a warp decodes pairs of codes straight to bf16 weights, bf16(q·s + m) with m = −s·z (two bf16x2 instructions
// after a shift and a mask: the codes' nibble order, int4_nibble, puts codes 2k and 2k+1 of a word in the two
// halves of (word >> 4k)), and mma.sync m16n8k16 multiplies them by the activations: 16 weight rows against
// the M ≤ 8 activation rows (the n8 extent; columns past M are zero). Because the group's scale is applied
// in the decode, one f32 accumulator serves every group. Each weight is rounded to bf16 once, as the
// dequantization for the GEMM does (dequantize_int4_bf16 decodes with the same instructions, so the two agree
// bit for bit), and the products are summed in f32.
// Layout: lane (g, t) of a warp reads 16 bytes (32 codes) of weight rows g and g + 8 at chunk 4·step + t, the
// two rows' (s, m) pairs of that chunk's group, and 64 bytes of activation row g at the same inputs. A dot
// product does not care in which order its inputs come, so pair k of word j of the chunk is the mma's logical
// columns 2t..2t+1 (a0, a1) or 2t+8..2t+9 (a2, a3), and x's word 4j + k, the matching inputs, its b0 or b1.
// The block's kI4Warps warps take interleaved steps of the same 16 rows, kI4Unroll in flight per lane; their
// partial sums meet in shared memory in a fixed order.
constexpr int kI4Warps = 8;
constexpr int kI4Unroll = 2;
constexpr int kI4Rows = 16;

__device__ __forceinline__ std::uint32_t bf16x2_sub(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r;
  asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ std::uint32_t bf16x2_fma(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  std::uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

/// Codes 2k and 2k+1 of a word of eight (int4_nibble's order) as two bf16 weights bf16(q·s + m), given s and m
/// in both halves of s2 and m2: 0x4300 | q is the bf16 128 + q, exact, and subtracting 128 leaves q.
__device__ __forceinline__ std::uint32_t int4_pair(std::uint32_t word, int k, std::uint32_t s2, std::uint32_t m2) {
  const std::uint32_t biased = ((word >> (4 * k)) & 0x000f000fu) | 0x43004300u;
  return bf16x2_fma(bf16x2_sub(biased, 0x43004300u), s2, m2);
}
/// A group's packed (bf16 s, bf16 m) as s in both halves and m in both halves.
__device__ __forceinline__ std::uint32_t scale_pair(std::uint32_t sm) { return __byte_perm(sm, 0, 0x1010); }
__device__ __forceinline__ std::uint32_t min_pair(std::uint32_t sm) { return __byte_perm(sm, 0, 0x3232); }

__global__ void __launch_bounds__(kI4Warps * 32) int4_gemv_tc_kernel(const uint4* __restrict__ w,
                                                                     const std::uint32_t* __restrict__ scale_min,
                                                                     std::int64_t groups, std::int64_t chunks_per_group,
                                                                     const uint4* __restrict__ x, int M, std::int64_t N,
                                                                     std::int64_t chunks, std::uint16_t* __restrict__ y) {
  gemv_split::begin();
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kI4Rows;
  // Rows past N re-read row N - 1 (their sums are not written); x rows past M are never read.
  const std::int64_t ra = min(row0 + g, N - 1), rb = min(row0 + g + 8, N - 1);
  const uint4* wa = w + ra * chunks;
  const uint4* wb = w + rb * chunks;
  const std::uint32_t* sma = scale_min + ra * groups;
  const std::uint32_t* smb = scale_min + rb * groups;
  const bool has_x = g < M;
  const uint4* xr = x + (has_x ? g : 0) * chunks * 4;
  const std::int64_t steps = (chunks + 3) / 4;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (std::int64_t s0 = warp; s0 < steps; s0 += kI4Warps * kI4Unroll) {
    uint4 va[kI4Unroll], vb[kI4Unroll], xv[kI4Unroll][4];
    std::uint32_t pa[kI4Unroll], pb[kI4Unroll];
#pragma unroll
    for (int u = 0; u < kI4Unroll; ++u) {
      const std::int64_t ch = (s0 + u * kI4Warps) * 4 + t;
      const bool ok = ch < chunks;  // past the end: codes and x zero (the weight is then m, times x = 0)
      va[u] = ok ? __ldcs(wa + ch) : zero;
      vb[u] = ok ? __ldcs(wb + ch) : zero;
      pa[u] = ok ? __ldg(sma + ch / chunks_per_group) : 0u;
      pb[u] = ok ? __ldg(smb + ch / chunks_per_group) : 0u;
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[u][i] = ok && has_x ? __ldg(xr + ch * 4 + i) : zero;
    }
#pragma unroll
    for (int u = 0; u < kI4Unroll; ++u) {
      const std::uint32_t sa = scale_pair(pa[u]), ma = min_pair(pa[u]), sb = scale_pair(pb[u]), mb = min_pair(pb[u]);
      const std::uint32_t a4[4] = {va[u].x, va[u].y, va[u].z, va[u].w}, b4[4] = {vb[u].x, vb[u].y, vb[u].z, vb[u].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint32_t xw[4] = {xv[u][j].x, xv[u][j].y, xv[u][j].z, xv[u][j].w};  // x words 4j .. 4j + 3
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const std::uint32_t a[4] = {int4_pair(a4[j], 2 * h, sa, ma), int4_pair(b4[j], 2 * h, sb, mb),
                                      int4_pair(a4[j], 2 * h + 1, sa, ma), int4_pair(b4[j], 2 * h + 1, sb, mb)};
          detail::mma_m16n8k16_bf16(c, a, xw[2 * h], xw[2 * h + 1]);
        }
      }
    }
  }
  // c: rows g (c0, c1) and g + 8 (c2, c3), activation rows 2t and 2t + 1.
  __shared__ float part[kI4Warps][kI4Rows][8];
  part[warp][g][2 * t] = c[0];
  part[warp][g][2 * t + 1] = c[1];
  part[warp][g + 8][2 * t] = c[2];
  part[warp][g + 8][2 * t + 1] = c[3];
  __syncthreads();
  const int i = static_cast<int>(threadIdx.x);
  if (i >= kI4Rows * M) return;
  const int r = i / M, m = i % M;
  const std::int64_t row = row0 + r;
  if (row >= N) return;
  float sum = part[0][r][m];
#pragma unroll
  for (int k = 1; k < kI4Warps; ++k) sum += part[k][r][m];
  y[m * N + row] = gemv_split::to_bf16(sum);
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
  using infer::detail::cat;
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

/// std::clamp's choice (v when neither bound is crossed, so a -0 stays -0 as on the CPU).
__device__ __forceinline__ float clamp_as_std(float v, float lo, float hi) { return v < lo ? lo : hi < v ? hi : v; }

/// One thread per (row, group), as Int4::quantize: the group's range widened to hold 0, s and z, the codes
/// packed eight to a word in int4_nibble's order, and the group's (bf16 s, bf16 m = −s·z) pair.
__global__ void quantize_groups_int4_kernel(const float* __restrict__ w, std::int64_t N, std::int64_t K, std::int64_t G,
                                            std::uint32_t* __restrict__ codes, std::uint32_t* __restrict__ scale_min) {
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
  const float z = s > 0.0f ? clamp_as_std(rintf(__fdiv_rn(-lo, s)), 0.0f, 15.0f) : 0.0f;
  scale_min[i] = int4_scale_min_bits(gemv_split::to_bf16(s), gemv_split::to_bf16(__fmul_rn(-s, z)));
  std::uint32_t* out = codes + (n * K + g * G) / 8;
  for (std::int64_t k0 = 0; k0 < G; k0 += 8) {
    std::uint32_t word = 0;
    for (int c = 0; c < 8; ++c) {
      const float q = s > 0.0f ? clamp_as_std(__fadd_rn(rintf(__fdiv_rn(v[k0 + c], s)), z), 0.0f, 15.0f) : 0.0f;
      word |= static_cast<std::uint32_t>(q) << (4 * int4_nibble(c));
    }
    out[k0 / 8] = word;
  }
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

/// One thread per word of codes (8 values; K is a multiple of 32): out = bf16(q·s + m), decoded as the GEMV
/// decodes them (int4_pair), in input order.
__global__ void dequantize_int4_kernel(const std::uint32_t* __restrict__ codes, const std::uint32_t* __restrict__ scale_min,
                                       std::int64_t G, std::int64_t N, std::int64_t K, std::uint16_t* __restrict__ out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * K / 8) return;
  const std::int64_t n = i / (K / 8), k = (i % (K / 8)) * 8;
  const std::uint32_t sm = scale_min[n * (K / G) + k / G];
  const std::uint32_t word = codes[i];
  uint4 o;  // pair k of int4_pair holds codes 2k and 2k + 1: values in order
  o.x = int4_pair(word, 0, scale_pair(sm), min_pair(sm));
  o.y = int4_pair(word, 1, scale_pair(sm), min_pair(sm));
  o.z = int4_pair(word, 2, scale_pair(sm), min_pair(sm));
  o.w = int4_pair(word, 3, scale_pair(sm), min_pair(sm));
  reinterpret_cast<uint4*>(out)[i] = o;
}

unsigned blocks_for(std::int64_t threads, int per_block) {
  return static_cast<unsigned>((threads + per_block - 1) / per_block);
}

}  // namespace

void quantize_rows_int8(const float* w, std::int64_t rows, std::int64_t K, std::int8_t* q, float* scale, void* stream) {
  using infer::detail::cat;
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
  if (K % 16 != 0) throw InvalidArgument(infer::detail::cat("cuda::int8_gemv: K = ", K, " must be a multiple of 16"));
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
  using infer::detail::cat;
  if (N < 0 || K < 1 || K % 16 != 0)
    throw InvalidArgument(cat("cuda::dequantize_int8_bf16: N = ", N, ", K = ", K, "; K must be a positive multiple of 16"));
  if (N == 0) return;
  if (q == nullptr || scale == nullptr || out == nullptr) throw InvalidArgument("cuda::dequantize_int8_bf16: null pointer");
  dequantize_int8_kernel<<<blocks_for(N * K / 8, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(q, scale, N, K, out);
  backend::cuda::check(cudaGetLastError(), "cuda::dequantize_int8_bf16: kernel launch");
}

void quantize_groups_int4(const float* w, std::int64_t N, std::int64_t K, std::int64_t G, std::uint8_t* codes,
                          std::uint32_t* scale_min, void* stream) {
  using infer::detail::cat;
  if (N < 0 || !int4_shape_supported(K, G))
    throw InvalidArgument(cat("cuda::quantize_groups_int4: N = ", N, ", K = ", K, ", G = ", G,
                              "; K and G must be multiples of 32, G dividing K"));
  if (N == 0) return;
  if (w == nullptr || codes == nullptr || scale_min == nullptr) throw InvalidArgument("cuda::quantize_groups_int4: null pointer");
  if (reinterpret_cast<std::uintptr_t>(codes) % 4 != 0) throw InvalidArgument("cuda::quantize_groups_int4: codes must be 4-byte aligned");
  quantize_groups_int4_kernel<<<blocks_for(N * (K / G), 128), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      w, N, K, G, reinterpret_cast<std::uint32_t*>(codes), scale_min);
  backend::cuda::check(cudaGetLastError(), "cuda::quantize_groups_int4: kernel launch");
}

void int4_gemv(const std::uint8_t* codes, const std::uint32_t* scale_min, std::int64_t G, const std::uint16_t* x, int M,
               std::int64_t N, std::int64_t K, std::uint16_t* y, void* stream) {
  check_gemv_args("cuda::int4_gemv", codes, scale_min, x, M, N, K, y);
  if (!int4_shape_supported(K, G))
    throw InvalidArgument(infer::detail::cat("cuda::int4_gemv: K = ", K, ", G = ", G, "; K and G must be multiples of 32, G dividing K"));
  if (N == 0) return;
  if ((N + kI4Rows - 1) / kI4Rows > 0x7fffffffLL) throw InvalidArgument(infer::detail::cat("cuda::int4_gemv: N = ", N, " exceeds one grid"));
  gemv_split::launch(int4_gemv_tc_kernel, dim3(static_cast<unsigned>((N + kI4Rows - 1) / kI4Rows)), dim3(kI4Warps * 32),
                     static_cast<cudaStream_t>(stream), reinterpret_cast<const uint4*>(codes), scale_min, K / G, G / 32,
                     reinterpret_cast<const uint4*>(x), M, N, K / 32, y);
  backend::cuda::check(cudaGetLastError(), "cuda::int4_gemv: kernel launch");
}

void dequantize_int4_bf16(const std::uint8_t* codes, const std::uint32_t* scale_min, std::int64_t G, std::int64_t N,
                          std::int64_t K, std::uint16_t* out, void* stream) {
  using infer::detail::cat;
  if (N < 0 || !int4_shape_supported(K, G))
    throw InvalidArgument(cat("cuda::dequantize_int4_bf16: N = ", N, ", K = ", K, ", G = ", G,
                              "; K and G must be multiples of 32, G dividing K"));
  if (N == 0) return;
  if (codes == nullptr || scale_min == nullptr || out == nullptr)
    throw InvalidArgument("cuda::dequantize_int4_bf16: null pointer");
  dequantize_int4_kernel<<<blocks_for(N * K / 8, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const std::uint32_t*>(codes), scale_min, G, N, K, out);
  backend::cuda::check(cudaGetLastError(), "cuda::dequantize_int4_bf16: kernel launch");
}

}  // namespace infer::kernels::cuda
