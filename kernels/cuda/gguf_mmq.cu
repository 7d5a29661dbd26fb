// Matmul on GGUF blocks for small batches by int8 tensor-core MMA: y[M][N] = x[M][K] · W[N][K]ᵀ, M = 1..64.
//
// Why: at 9-32 rows (batched decode) the weights are still read once per step, so the step costs the
// file's bytes, but the GEMV's dp4a work grows with every row (it lost to dequantize + bf16 GEMM from 16
// rows on, 2026-12-06), and dequantize + GEMM writes and reads the whole weight in bf16 (~3.5x a Q4_K
// file's bytes, every step). On the H100 this kernel beat dequantize + GEMM by 10-55% up to 32 rows on
// Llama-3-8B's layers and lost from 48-64 rows, where its per-segment f32 scaling (4 instructions per
// output and segment) is the bound: the decoder uses it up to kMmqPreferredRows (gemm.hpp). Here each weight block is read once from memory and decoded once into int8
// codes in shared memory, and all rows meet it in `mma.sync` m16n8k32 (s8 · s8 → s32): the integer sums of
// a 32-value segment are exact, and floats enter once per segment and output, as in the GEMV:
//   y[m][n] += d_x[m,seg] · a[n,seg] · Σ (q − off)·x_q + d_x[m,seg] · Σ x_q · b[n,seg]
// (quant/gguf_dot.hpp; offsets are subtracted from the codes while decoding, so only formats with a min
// need the activation sums; Q6_K's two scales per segment take two m16n8k16 MMAs).
// Layout of the work:
// - x is quantized first, by its own small kernel, to int8 codes and a Q8Scale per 32 values in the
//   workspace (quantize_q8_chunks: the CPU reference's codes bit for bit), rows padded with zeros to a
//   multiple of 16 (MMA tiles);
// - a CTA of 4 warps owns 64 weight rows and a range of K (split-K where the rows alone would leave SMs
//   idle: the partial sums go to the workspace and a third kernel adds them), walked in chunks of 256 values
//   (one K-quant block, eight 32-value blocks) through a 3-stage ring of `cp.async` copies: the chunk's
//   weight bytes (16-byte copies covering each row's unaligned bytes, as in the GEMV), x's codes and scales;
// - per chunk, the CTA decodes the 64 × 8 segments (quant::decode_segment, one thread a segment) into codes
//   at a 272-byte row stride, so the lanes of a fragment load hit 32 different banks, then each warp
//   multiplies its 16 rows (two n8 tiles) by all of x's m16 tiles and scales the integer tiles into f32
//   accumulators;
// - the accumulators are written once (bf16, or f32 for logits) with a row stride, so stacked parts land in
//   their columns.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/quant/gguf_dot.hpp"
#include "chained_launch.cuh"
#include "mma_bf16.cuh"
#include "q8_activations.cuh"

