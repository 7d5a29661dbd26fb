// FP8 (e4m3) linear layers: per-row quantization of activations and weights, and the batch-1 GEMV
// (include/infer/kernels/cuda/fp8.hpp says what each computes).
//
// quantize_rows_e4m3: one block per row; the block's max |x| (a shuffle reduction, then shared memory),
// s = max / 448, then every value divided by s (IEEE f32 division, __fdiv_rn) and converted with
// saturation to e4m3 (__nv_cvt_float_to_fp8): the arithmetic of the CPU's Fp8::quantize_row, so the codes
// and scales are bit for bit the CPU's for the same f32 inputs. Launched chained (chained_launch.cuh): at
// batch 1 it sits between two kernels of the decode step.
//
// fp8_gemv on the CUDA cores (INFER_FP8_GEMV=cuda_cores; the tensor-core kernel below is the default):
// bf16_gemv.cu's layout (gemv_split.cuh) on 16-byte chunks of 16 codes. A weight chunk and the
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
#include "chained_launch.cuh"
#include "gemv_split.cuh"
#include "mma_bf16.cuh"
#include "tc_gemv_ring.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kQuantThreads = 256;

__device__ __forceinline__ float load_f32(const std::uint16_t* p, std::int64_t i) {
  return __uint_as_float(static_cast<unsigned>(p[i]) << 16);
}
__device__ __forceinline__ float load_f32(const float* p, std::int64_t i) { return p[i]; }

/// max |x| over the block's threads (`amax` is each thread's own), the same value in every thread.
template <int kThreads>
__device__ __forceinline__ float block_amax(float amax) {
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = warp_max[0];
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  return amax;
}

/// x / s as an e4m3 code (0 for a zero row): Fp8::quantize_row's arithmetic.
__device__ __forceinline__ std::uint8_t e4m3_code(float x, float s) {
  return s > 0.0f ? static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(x, s), __NV_SATFINITE, __NV_E4M3))
                  : std::uint8_t{0};
}

// Any K, any alignment: one pass for the max, one to quantize, a value at a time.
template <class In>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(const In* __restrict__ x, std::int64_t K,
                                                                      std::uint8_t* __restrict__ q,
                                                                      float* __restrict__ scale) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const In* row = x + static_cast<std::int64_t>(blockIdx.x) * K;
  std::uint8_t* out = q + static_cast<std::int64_t>(blockIdx.x) * K;
  float amax = 0.0f;
  for (std::int64_t k = threadIdx.x; k < K; k += kQuantThreads) amax = fmaxf(amax, fabsf(load_f32(row, k)));
  const float s = __fdiv_rn(block_amax<kQuantThreads>(amax), kE4m3Max);
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
  for (std::int64_t k = threadIdx.x; k < K; k += kQuantThreads) out[k] = e4m3_code(load_f32(row, k), s);
}

// K a multiple of 8, rows 16-byte aligned: 8 values per 16-byte load (two for f32), the first kVecCache
// chunks of each thread kept in registers between the two passes (every row up to 16,384 values, Llama's
// widest activation being 14,336), 8 codes per store. At batch 1 a row is one block, so the block is wide:
// 2026-12-05 (ncu, H100) the scalar kernel took 5.2 us for a row of 4,096 or 14,336 bf16.
constexpr int kVecThreads = 512;
constexpr int kVecCache = 4;