namespace infer::kernels::cuda {
namespace {

// 4 warps and 64 rows a CTA keep its shared memory small enough (75 KB on Q4_K at ≤ 16 rows) for 3 CTAs an
// SM: one CTA's decode and barriers overlap another's copies and MMAs. With 8 warps and 128 rows (one CTA an
// SM) the H100 read Q4_K at ~500 GB/s at any M ≤ 16, latency-bound (2026-12-06, bench "GGUF matmul paths").
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = kWarps * 16;  // weight rows per CTA: 16 per warp, two n8 MMA tiles
constexpr int kChunk = 256;          // K values per pipeline step
constexpr int kChunkSegs = kChunk / quant::kQ8Block;
constexpr int kStages = 3;
constexpr int kCodeStride = kChunk + 16;  // bytes per row of int8 codes in shared memory (68 words)
constexpr int kCodeWords = kCodeStride / 4;
constexpr int kMaxSplits = 16;
constexpr std::int64_t kMaxSmem = 227 * 1024;
constexpr std::int64_t kSmemPerSm = 228 * 1024;  // sm_90: each resident CTA also reserves 1 KiB
constexpr int kMaxCtasPerSm = 4;                  // ≤ 128 registers a thread: 4 CTAs of 128 threads fill 64 Ki

/// A chunk's weight bytes per row, and their place in a stage.
template <DType T>
struct ChunkRow {
  static constexpr int elems = static_cast<int>(info(T).block_elems);
  static constexpr int bytes = static_cast<int>(info(T).block_bytes);
  static constexpr int raw = kChunk / elems * bytes;   // a full chunk of this row
  static constexpr int slots = (raw + 15 + 15) / 16;   // 16-byte copies covering it from any 2-aligned start
  static constexpr int stride = slots * 16 + 16;       // + 16: load_le_words reads up to 4 bytes past the end
};

constexpr std::int64_t stage_bytes(int raw_stride, int mp) {
  return static_cast<std::int64_t>(kTileN) * raw_stride + static_cast<std::int64_t>(mp) * kCodeStride +
         static_cast<std::int64_t>(mp) * kChunkSegs * static_cast<std::int64_t>(sizeof(quant::Q8Scale));
}
/// The decoded codes and their (scale, min) or (scale, scale) pairs, after the ring.
constexpr std::int64_t decoded_bytes() {
  return static_cast<std::int64_t>(kTileN) * kCodeStride + static_cast<std::int64_t>(kTileN) * kChunkSegs * 8;
}
template <DType T>
constexpr std::int64_t smem_bytes(int mp) {
  return kStages * stage_bytes(ChunkRow<T>::stride, mp) + decoded_bytes();
}
static_assert(smem_bytes<DType::q8_0>(64) <= kMaxSmem, "the widest block type at 64 rows fits shared memory");
static_assert(smem_bytes<DType::q6_k>(64) <= kMaxSmem && smem_bytes<DType::q5_1>(64) <= kMaxSmem);

using detail::cp_async_commit;
using detail::cp_async_wait;
__device__ __forceinline__ void cp_async8(void* smem_dst, const void* gmem_src) {
  detail::cp_async_8(detail::smem_u32(smem_dst), gmem_src);
}
/// 16 bytes global -> shared, asynchronously (mma_bf16.cuh's copy, never zero-filled here).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  detail::cp_async_16(detail::smem_u32(smem_dst), gmem_src, true);
}

/// c = a (16×32, row) · b (32×8, col) in int32, the fragments of PTX's m16n8k32 .s8 layout.
__device__ __forceinline__ void mma_k32(int (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                       std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
/// c = a (16×16) · b (16×8) in int32 (m16n8k16 .s8): one half of a segment, for Q6_K's per-16 scales.
__device__ __forceinline__ void mma_k16(int (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t b0) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
               : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
               : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

__global__ void __launch_bounds__(kThreads) quantize_kernel(const std::uint16_t* __restrict__ x, std::int64_t valid,
                                                            std::int64_t chunks, std::int8_t* xq, quant::Q8Scale* xs) {
  chained::wait_for_previous_kernel();
  quantize_q8_chunks(x, valid, chunks, xq, xs, static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x,
                     static_cast<std::int64_t>(gridDim.x) * kThreads);
}

template <DType T, int MT>
__global__ void __launch_bounds__(kThreads, 1) mmq_kernel(const unsigned char* __restrict__ w, std::int64_t N,
                                                           std::int64_t K, const std::int8_t* __restrict__ xq,
                                                           const quant::Q8Scale* __restrict__ xs, int M,
                                                           int chunks_per_split, void* __restrict__ y, std::int64_t ldy,
                                                           int y_f32, float* __restrict__ partial) {
  chained::wait_for_previous_kernel();
  using R = ChunkRow<T>;
  using F = quant::DotFormat<T>;
  constexpr int MP = MT * 16;
  constexpr int kStage = static_cast<int>(stage_bytes(R::stride, MP));
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* codes = smem + kStages * kStage;  // [kTileN][kCodeStride] int8
  auto* wsc = reinterpret_cast<float2*>(codes + kTileN * kCodeStride);  // [kTileN][8]: (a, b) or Q6_K's (a0, a1)
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kTileN;
  const std::int64_t chunks = (K + kChunk - 1) / kChunk;
  const std::int64_t c_begin = static_cast<std::int64_t>(blockIdx.y) * chunks_per_split;
  const int nchunks = static_cast<int>(std::min<std::int64_t>(chunks - c_begin, chunks_per_split));
  const std::int64_t row_bytes = K / R::elems * R::bytes;
  const std::int64_t xblocks = K / quant::kQ8Block;
  const auto wbeg = reinterpret_cast<std::uintptr_t>(w);
  const std::uintptr_t wend = wbeg + static_cast<std::uintptr_t>(N * row_bytes);

  auto chunk_k0 = [&](int i) { return (c_begin + i) * kChunk; };
  auto chunk_segs = [&](std::int64_t k0) {
    return static_cast<int>(std::min<std::int64_t>(kChunkSegs, (K - k0) / quant::kQ8Block));
  };
  auto row_start = [&](int r, std::int64_t k0) {  // rows past N repeat the last (their outputs are not written)
    const std::int64_t n = n0 + r < N ? n0 + r : N - 1;
    return wbeg + static_cast<std::uintptr_t>(n * row_bytes + k0 / R::elems * R::bytes);
  };
  // A thread's 16-byte weight copies are the same (row, piece) pairs in every chunk: their rows' addresses are
  // worked out once.
  constexpr int kIssue = (kTileN * R::slots + kThreads - 1) / kThreads;
  std::uintptr_t row_base[kIssue];
#pragma unroll
  for (int j = 0; j < kIssue; ++j) {
    const int r = (tid + j * kThreads) / R::slots;
    const std::int64_t n = n0 + r < N ? n0 + r : N - 1;  // rows past N repeat the last (their outputs are not written)
    row_base[j] = wbeg + static_cast<std::uintptr_t>(n * row_bytes);
  }
  auto issue = [&](int i) {  // chunk i of this CTA into stage i % kStages
    if (i < nchunks) {
      const std::int64_t k0 = chunk_k0(i);
      const int segs = chunk_segs(k0);
      const auto raw = static_cast<unsigned>(segs * quant::kQ8Block / R::elems * R::bytes);
      const auto offset = static_cast<std::uintptr_t>(k0 / R::elems * R::bytes);
      unsigned char* st = smem + (i % kStages) * kStage;
#pragma unroll
      for (int j = 0; j < kIssue; ++j) {
        const int idx = tid + j * kThreads;
        if (kTileN * R::slots % kThreads != 0 && idx >= kTileN * R::slots) break;
        const int r = idx / R::slots, c = idx % R::slots;
        const std::uintptr_t start = row_base[j] + offset, end = start + raw;
        const std::uintptr_t src = (start & ~std::uintptr_t{15}) + 16u * static_cast<unsigned>(c);
        if (src >= end) continue;
        unsigned char* dst = st + r * R::stride + 16 * c;
        if (src >= wbeg && src + 16 <= wend) {
          cp_async16(dst, reinterpret_cast<const void*>(src));
        } else {  // a copy reaching outside the tensor: only the chunk's own bytes, 2 at a time
          for (int o = 0; o < 16; o += 2) {
            const std::uintptr_t p = src + static_cast<unsigned>(o);
            if (p >= start && p < end)
              *reinterpret_cast<std::uint16_t*>(dst + o) = *reinterpret_cast<const std::uint16_t*>(p);
          }
        }
      }
      unsigned char* xc = st + kTileN * R::stride;
      for (int idx = tid; idx < MP * 16; idx += kThreads) {  // x's codes: up to 16 copies of 16 bytes a row
        const int m = idx >> 4, c = idx & 15;
        if (c < 2 * segs) cp_async16(xc + m * kCodeStride + 16 * c, xq + m * K + k0 + 16 * c);
      }
      auto* xsc = reinterpret_cast<quant::Q8Scale*>(xc + MP * kCodeStride);
      for (int idx = tid; idx < MP * kChunkSegs; idx += kThreads) {  // and their scales
        const int m = idx / kChunkSegs, s = idx % kChunkSegs;
        if (s < segs) cp_async8(xsc + m * kChunkSegs + s, xs + m * xblocks + k0 / quant::kQ8Block + s);
      }
    }
    cp_async_commit();  // empty groups too, so wait_group counts stay uniform
  };

  float acc[MT][2][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  const int g = lane >> 2, t = lane & 3;  // the MMA fragments' group (row) and thread-in-group (column pair)
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int i = 0; i < nchunks; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // chunk i has landed for all; all are done with chunk i − 1's stage and codes
    issue(i + kStages - 1);
    const unsigned char* st = smem + (i % kStages) * kStage;
    const std::int64_t k0 = chunk_k0(i);
    const int segs = chunk_segs(k0);

    for (int idx = tid; idx < kTileN * kChunkSegs; idx += kThreads) {  // decode: one segment a thread
      const int r = idx / kChunkSegs, s = idx % kChunkSegs;
      if (s >= segs) continue;
      const int j = s * quant::kQ8Block / R::elems, sb = s % F::segs;  // block of the chunk, segment of the block
      const unsigned char* p = st + r * R::stride + (row_start(r, k0) & 15u) + j * R::bytes;
      quant::SegCodes sc;
      quant::decode_segment<T>(p, sb, sc);
      if constexpr (F::off != 0) {
#pragma unroll
        for (int q = 0; q < 8; ++q) sc.q[q] = __vsub4(sc.q[q], static_cast<unsigned>(F::off) * 0x01010101u);
      }
      auto* dst = reinterpret_cast<uint4*>(codes + r * kCodeStride + s * quant::kQ8Block);
      dst[0] = make_uint4(sc.q[0], sc.q[1], sc.q[2], sc.q[3]);
      dst[1] = make_uint4(sc.q[4], sc.q[5], sc.q[6], sc.q[7]);
      wsc[r * kChunkSegs + s] = make_float2(sc.a0, F::two_scales ? sc.a1 : sc.b);
    }
    __syncthreads();

    const auto* wc = reinterpret_cast<const std::uint32_t*>(codes);
    const auto* xc = reinterpret_cast<const std::uint32_t*>(st + kTileN * R::stride);
    const auto* xsc = reinterpret_cast<const quant::Q8Scale*>(st + kTileN * R::stride + MP * kCodeStride);
    for (int s = 0; s < segs; ++s) {
      std::uint32_t b[2][2];
      float2 wf[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int row = warp * 16 + nt * 8 + g, col = warp * 16 + nt * 8 + 2 * t;
        b[nt][0] = wc[row * kCodeWords + s * 8 + t];
        b[nt][1] = wc[row * kCodeWords + s * 8 + 4 + t];
        wf[nt][0] = wsc[col * kChunkSegs + s];
        wf[nt][1] = wsc[(col + 1) * kChunkSegs + s];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r0 = mt * 16 + g, r1 = r0 + 8;
        const std::uint32_t a0 = xc[r0 * kCodeWords + s * 8 + t], a1 = xc[r1 * kCodeWords + s * 8 + t];
        const std::uint32_t a2 = xc[r0 * kCodeWords + s * 8 + 4 + t], a3 = xc[r1 * kCodeWords + s * 8 + 4 + t];
        const quant::Q8Scale q0 = xsc[r0 * kChunkSegs + s], q1 = xsc[r1 * kChunkSegs + s];
        const float d[2] = {q0.d, q1.d};
        float dsum[2] = {0.0f, 0.0f};
        if constexpr (F::has_min) {
          dsum[0] = q0.d * static_cast<float>(q0.sum_lo + q0.sum_hi);
          dsum[1] = q1.d * static_cast<float>(q1.sum_lo + q1.sum_hi);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          if constexpr (F::two_scales) {
            int lo[4], hi[4];
            mma_k16(lo, a0, a1, b[nt][0]);
            mma_k16(hi, a2, a3, b[nt][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 ws = wf[nt][e & 1];
              acc[mt][nt][e] += d[e >> 1] * (ws.x * static_cast<float>(lo[e]) + ws.y * static_cast<float>(hi[e]));
            }
          } else {
            int c[4];
            mma_k32(c, a0, a1, a2, a3, b[nt][0], b[nt][1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 ws = wf[nt][e & 1];
              acc[mt][nt][e] = fmaf(d[e >> 1] * ws.x, static_cast<float>(c[e]), acc[mt][nt][e]);
              if constexpr (F::has_min) acc[mt][nt][e] = fmaf(dsum[e >> 1], ws.y, acc[mt][nt][e]);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = mt * 16 + g + (e >> 1) * 8;
        const std::int64_t n = n0 + warp * 16 + nt * 8 + 2 * t + (e & 1);
        if (m >= M || n >= N) continue;
        const float v = acc[mt][nt][e];
        if (partial != nullptr) partial[(static_cast<std::int64_t>(blockIdx.y) * M + m) * N + n] = v;
        else if (y_f32) static_cast<float*>(y)[m * ldy + n] = v;
        else static_cast<std::uint16_t*>(y)[m * ldy + n] = f32_to_bf16(v);
      }
}

/// y[m][n] = Σ over the splits of their partial sums, in split order.
__global__ void __launch_bounds__(kThreads) reduce_kernel(const float* __restrict__ partial, int splits, int M,
                                                          std::int64_t N, void* __restrict__ y, std::int64_t ldy,
                                                          int y_f32) {
  chained::wait_for_previous_kernel();
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const std::int64_t total = static_cast<std::int64_t>(M) * N;
  if (i >= total) return;
  float v = 0.0f;
  for (int s = 0; s < splits; ++s) v += partial[s * total + i];
  const std::int64_t m = i / N, n = i % N;
  if (y_f32) static_cast<float*>(y)[m * ldy + n] = v;
  else static_cast<std::uint16_t*>(y)[m * ldy + n] = f32_to_bf16(v);
}

void check(cudaError_t e, DType type, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(infer::detail::cat("cuda::gguf_mmq(", name(type), "): ", what, " failed: ", cudaGetErrorName(e), ": ",
                                  cudaGetErrorString(e)));
}

int sm_count(DType type) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), type, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), type, "cudaDeviceGetAttribute");
  return sms;
}

/// CTAs an SM holds at once, by their shared memory.
template <DType T>
int ctas_per_sm_of(int mt) {
  const std::int64_t smem = smem_bytes<T>(mt * 16) + 1024;
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(kMaxCtasPerSm, kSmemPerSm / smem)));
}
int ctas_per_sm(DType type, int mt) {
  switch (type) {
    case DType::q8_0: return ctas_per_sm_of<DType::q8_0>(mt);
    case DType::q4_0: return ctas_per_sm_of<DType::q4_0>(mt);
    case DType::q4_1: return ctas_per_sm_of<DType::q4_1>(mt);
    case DType::q5_0: return ctas_per_sm_of<DType::q5_0>(mt);
    case DType::q5_1: return ctas_per_sm_of<DType::q5_1>(mt);
    case DType::q4_k: return ctas_per_sm_of<DType::q4_k>(mt);
    case DType::q5_k: return ctas_per_sm_of<DType::q5_k>(mt);
    case DType::q6_k: return ctas_per_sm_of<DType::q6_k>(mt);
    case DType::iq4_nl: return ctas_per_sm_of<DType::iq4_nl>(mt);
    default: return ctas_per_sm_of<DType::iq4_xs>(mt);
  }
}

/// How K is split: the split count that finishes soonest when the SMs' CTA slots run the grid in waves, a
/// split's chunks cost their weight bytes, and the partial sums cost their f32 traffic.
struct Plan {
  int splits = 1;
  int chunks_per_split = 1;
};
Plan plan(DType type, int rows, std::int64_t N, std::int64_t K, int sms) {
  sms *= ctas_per_sm(type, (rows + 15) / 16);  // CTA slots
  const std::int64_t tiles = (N + kTileN - 1) / kTileN;
  const std::int64_t chunks = (K + kChunk - 1) / kChunk;
  const double chunk_bytes = static_cast<double>(kTileN) * static_cast<double>(*row_bytes(type, kChunk));
  Plan best;
  double best_cost = 0;
  for (int s = 1; s <= kMaxSplits && s <= chunks; ++s) {
    const auto per = static_cast<int>((chunks + s - 1) / s);
    const auto used = static_cast<int>((chunks + per - 1) / per);
    if (used != s) continue;  // the same split as a smaller s
    const std::int64_t waves = (tiles * s + sms - 1) / sms;
    const double partial = s > 1 ? 2.0 * s * rows * static_cast<double>(N) * 4 / sms : 0.0;
    const double cost = static_cast<double>(waves) * per * chunk_bytes + partial;
    if (s == 1 || cost < 0.97 * best_cost) {  // more splits only for a clear gain
      best = {s, per};
      best_cost = cost;
    }
  }
  return best;
}

constexpr std::size_t align_up(std::size_t v) { return (v + 255) / 256 * 256; }

/// The workspace: x's codes [MP][K], its scales [MP][K/32], the partial sums [splits][M][N].
struct Workspace {
  std::size_t codes, scales, partial;
  [[nodiscard]] std::size_t total() const { return codes + scales + partial; }
};
Workspace workspace(int M, std::int64_t N, std::int64_t K, const Plan& p) {
  const auto mp = static_cast<std::size_t>((M + 15) / 16 * 16);
  const auto k = static_cast<std::size_t>(K);
  return {align_up(mp * k), align_up(mp * (k / quant::kQ8Block) * sizeof(quant::Q8Scale)),
          p.splits > 1 ? align_up(static_cast<std::size_t>(p.splits) * static_cast<std::size_t>(M) *
                                  static_cast<std::size_t>(N) * 4)
                       : 0};
}

template <DType T, int MT>
void launch_mmq(const void* w, std::int64_t N, std::int64_t K, const std::int8_t* xq, const quant::Q8Scale* xs, int M,
                const Plan& p, void* y, std::int64_t ldy, bool y_f32, float* partial, cudaStream_t stream) {
  auto kernel = mmq_kernel<T, MT>;
  const auto smem = static_cast<std::size_t>(smem_bytes<T>(MT * 16));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), T,
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  const dim3 grid(static_cast<unsigned>((N + kTileN - 1) / kTileN), static_cast<unsigned>(p.splits));
  chained::launch(kernel, grid, dim3(kThreads), smem, stream, static_cast<const unsigned char*>(w), N, K, xq, xs, M,
                  p.chunks_per_split, y, ldy, y_f32 ? 1 : 0, p.splits > 1 ? partial : nullptr);
  check(cudaGetLastError(), T, "kernel launch");
}

template <DType T>
void launch_type(int MT, const void* w, std::int64_t N, std::int64_t K, const std::int8_t* xq,
                 const quant::Q8Scale* xs, int M, const Plan& p, void* y, std::int64_t ldy, bool y_f32, float* partial,
                 cudaStream_t s) {
  switch (MT) {
    case 1: launch_mmq<T, 1>(w, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case 2: launch_mmq<T, 2>(w, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case 3: launch_mmq<T, 3>(w, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    default: launch_mmq<T, 4>(w, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
  }
}

void run(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K, void* y,
         std::int64_t ldy, bool y_f32, void* workspace_ptr, std::size_t workspace_bytes, void* stream) {
  const DTypeInfo ti = info(type);
  if (!quant::dot_supports(type))
    throw UnsupportedError(infer::detail::cat("cuda::gguf_mmq: weight type ", ti.name,
                                       " is not supported (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, iq4_nl, "
                                       "iq4_xs are); use gguf_gemm"));
  if (M < 1 || M > kMmqMaxRows)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_mmq(", ti.name, "): M = ", M, " rows; it takes 1..", kMmqMaxRows,
                                      " (use gguf_gemm for larger batches)"));
  if (N < 0 || K < 1 || K % ti.block_elems != 0)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_mmq(", ti.name, "): bad shape N=", N, " K=", K,
                                      " (K must be a positive multiple of the block size ", ti.block_elems, ")"));
  if (ldy == 0) ldy = N;
  if (ldy < N) throw InvalidArgument(infer::detail::cat("cuda::gguf_mmq(", ti.name, "): output row stride ", ldy, " < N=", N));
  if (N == 0) return;
  if (w_blocks == nullptr || x_bf16 == nullptr || y == nullptr || workspace_ptr == nullptr)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_mmq(", ti.name, "): null ",
                                      w_blocks == nullptr ? "weight"
                                      : x_bf16 == nullptr ? "x"
                                      : y == nullptr      ? "y"
                                                          : "workspace",
                                      " pointer"));
  if (reinterpret_cast<std::uintptr_t>(x_bf16) % 16 != 0 || reinterpret_cast<std::uintptr_t>(workspace_ptr) % 16 != 0)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_mmq(", ti.name, "): x and the workspace must be 16-byte aligned"));
  if (reinterpret_cast<std::uintptr_t>(w_blocks) % 2 != 0 || reinterpret_cast<std::uintptr_t>(y) % (y_f32 ? 4 : 2) != 0)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_mmq(", ti.name, "): weight and y pointers must be aligned to 2 (",
                                      "y: to its element) bytes"));
  const Plan p = plan(type, M, N, K, sm_count(type));
  const Workspace ws = workspace(M, N, K, p);
  if (workspace_bytes < ws.total())
    throw InvalidArgument(infer::detail::cat("cuda::gguf_mmq(", ti.name, "): ", workspace_bytes, " bytes of workspace for M=",
                                      M, " N=", N, " K=", K, "; it needs ", ws.total()));
  auto* base = static_cast<unsigned char*>(workspace_ptr);
  auto* xq = reinterpret_cast<std::int8_t*>(base);
  auto* xs = reinterpret_cast<quant::Q8Scale*>(base + ws.codes);
  auto* partial = reinterpret_cast<float*>(base + ws.codes + ws.scales);
  auto s = static_cast<cudaStream_t>(stream);

  const int MT = (M + 15) / 16;
  const std::int64_t chunks8 = static_cast<std::int64_t>(MT) * 16 * K / 8, valid8 = static_cast<std::int64_t>(M) * K / 8;
  const auto qgrid = static_cast<unsigned>(std::min<std::int64_t>((chunks8 + kThreads - 1) / kThreads, 1024));
  chained::launch(quantize_kernel, dim3(qgrid), dim3(kThreads), 0, s, x_bf16, valid8, chunks8, xq, xs);
  check(cudaGetLastError(), type, "quantize launch");
  switch (type) {
    case DType::q8_0: launch_type<DType::q8_0>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::q4_0: launch_type<DType::q4_0>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::q4_1: launch_type<DType::q4_1>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::q5_0: launch_type<DType::q5_0>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::q5_1: launch_type<DType::q5_1>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::q4_k: launch_type<DType::q4_k>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::q5_k: launch_type<DType::q5_k>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::q6_k: launch_type<DType::q6_k>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::iq4_nl: launch_type<DType::iq4_nl>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    case DType::iq4_xs: launch_type<DType::iq4_xs>(MT, w_blocks, N, K, xq, xs, M, p, y, ldy, y_f32, partial, s); break;
    default: break;
  }
  if (p.splits > 1) {
    const std::int64_t total = static_cast<std::int64_t>(M) * N;
    chained::launch(reduce_kernel, dim3(static_cast<unsigned>((total + kThreads - 1) / kThreads)), dim3(kThreads), 0, s,
                    static_cast<const float*>(partial), p.splits, M, N, y, ldy, y_f32 ? 1 : 0);
    check(cudaGetLastError(), type, "reduce launch");
  }
}

}  // namespace

std::size_t gguf_mmq_workspace_bytes(DType type, std::int64_t N, std::int64_t K, int max_rows) {
  if (!quant::dot_supports(type) || N < 1 || K < 1 || K % info(type).block_elems != 0) return 0;
  int device = 0, sms = 0;  // sizing asks no error of the device: an H100/H200's count where it answers none
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms < 1) {
    (void)cudaGetLastError();
    sms = 132;
  }
  max_rows = std::min(max_rows, kMmqMaxRows);
  // gguf_linear and the matmuls' scratch checks ask this of every GGUF linear of every eager step; the answer
  // (up to 64 plans of 16 splits each) depends only on these, so it is worked out once per weight shape.
  using Key = std::tuple<int, int, std::int64_t, std::int64_t, int>;
  static std::mutex mutex;
  static std::map<Key, std::size_t> known;
  const Key key{sms, static_cast<int>(type), N, K, max_rows};
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  std::size_t most = 0;
  for (int M = 1; M <= max_rows; ++M) most = std::max(most, workspace(M, N, K, plan(type, M, N, K, sms)).total());
  known.emplace(key, most);
  return most;
}

void gguf_mmq(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
              std::uint16_t* y_bf16, void* workspace, std::size_t workspace_bytes, void* stream, std::int64_t ldy) {
  run(type, w_blocks, x_bf16, M, N, K, y_bf16, ldy, false, workspace, workspace_bytes, stream);
}

void gguf_mmq(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
              float* y_f32, void* workspace, std::size_t workspace_bytes, void* stream, std::int64_t ldy) {
  run(type, w_blocks, x_bf16, M, N, K, y_f32, ldy, true, workspace, workspace_bytes, stream);
}

}  // namespace infer::kernels::cuda