__device__ __forceinline__ void load8(const std::uint16_t* row, std::int64_t c, float (&f)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(row + c * 8);
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void load8(const float* row, std::int64_t c, float (&f)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(row + c * 8), b = *reinterpret_cast<const float4*>(row + c * 8 + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

__device__ __forceinline__ void store8(std::uint8_t* out, std::int64_t c, const float (&f)[8], float s) {
  unsigned lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo |= static_cast<unsigned>(e4m3_code(f[i], s)) << (8 * i);
    hi |= static_cast<unsigned>(e4m3_code(f[4 + i], s)) << (8 * i);
  }
  *reinterpret_cast<uint2*>(out + c * 8) = make_uint2(lo, hi);
}

template <class In>
__global__ void __launch_bounds__(kVecThreads) quantize_rows_vec_kernel(const In* __restrict__ x, std::int64_t K,
                                                                        std::uint8_t* __restrict__ q,
                                                                        float* __restrict__ scale) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const In* row = x + static_cast<std::int64_t>(blockIdx.x) * K;
  std::uint8_t* out = q + static_cast<std::int64_t>(blockIdx.x) * K;
  const std::int64_t chunks = K / 8;
  const auto tid = static_cast<std::int64_t>(threadIdx.x);
  float cache[kVecCache][8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kVecCache; ++i)
    if (tid + i * kVecThreads < chunks) {
      load8(row, tid + i * kVecThreads, cache[i]);
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(cache[i][e]));
    }
  for (std::int64_t c = tid + kVecCache * kVecThreads; c < chunks; c += kVecThreads) {
    float f[8];
    load8(row, c, f);
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(f[e]));
  }
  const float s = __fdiv_rn(block_amax<kVecThreads>(amax), kE4m3Max);
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
#pragma unroll
  for (int i = 0; i < kVecCache; ++i)
    if (tid + i * kVecThreads < chunks) store8(out, tid + i * kVecThreads, cache[i], s);
  for (std::int64_t c = tid + kVecCache * kVecThreads; c < chunks; c += kVecThreads) {
    float f[8];
    load8(row, c, f);
    store8(out, c, f, s);
  }
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

/// y = x·Wᵀ scaled, for N rows of W.
template <int M, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) fp8_gemv_kernel(const uint4* __restrict__ w, const float* __restrict__ w_scale,
                                                               const uint4* __restrict__ x, const float* __restrict__ x_scale,
                                                               std::int64_t N, std::int64_t chunks,
                                                               std::uint16_t* __restrict__ y) {
  const int warp_in_block = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t group = static_cast<std::int64_t>(blockIdx.x) * (kWarps / kSplit) + warp_in_block / kSplit;
  const std::int64_t row0 = group * kRows;
  const bool active = row0 < N;  // an inactive group still reaches combine's barrier
  const uint4* wr[kRows];
  for (int r = 0; r < kRows; ++r) wr[r] = w + (row0 + r < N ? row0 + r : row0) * chunks;  // a missing row re-reads row0
  gemv_split::begin();

  float acc[kRows][M];
  gemv_split::stream_rows<M, kRows, kUnroll, kSplit>(wr, x, chunks, active, acc,
                                                     [](const uint4& a, const uint4& b) { return dot16(a, b); });
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

/// The CUDA-core kernel for M rows (N: rows of W).
void launch_cuda_cores(const uint4* w4, const float* w_scale, const uint4* x4, const float* x_scale, int M,
                       std::int64_t N, std::int64_t chunks, std::uint16_t* y, cudaStream_t s) {
  const std::int64_t groups = (N + kRows - 1) / kRows;
  const int split = gemv_split::split_for(groups, chunks, kUnroll);
  switch (M) {
    case 1: launch_m<1>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
    case 2: launch_m<2>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
    case 3: launch_m<3>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
    case 4: launch_m<4>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
    case 5: launch_m<5>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
    case 6: launch_m<6>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
    case 7: launch_m<7>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
    default: launch_m<8>(split, groups, w4, w_scale, x4, x_scale, N, chunks, y, s); break;
  }
}

// ---- fp8_gemv on the tensor cores, the weights streamed through shared memory ------------------------------
// mma.sync m16n8k32 (e4m3 x e4m3 -> f32): a warp multiplies 16 weight rows by the activation rows (M <= 8,
// the n8 extent; columns past M are zero) 64 codes of K at a time (a k-step: two mma), so the codes go into
// the tensor cores as they are, no instruction decodes them. The weights stream through each warp's ring
// in shared memory (tc_gemv_ring.cuh says why and how). A dot product does not care in which order its k
// run: A's logical columns 4t..4t+3 and 16+4t..16+4t+3 are lane (g, t)'s piece's words 0 and 1 (the second
// mma: words 2 and 3), and B's rows the same codes of x.
// The activation's codes (quantize_rows_e4m3's) ride in each slot after the weights, M rows' 256 codes.
// Measured on an H100 (bench/results/gpu-2026-12-06b, Llama-3-8B FP8, 512 + 128): at batch 1 equal to the
// CUDA-core kernel (266.7 against 266.4 tok/s, a816c2a), at batch 4 15% faster (941.4 against 819.7) and at
// batch 8 63% (1,799 against 1,105: the CUDA-core kernel's lanes re-read x and keep 2·M sums), 6f343e6.
// Measured and removed (173176b, H100, Llama-3-8B FP8 batch 1): the block quantizing x's bf16 rows itself
// (bit for bit quantize_rows_e4m3, a kernel less per projection) made the step slower, 217 tok/s against 265
// with the CUDA-core GEMV and a separate quantization: every block repeated the row's max and 4,096-14,336
// divisions before its first mma (gate_up 55 us under ncu, its 1,792 blocks in ~7 waves).
// Rounding: each product of two codes is exact, but Hopper's FP8 tensor cores add with ~14 significant bits
// (DeepSeek-V3's report, section 3.3.2, found ~2% errors at K = 4096 when a GEMM accumulates in them
// throughout). So each k-step's two mma start from zero, and their sum (64 products, ~2^-14 of their
// absolute sum off at most) is added to the f32 accumulator with an ordinary f32 add: the whole sum is then
// off by ~2^-14 of Σ|products| plus f32 rounding, below the bf16 output's 2^-9 of |y| where y is not
// much smaller than Σ|products|.
using tc_ring::kStages;

/// Bytes of one ring slot: the weights' 256 bytes of 16 rows, then x's M rows' 256 codes.
__host__ __device__ constexpr int fp8_slot_bytes(int M) { return tc_ring::kWeightBytes + M * tc_ring::kRowBytes; }

/// The kernel's shared memory: the rings, then the warps' partial sums.
constexpr std::size_t fp8_smem_bytes(int M) {
  return static_cast<std::size_t>(tc_ring::kWarps) * kStages * fp8_slot_bytes(M) + sizeof(float) * tc_ring::kPartFloats;
}

__device__ __forceinline__ void mma_e4m3(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// y[m][n] = bf16(s_x[m] · s_w[n] · Σ_k x_q[m][k] · w_q[n][k]) for the block's 16 rows.
__global__ void __launch_bounds__(tc_ring::kWarps * 32) fp8_gemv_tc_kernel(const std::uint8_t* __restrict__ w,
                                                                           const float* __restrict__ w_scale,
                                                                           const std::uint8_t* __restrict__ x,
                                                                           const float* __restrict__ x_scale, int M,
                                                                           std::int64_t N, std::int64_t K,
                                                                           std::uint16_t* __restrict__ y, int early) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int slot_bytes = fp8_slot_bytes(M);
  float* part = reinterpret_cast<float*>(smem + tc_ring::kWarps * kStages * slot_bytes);  // [warp][row][m]
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * tc_ring::kRows;
  const std::int64_t chunks = K / 16;
  const tc_ring::Slice sl = tc_ring::slice_of((chunks + tc_ring::kPieces - 1) / tc_ring::kPieces, warp);
  unsigned char* ring = smem + warp * kStages * slot_bytes;
  const tc_ring::WeightPieces pieces(w, row0, N, K, lane);
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  tc_ring::stream(ring, slot_bytes, pieces, x, K, M, chunks, sl, lane, early != 0, [&](const uint4& va, const uint4& vb, const uint4& vx) {
    // Each k-step's 64 products are summed from zero and then added to c in f32 (see the rounding note).
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_e4m3(p, va.x, vb.x, va.y, vb.y, vx.x, vx.y);
    mma_e4m3(p, va.z, vb.z, va.w, vb.w, vx.z, vx.w);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] += p[j];
  });
  tc_ring::write_outputs(part, c, warp, lane, row0, N, M, [&](std::int64_t row, int m, float sum) {
    y[m * N + row] = gemv_split::to_bf16(sum * (w_scale[row] * x_scale[m]));
  });
}

void launch_tensor_cores(const std::uint8_t* w, const float* w_scale, const std::uint8_t* x, const float* x_scale, int M,
                         std::int64_t N, std::int64_t K, std::uint16_t* y, cudaStream_t s) {
  tc_ring::launch<fp8_gemv_tc_kernel>(fp8_smem_bytes(kGemvMaxRows), fp8_smem_bytes(M), N, s,
                                      "cuda::fp8_gemv: raising the tensor-core kernel's shared memory", w, w_scale, x,
                                      x_scale, M, N, K, y, tc_ring::early_copies() ? 1 : 0);
}

tc_ring::PathSwitch<Fp8GemvPath> g_gemv_path;
Fp8GemvPath resolve_gemv_path() { return g_gemv_path.get("INFER_FP8_GEMV"); }

template <class In>
void quantize(const In* x, std::int64_t rows, std::int64_t K, std::uint8_t* q, float* scale, void* stream) {
  using infer::detail::cat;
  if (rows < 0 || K < 1 || rows > 0x7fffffffLL)
    throw InvalidArgument(cat("cuda::quantize_rows_e4m3: rows = ", rows, ", K = ", K, "; needs 0 <= rows < 2^31, K >= 1"));
  if (rows == 0) return;
  if (x == nullptr || q == nullptr || scale == nullptr) throw InvalidArgument("cuda::quantize_rows_e4m3: null pointer");
  const auto s = static_cast<cudaStream_t>(stream);
  const auto grid = static_cast<unsigned>(rows);
  const bool vec = K % 8 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0 && reinterpret_cast<std::uintptr_t>(q) % 8 == 0;
  if (vec) chained::launch(quantize_rows_vec_kernel<In>, grid, kVecThreads, 0, s, x, K, q, scale);
  else chained::launch(quantize_rows_kernel<In>, grid, kQuantThreads, 0, s, x, K, q, scale);
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

namespace {

void check_gemv_args(const char* who, const std::uint8_t* w_q, const float* w_scale, const std::uint8_t* x_q,
                     const float* x_scale, int M, std::int64_t N, std::int64_t K, const std::uint16_t* y_bf16) {
  using infer::detail::cat;
  if (M < 1 || M > kGemvMaxRows || N < 0 || K < 1)
    throw InvalidArgument(cat(who, ": M = ", M, ", N = ", N, ", K = ", K, "; needs 1 <= M <= ", kGemvMaxRows,
                              ", N >= 0, K >= 1"));
  if (!fp8_gemv_supports(w_q, x_q, K))
    throw InvalidArgument(cat(who, ": K = ", K, " must be a multiple of 16 and the codes 16-byte aligned"));
  if (w_scale == nullptr || x_scale == nullptr || y_bf16 == nullptr) throw InvalidArgument(cat(who, ": null scale or output"));
}

}  // namespace

void fp8_gemv(const std::uint8_t* w_q, const float* w_scale, const std::uint8_t* x_q, const float* x_scale, int M,
              std::int64_t N, std::int64_t K, std::uint16_t* y_bf16, void* stream) {
  using infer::detail::cat;
  check_gemv_args("cuda::fp8_gemv", w_q, w_scale, x_q, x_scale, M, N, K, y_bf16);
  if (N == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (resolve_gemv_path() == Fp8GemvPath::tensor_cores) {
    if ((N + tc_ring::kRows - 1) / tc_ring::kRows > 0x7fffffffLL) throw InvalidArgument(cat("cuda::fp8_gemv: N = ", N, " exceeds one grid"));
    launch_tensor_cores(w_q, w_scale, x_q, x_scale, M, N, K, y_bf16, s);
  } else {
    launch_cuda_cores(reinterpret_cast<const uint4*>(w_q), w_scale, reinterpret_cast<const uint4*>(x_q), x_scale, M, N,
                      K / 16, y_bf16, s);
  }
  backend::cuda::check(cudaGetLastError(), "cuda::fp8_gemv: kernel launch");
}

Fp8GemvPath set_fp8_gemv_path(Fp8GemvPath path) {
  return g_gemv_path.set(path);
}

}  // namespace infer::kernels::cuda
