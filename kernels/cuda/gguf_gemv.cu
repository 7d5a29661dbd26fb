// GEMV on GGUF blocks for small batches: y[M][N] = x[M][K] · W[N][K]ᵀ, M = 1..8, by integer dot products.
//
// Batch-1 decode reads every weight once per token, so this kernel is about decoding block bytes as fast as
// memory delivers them. The float version widened each code to f32 and multiplied it by a bf16 activation
// (~6 instructions a value) and read a third of the copy rate on Q4_K. Here x is quantized to int8 in blocks
// of 32 (quant/gguf_dot.hpp: one f32 scale and the code sums per block) and each 32-value segment of a
// weight block meets it in eight dp4a. Layout of the work:
// - a CTA of 8 warps owns a contiguous, balanced range of output rows (the grid fills the GPU once, so x is
//   quantized once per CTA and not once per row), and its warps share the steps of those rows: a long row is
//   spread over the warps, short rows go one a warp (see gemv_kernel). Owning whole rows a warp, a 4,096-row
//   layer on 132 SMs × 24 warps left 71% of the warps idle for its last row;
// - the CTA first starts its weight copies, then quantizes x (M×K bf16) into shared memory: int8 codes and
//   a Q8Scale per 32 values, 4 lanes per block with 16-byte loads; the codes equal quantize_q8_block's, the
//   CPU reference, bit for bit (the same IEEE division and round-to-nearest-even);
// - a warp streams its rows' blocks through a 3-stage ring of shared buffers with 16-byte `cp.async`
//   copies (two steps of ~2 KiB in flight per warp while it decodes the third). A step is a whole number
//   of blocks, so no block straddles two buffers; block sizes (18-210 bytes) do not keep 16-byte alignment,
//   so a step copies the aligned 16-byte chunks covering it, and the rare chunk reaching outside the tensor
//   is copied 2 bytes at a time instead;
// - a lane decodes one segment (quant::decode_segment) once for all M rows, and adds
//   quant::segment_dot per row: integer sums, floats once per segment;
// - a warp's partial sums are reduced across its lanes with shuffles, the warps' in shared memory in a fixed
//   order, f32 throughout, rounded once at the end (bf16, or f32 for logits), written with a row stride so
//   stacked parts land in their columns.
// Unit walks (quant/gguf_units.hpp; `Walk` below). By instruction count the segment walk was issue-bound, not
// memory-bound: ~3 instructions a value with its byte loads of each segment's header, unaligned word loads and
// x reads that conflict two ways in shared memory (ncu at a12616a, H100: 1.2-1.5 TB/s on Llama-3-8B's Q4_K
// layers). Where a type's blocks allow it and the tensor's rows are 16-byte aligned (a file's always are), a
// lane takes a 64-value unit whose bytes it reads with few loads, and x is stored in pieces that eight lanes on
// neighbouring units read as 128 contiguous bytes:
// - Q4_K, Q5_K (`pairs`): sub-blocks 2p and 2p + 1, the 32 bytes of nibbles they share (two 16-byte loads) and
//   the 16-byte header once for 64 values;
// - Q6_K (`q6_runs`; 210-byte blocks, 2-byte aligned in a step): the same 16 positions of each of a half's four
//   runs, which share 16 bytes of high bits and two 16-byte spans of nibbles;
// - Q8_0 (`q8_pairs`): two neighbouring blocks, 68 bytes at a 4-byte aligned address (17 word loads).
// Measured on an H100 at 51aeb8a (M = 1, bench/results/gpu-2026-12-06f): Q4_K 33-46% faster than the segment
// walk (gate_up 2.46 TB/s), Q6_K 7-15%, Q8_0 2-4%. Aligned tensors also copy a step's chunks without the
// general copy's edge checks. With `swiglu` a warp walks gate row i then up row i and writes silu(g)·u itself.
// With a ResidualNorm for x (ops.hpp), the CTA computes the decoder's pre-norm itself before quantizing: the
// rows' sums of squares (a fixed reduction order, so every CTA gets the same bits), then x = bf16(r·inv·weight)
// straight into the quantization; each CTA also writes its share of the chunks of r and x (chunk i of a row by
// CTA i mod grid). A batch-1 step of SmolLM2-135M runs ~300 kernels of 1-3 us, and a chained kernel costs ~2 us
// in a graph (paths bench), so the 61 norm kernels folded this way were ~15% of its step.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/quant/gguf_dot.hpp"
#include "infer/quant/gguf_units.hpp"
#include "chained_launch.cuh"
#include "mma_bf16.cuh"
#include "q8_activations.cuh"
#include "residual_norm.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
/// The shared memory a CTA may have on sm_90 (227 KiB).
constexpr std::int64_t kMaxSmem = 227 * 1024;

/// Blocks per pipeline step, chosen so that a step is about 2 KiB.
constexpr int step_blocks(DType t) {
  switch (t) {
    case DType::q8_0: return 64;    // 2176 bytes
    case DType::q4_0:
    case DType::iq4_nl: return 128;  // 2304
    case DType::q4_1: return 128;    // 2560
    case DType::q5_0: return 96;     // 2112
    case DType::q5_1: return 96;     // 2304
    case DType::q4_k: return 16;     // 2304
    case DType::q5_k: return 12;     // 2112
    case DType::q6_k: return 8;      // 1680 (Llama's K = 4096 is two steps)
    case DType::iq4_xs: return 16;   // 2176
    default: return 0;
  }
}

/// Bytes of one pipeline buffer: a step's blocks, up to 15 bytes of alignment slack in front, the last
/// chunk rounded up to 16, and 16 more so load_le_words may read past the end.
constexpr std::int64_t buf_bytes(DType t) {
  return (step_blocks(t) * info(t).block_bytes + 15 + 15) / 16 * 16 + 16;
}
/// How a warp spreads a step's blocks over its lanes (the file comment says why there are three).
enum class Walk {
  segments,  ///< a lane a 32-value segment (quant::decode_segment), any type, x in the plain layout
  pairs,     ///< Q4_K, Q5_K: a lane two sub-blocks sharing their nibbles (64 values), x in pieces
  q6_runs,   ///< Q6_K: a lane 16 positions of a 128-value half across its four 32-value runs (64 values)
  q8_pairs,  ///< Q8_0: a lane two neighbouring blocks (64 values, 68 bytes, 4-byte aligned), x as for pairs
};
/// The walk type t takes where its weights are 16-byte aligned.
constexpr Walk aligned_walk(DType t) {
  switch (t) {
    case DType::q4_k:
    case DType::q5_k: return Walk::pairs;
    case DType::q6_k: return Walk::q6_runs;
    case DType::q8_0: return Walk::q8_pairs;
    default: return Walk::segments;
  }
}
using quant::kUnitVals;

/// Shared memory of x for M rows: the codes, then 8 bytes of scale per 32 values (per 16 for Q6_K, whose
/// run walk keeps a scale per 16-value piece), rounded up to 16.
constexpr std::int64_t x_smem_bytes(DType t, int M, std::int64_t K) {
  const std::int64_t scales = K / quant::kQ8Block * (t == DType::q6_k ? 2 : 1);
  return (M * K + M * scales * static_cast<std::int64_t>(sizeof(quant::Q8Scale)) + 15) / 16 * 16;
}
/// Shared memory of the warps' partial sums, per CTA: a slot per (row, step residue, x row), f32. A chunk of a
/// CTA's rows is as many as fit (the kernel's `chunk_rows`); 1 KiB keeps three CTAs an SM at K = 14,336 and
/// one row of x, 2 KiB above four rows (where there are one or two CTAs an SM anyway).
constexpr std::int64_t red_bytes(int M) { return M <= 4 ? 1024 : 2048; }
constexpr std::int64_t smem_bytes(DType t, int M, std::int64_t K) {
  return x_smem_bytes(t, M, K) + red_bytes(M) + kWarps * kStages * buf_bytes(t);
}
/// x for the unit walks, M rows of K values: the codes in pieces (quant/gguf_units.hpp: piece r of unit u of row
/// m at m·K + (r·U + u)·16, U = K / 64), then the pieces' scales: pairs (kQ6 false) one per 32-value sub-block,
/// sub-block h of unit u at [m·K/32 + h·U + u] with the block's code sum; Q6_K runs one per piece, piece q of
/// unit u at [m·K/16 + q·U + u] with the piece's code sum (the −32 offset needs it).
template <bool kQ6>
struct UnitXStore {
  std::int8_t* xq;
  quant::PieceScale* xs;
  std::uint32_t chunks_per_row, blocks_per_row, units_per_row;  // K/8, K/32, K/64
  __device__ __forceinline__ static quant::PiecePos place(std::uint32_t v) {
    return kQ6 ? quant::q6_run_piece_of(v) : quant::pair_piece_of(v);
  }
  __device__ __forceinline__ void codes(std::int64_t c, uint2 v) const {
    const auto cc = static_cast<std::uint32_t>(c);
    const std::uint32_t m = cc / chunks_per_row, i = cc - m * chunks_per_row;  // values 8i.. of row m
    const quant::PiecePos pos = place(8 * i);
    *reinterpret_cast<uint2*>(xq + m * 8 * chunks_per_row + (pos.piece * units_per_row + pos.unit) * 16 + pos.at) = v;
  }
  __device__ __forceinline__ void scale(std::int64_t b, quant::Q8Scale v) const {
    const auto bb = static_cast<std::uint32_t>(b);
    const std::uint32_t m = bb / blocks_per_row, i = bb - m * blocks_per_row;  // values 32i.. of row m
    if constexpr (kQ6) {
      const quant::PiecePos p0 = place(32 * i), p1 = place(32 * i + 16);
      quant::PieceScale* row = xs + m * 2 * blocks_per_row;
      row[p0.piece * units_per_row + p0.unit] = {v.d, v.d * static_cast<float>(v.sum_lo)};
      row[p1.piece * units_per_row + p1.unit] = {v.d, v.d * static_cast<float>(v.sum_hi)};
    } else {
      const quant::PiecePos p = place(32 * i);  // piece 0 or 2: sub-block p.piece / 2
      xs[m * blocks_per_row + (p.piece / 2) * units_per_row + p.unit] = {
          v.d, v.d * static_cast<float>(static_cast<int>(v.sum_lo) + v.sum_hi)};
    }
  }
};

/// Pieces q·U + u (q = 0..3) of a unit, from shared memory, as the unit dots take them.
__device__ __forceinline__ void load_pieces(const uint4* xr, std::int64_t U, std::uint32_t (&xp)[4][4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 v = xr[q * U];
    xp[q][0] = v.x;
    xp[q][1] = v.y;
    xp[q][2] = v.z;
    xp[q][3] = v.w;
  }
}

using detail::cp_async_commit;
using detail::cp_async_wait;
/// 16 bytes global -> shared, asynchronously (mma_bf16.cuh's copy, never zero-filled here).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  detail::cp_async_16(detail::smem_u32(smem_dst), gmem_src, true);
}

/// The quantization's source where x is a ResidualNorm (quantize_q8_chunks_from): chunk c of x is
/// bf16(r · inv[row] · weight) (residual_norm.cuh's normed_chunk_of, which also stores the CTA's share of r and x).
struct NormedChunks {
  ResidualNorm n;
  const float* inv;  ///< per row of x: rsqrt(mean(r²) + eps), in shared memory
  std::uint32_t chunks_per_row, writer, writers;
  struct Raw {
    float r[8];
  };
  /// One: the pre-norm runs where M·K <= kGemvNormMaxValues (4,096), at most two chunks a thread, where fetching
  /// ahead did not pay (x_batch()).
  static constexpr int kMaxBatch = 1;
  __device__ __forceinline__ Raw fetch(std::int64_t c) const {
    Raw raw;
    prenorm::residual_chunk(n, c, raw.r);
    return raw;
  }
  __device__ __forceinline__ void expand(const Raw& raw, std::int64_t c, float (&v)[8]) const {
    const std::uint32_t m = static_cast<std::uint32_t>(c) / chunks_per_row;
    const uint4 x = prenorm::normed_chunk_of(n, c, raw.r, chunks_per_row, inv[m], writer, writers);
    const std::uint32_t xw[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[2 * e] = __uint_as_float(xw[e] << 16);
      v[2 * e + 1] = __uint_as_float(xw[e] & 0xffff0000u);
    }
  }
};

/// CTAs an SM should hold, for the register budget: 3 up to 4 rows of x (Llama's K = 4096 then takes ~75 KiB of
/// shared memory a CTA), 2 above (where shared memory allows no more anyway). Without the bound the unit walks
/// took ~100 registers from 3 rows up, two CTAs an SM.
constexpr int kMinBlocks(int rows) { return rows <= 4 ? 3 : 2; }

/// kWalk: segments, or aligned_walk(T) where the weights are 16-byte aligned. `aligned`: the tensor, its rows
/// and its steps are 16-byte aligned, so a step's copy needs no edge checks (always so in the unit walks).
/// `swiglu`: W is a stacked [gate; up] of N rows and y gets N / 2 columns, silu(x·gate_i) · (x·up_i), written
/// by the CTA that computed both (the decode step's SwiGLU kernel, and the round trip of gate and up through
/// memory, disappear). `early_copies`: see early_copies(). `norm` (its weight non-null): x is that ResidualNorm,
/// computed here (the file comment), and the `x` argument is not read.
///
/// Work: CTA c owns the outputs [c·outs/grid, (c+1)·outs/grid), a balanced contiguous range (grid = the CTAs
/// the GPU holds at once, so there is one range per CTA and no second wave). Its items are the steps of those
/// rows in order (output, then gate/up half, then step t), and warp w takes items w, w + 8, w + 16, ...: a long
/// row is spread over the warps, short rows go one a warp. A warp sums its items of one row in registers and
/// leaves the sum in a slot of `red` picked by the item's t mod 8, so the CTA adds a row's slots in a fixed
/// order (results do not depend on timing: replays are bit-identical). Rows go in chunks as many as `red` holds,
/// each closed by a barrier, the output written, and a second barrier before `red` is reused.
template <DType T, int MM, Walk kWalk>
__global__ void __launch_bounds__(kThreads, kMinBlocks(MM)) gemv_kernel(const unsigned char* __restrict__ w,
                                                        const std::uint16_t* __restrict__ x, std::int64_t N,
                                                        std::int64_t K, void* __restrict__ y, std::int64_t ldy,
                                                        int y_f32, int aligned, int swiglu, int early_copies,
                                                        int x_batch, ResidualNorm norm) {
  static_assert(kWalk == Walk::segments || kWalk == aligned_walk(T), "a unit walk of another type");
  if (!early_copies) chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  constexpr int kBytes = static_cast<int>(info(T).block_bytes);
  constexpr int kElems = static_cast<int>(info(T).block_elems);
  constexpr int kSegs = quant::DotFormat<T>::segs;
  constexpr int kStep = step_blocks(T);
  constexpr int kBuf = static_cast<int>(buf_bytes(T));
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  auto* xq = reinterpret_cast<std::int8_t*>(smem);
  auto* xs = reinterpret_cast<quant::Q8Scale*>(smem + MM * K);  // segment walk
  auto* xp = reinterpret_cast<quant::PieceScale*>(smem + MM * K);  // unit walks
  auto* red = reinterpret_cast<float*>(smem + x_smem_bytes(T, MM, K));
  const std::int64_t xblocks = K / quant::kQ8Block;  // activation blocks per row of x
  unsigned char* bufs =
      smem + x_smem_bytes(T, MM, K) + red_bytes(MM) + static_cast<std::int64_t>(warp) * kStages * kBuf;

  const std::int64_t nb = K / kElems;
  const std::int64_t row_bytes = nb * kBytes;
  const auto S = static_cast<unsigned>((nb + kStep - 1) / kStep);  // items (pipeline steps) a row
  const unsigned H = swiglu ? 2u : 1u;                          // rows an output: gate and up, or one
  const std::int64_t outs = swiglu ? N / 2 : N;                 // output columns
  const std::int64_t o_begin = static_cast<std::int64_t>(blockIdx.x) * outs / gridDim.x;
  const std::int64_t o_end = static_cast<std::int64_t>(blockIdx.x + 1) * outs / gridDim.x;
  const auto rows = static_cast<unsigned>((o_end - o_begin) * H);  // this CTA's weight rows (launch bounds them)
  const unsigned items = rows * S;
  const unsigned P = S < 8 ? S : 8u;  // slots a row: one per step residue mod 8 that a warp holds
  // Rows a chunk: as many as `red` holds, whole outputs (gate and up together).
  const unsigned chunk_rows = static_cast<unsigned>(red_bytes(MM) / 4) / (P * MM) / H * H;
  const auto wbeg = reinterpret_cast<std::uintptr_t>(w);
  const std::uintptr_t wend = wbeg + static_cast<std::uintptr_t>(N * row_bytes);

  // Item q: local row r = q / S (output o_begin + r / H, half r % H: gate, then up at weight row outs + o), step
  // t = q % S. Issue and decode walk the warp's items with their own counters.
  auto step_at = [&](unsigned q, unsigned& r, unsigned& t, std::int64_t& first, int& count, std::uintptr_t& start) {
    r = q / S;
    t = q - r * S;
    const std::int64_t o = o_begin + r / H;
    const std::int64_t row = (r % H) ? outs + o : o;
    first = static_cast<std::int64_t>(t) * kStep;
    const std::int64_t left = nb - first;
    count = left < kStep ? static_cast<int>(left) : kStep;
    start = wbeg + static_cast<std::uintptr_t>(row * row_bytes + first * kBytes);
  };
  unsigned iq = static_cast<unsigned>(warp);
  int ibuf = 0;
  auto issue = [&]() {
    if (iq < items) {
      unsigned r, t;
      std::int64_t first;
      int count;
      std::uintptr_t start;
      step_at(iq, r, t, first, count, start);
      const std::uintptr_t end = start + static_cast<std::uintptr_t>(count) * kBytes;
      unsigned char* buf = bufs + ibuf * kBuf;
      if (kWalk != Walk::segments || aligned) {  // the step's bytes are whole 16-byte chunks
        const int chunks = count * kBytes / 16;
        for (int c = lane; c < chunks; c += 32)
          cp_async16(buf + 16 * c, reinterpret_cast<const void*>(start + 16u * static_cast<unsigned>(c)));
      } else {
        const std::uintptr_t a = start & ~std::uintptr_t{15};
        const int chunks = static_cast<int>((end - a + 15) / 16);
        for (int c = lane; c < chunks; c += 32) {
          const std::uintptr_t src = a + 16u * static_cast<unsigned>(c);
          if (src >= wbeg && src + 16 <= wend) {
            cp_async16(buf + 16 * c, reinterpret_cast<const void*>(src));
          } else {  // a chunk reaching outside the tensor: copy only the step's own bytes
            for (int o = 0; o < 16; o += 2) {
              const std::uintptr_t q = src + static_cast<unsigned>(o);
              if (q >= start && q < end)
                *reinterpret_cast<std::uint16_t*>(buf + 16 * c + o) = *reinterpret_cast<const std::uint16_t*>(q);
            }
          }
        }
      }
      iq += kWarps;
    }
    ibuf = ibuf + 1 == kStages ? 0 : ibuf + 1;
    cp_async_commit();  // empty groups too, so wait_group counts stay uniform
  };

  // The weights do not depend on x: their first copies are in flight while the CTA quantizes it. With
  // `early_copies` they are issued before waiting for the previous kernel (the weights are never written
  // during a step), so a CTA placed on an SM the previous kernel's tail left free starts its reads early.
  for (int s = 0; s < kStages - 1; ++s) issue();
  if (early_copies) chained::wait_for_previous_kernel();
  auto quantize_x = [&](const auto& src) {
    if constexpr (kWalk == Walk::pairs || kWalk == Walk::q8_pairs) {
      UnitXStore<false> store{xq, xp, static_cast<std::uint32_t>(K / 8), static_cast<std::uint32_t>(xblocks),
                              static_cast<std::uint32_t>(K / kUnitVals)};
      quantize_q8_chunks_from(src, MM * K / 8, MM * K / 8, store, threadIdx.x, kThreads, x_batch);
    } else if constexpr (kWalk == Walk::q6_runs) {
      UnitXStore<true> store{xq, xp, static_cast<std::uint32_t>(K / 8), static_cast<std::uint32_t>(xblocks),
                             static_cast<std::uint32_t>(K / kUnitVals)};
      quantize_q8_chunks_from(src, MM * K / 8, MM * K / 8, store, threadIdx.x, kThreads, x_batch);
    } else {
      Q8PlainStore store{xq, xs};
      quantize_q8_chunks_from(src, MM * K / 8, MM * K / 8, store, threadIdx.x, kThreads, x_batch);
    }
  };
  if (norm.weight != nullptr) {
    // `red` is free until the first chunk's partial sums, after the barrier below.
    float* inv = red + kWarps * MM;
    prenorm::inv_rms<MM, kWarps>(norm, K, red, inv);
    quantize_x(NormedChunks{norm, inv, static_cast<std::uint32_t>(K / 8), blockIdx.x, gridDim.x});
  } else {
    quantize_x(Bf16Chunks{x});
  }
  __syncthreads();

  float acc[MM];
#pragma unroll
  for (int m = 0; m < MM; ++m) acc[m] = 0.0f;

  unsigned dq = static_cast<unsigned>(warp);
  int dbuf = 0;
  for (unsigned c0 = 0; c0 < rows; c0 += chunk_rows) {  // the same trip count in every warp: barriers below
    const unsigned c1 = rows - c0 < chunk_rows ? rows : c0 + chunk_rows;
    for (; dq < c1 * S; dq += kWarps) {
      issue();
      cp_async_wait<kStages - 1>();  // the group of this item has landed (this lane's part)
      __syncwarp();                  // ... and every other lane's part

      unsigned r, t;
      std::int64_t first;
      int count;
      std::uintptr_t start;
      step_at(dq, r, t, first, count, start);
      if constexpr (kWalk != Walk::segments) {
        // A step holds 4 units a block (a lane's are all the same unit of their blocks: 32 lanes, 4 units), or
        // for Q8_0 one unit per two of its blocks (a lane each; a 17-word stride meets no bank conflict).
        const auto* buf = reinterpret_cast<const std::uint8_t*>(bufs + dbuf * kBuf);
        const std::int64_t U = K / kUnitVals;
        constexpr bool kQ8 = kWalk == Walk::q8_pairs;
        const int units = kQ8 ? count / 2 : count * 4;
        const int which = lane & 3;
        for (int u = lane; u < units; u += 32) {
          const std::int64_t ux = (kQ8 ? first / 2 : first * 4) + u;  // the unit's index in a row of x
          [[maybe_unused]] quant::PairCodes pc;
          [[maybe_unused]] quant::Q6RunCodes q6;
          if constexpr (kWalk == Walk::pairs) quant::decode_kpair<T>(buf + (u >> 2) * kBytes, which, pc);
          else if constexpr (kQ8) quant::decode_q8_pair(buf + u * 2 * kBytes, pc);
          else quant::decode_q6_run(buf + (u >> 2) * kBytes, which >> 1, which & 1, q6);
#pragma unroll
          for (int m = 0; m < MM; ++m) {
            std::uint32_t xw[4][4];
            load_pieces(reinterpret_cast<const uint4*>(xq + m * K) + ux, U, xw);
            if constexpr (kWalk == Walk::q6_runs) {
              const quant::PieceScale* sr = xp + m * 2 * xblocks + ux;
              const quant::PieceScale sc[4] = {sr[0], sr[U], sr[2 * U], sr[3 * U]};
              acc[m] += quant::q6_run_dot(q6, xw, sc);
            } else {
              const quant::PieceScale* sr = xp + m * xblocks + ux;
              const quant::PieceScale sc[2] = {sr[0], sr[U]};
              acc[m] += quant::pair_dot<T>(pc, xw, sc);
            }
          }
        }
      } else {
        const unsigned char* buf = bufs + dbuf * kBuf + (start & 15u);
        const int nseg = count * kSegs;
        for (int sg = lane; sg < nseg; sg += 32) {
          const int j = sg / kSegs, s = sg % kSegs;
          quant::SegCodes g;
          quant::decode_segment<T>(buf + j * kBytes, s, g);
          const std::int64_t xb = (first + j) * kSegs + s;  // the activation block under this segment
#pragma unroll
          for (int m = 0; m < MM; ++m) {
            const uint4* xv = reinterpret_cast<const uint4*>(xq + m * K + xb * quant::kQ8Block);
            const uint4 lo = xv[0], hi = xv[1];
            const std::uint32_t xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            acc[m] += quant::segment_dot<T>(g, xw, xs[m * xblocks + xb]);
          }
        }
      }

      if (t + kWarps >= S) {  // this warp's last item of row r: its sum goes to the row's slot t mod 8
#pragma unroll
        for (int m = 0; m < MM; ++m) {
          float v = acc[m];
#pragma unroll
          for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
          if (lane == m) red[((r - c0) * P + t % 8) * MM + m] = v;
          acc[m] = 0.0f;
        }
      }
      __syncwarp();  // everyone is done with this buffer before the next issue overwrites it
      dbuf = dbuf + 1 == kStages ? 0 : dbuf + 1;
    }
    __syncthreads();  // the chunk's slots are written
    const unsigned outs_c = (c1 - c0) / H;
    for (unsigned e = threadIdx.x; e < outs_c * MM; e += kThreads) {
      const unsigned oc = e / MM, m = e % MM;
      float v[2] = {0.0f, 0.0f};
      for (unsigned h = 0; h < H; ++h)
        for (unsigned p = 0; p < P; ++p) v[h] += red[((oc * H + h) * P + p) * MM + m];  // fixed order
      float out = v[0];
      if (swiglu) out = v[0] / (1.0f + expf(-v[0])) * v[1];  // swiglu.cu's silu, accurate expf
      const std::int64_t col = o_begin + (c0 / H) + oc;
      if (y_f32) static_cast<float*>(y)[m * ldy + col] = out;
      else static_cast<std::uint16_t*>(y)[m * ldy + col] = f32_to_bf16(out);
    }
    __syncthreads();  // the slots are read before the next chunk writes them
  }
  cp_async_wait<0>();
}

void check(cudaError_t e, DType type, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(infer::detail::cat("cuda::gguf_gemv(", name(type), "): ", what, " failed: ", cudaGetErrorName(e), ": ",
                                  cudaGetErrorString(e)));
}

/// The first weight copies before the chained wait (gemv_kernel's `early_copies`): on unless
/// INFER_GGUF_GEMV_EARLY=0 (read once; a switch for A/B runs in one build). Measured on the H200 at e9c5428
/// (bench/results/gpu-2026-12-06g), batch-1 decode: +5.9% on the 8B Q4_K_M file, +5.3% on Q8_0, +6% on SmolLM2
/// Q4_1. (The bf16 GEMV's early loads had measured slower, chained_launch.cuh: it reads no x-independent
/// prologue this long, and its CTAs do not fill the GPU once.)
bool early_copies() {
  static const bool value = [] {
    const char* e = std::getenv("INFER_GGUF_GEMV_EARLY");
    return e == nullptr || std::string_view(e) != "0";
  }();
  return value;
}

/// Chunks of x a thread fetches before quantizing any (gemv_kernel's `x_batch`; quantize_q8_chunks_from's batch,
/// capped by its source: 4 of bf16 x, 1 of a pre-norm), for a launch of M rows of K: 4 where a thread holds
/// four chunks or more (M·K / 8 >= 4 · kThreads), else 1. Measured on an H200 at 26b8467 (bench/results/
/// gpu-2026-12-07f, the GEMV alone in a graph, each way twice, alternating): at 7 chunks a thread (Llama-3-8B's
/// down, K = 14,336, one row) 4 a round took Q8_0 from 23.7 to 21.8 us and Q4_K from 16.5 to 16.0; at 4 or more
/// (K = 4,096 at 2 to 8 rows) it gained 6-14%; at 2 chunks (K = 4,096, one row) it lost 6-8% (Q8_0 q 7.9 against
/// 8.4 us): every thread ran four chunks' quantization, two of them on zeros. SmolLM2's batch-1 decode (K = 576
/// and 1,536: a chunk a thread) ran 1,546.9 tok/s with 1 and 1,423.5 with 4. INFER_GGUF_GEMV_XBATCH=1 or 4 (read
/// once) forces one, for A/B runs in one build.
int x_batch(int M, std::int64_t K) {
  static const int forced = [] {
    const char* e = std::getenv("INFER_GGUF_GEMV_XBATCH");
    const int v = e == nullptr ? 0 : std::atoi(e);
    return v >= 1 ? v : 0;  // unset or not a positive number: the rule below
  }();
  if (forced > 0) return forced;
  return static_cast<std::int64_t>(M) * K / 8 >= 4 * kThreads ? 4 : 1;
}

/// One call's operands (`run` below), for the launches of its rows of x.
struct Job {
  const void* w;
  const std::uint16_t* x;  ///< bf16 x, or null where `norm` gives it
  ResidualNorm norm;       ///< x as a pre-norm where norm.weight is non-null
  std::int64_t N, K;       ///< the weight's rows (with swiglu a stacked [gate; up]) and x's width
  void* y;
  std::int64_t ldy;
  bool y_f32, swiglu;
};

template <DType T, int MM, Walk kWalk>
void launch_walk(const Job& j, bool aligned, cudaStream_t stream) {
  auto kernel = gemv_kernel<T, MM, kWalk>;
  const auto smem = static_cast<std::size_t>(smem_bytes(T, MM, j.K));
  if (smem > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), T,
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  int device = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&device), T, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), T, "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem), T,
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (per_sm < 1) per_sm = 1;
  const std::int64_t outs = j.swiglu ? j.N / 2 : j.N;
  const std::int64_t resident = static_cast<std::int64_t>(sms) * per_sm;
  // One range of outputs a CTA, all CTAs at once; no more CTAs than give each warp an item (SmolLM2's 576-row
  // layers of one step a row: 72 CTAs of 8 rows, not 396 of one or two).
  const std::int64_t nb = j.K / info(T).block_elems;
  const std::int64_t per_output = (nb + step_blocks(T) - 1) / step_blocks(T) * (j.swiglu ? 2 : 1);  // its items
  const std::int64_t grid = std::min({(outs * per_output + kWarps - 1) / kWarps, resident, outs});
  if ((outs + grid - 1) / grid * per_output >= (std::int64_t{1} << 31))  // the busiest CTA's items
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", name(T), "): N=", j.N, " K=", j.K,
                                             " is more work than a CTA's 32-bit item count holds"));
  chained::launch(kernel, static_cast<unsigned>(grid), kThreads, smem, stream, static_cast<const unsigned char*>(j.w),
                  j.x, j.N, j.K, j.y, j.ldy, j.y_f32 ? 1 : 0, aligned ? 1 : 0, j.swiglu ? 1 : 0,
                  early_copies() ? 1 : 0, x_batch(MM, j.K), j.norm);
  check(cudaGetLastError(), T, "kernel launch");
}

/// Whether the pair and run walks may run: yes, unless INFER_GGUF_GEMV_WALK=segments (read once), which exists
/// to measure the walks against each other in one build.
bool unit_walks_allowed() {
  static const bool value = [] {
    const char* e = std::getenv("INFER_GGUF_GEMV_WALK");
    return e == nullptr || std::string_view(e) != "segments";
  }();
  return value;
}

/// The pair or run walk where the type and alignment allow it, else the segment walk.
template <DType T, int MM>
void launch(const Job& j, cudaStream_t stream) {
  const std::int64_t row_bytes = j.K / info(T).block_elems * info(T).block_bytes;
  const bool aligned = reinterpret_cast<std::uintptr_t>(j.w) % 16 == 0 && row_bytes % 16 == 0;
  constexpr Walk walk = aligned_walk(T);
  if constexpr (walk != Walk::segments) {
    if (aligned && unit_walks_allowed()) return launch_walk<T, MM, walk>(j, true, stream);
  }
  launch_walk<T, MM, Walk::segments>(j, aligned, stream);
}

template <DType T>
void launch_rows(int M, const Job& j, cudaStream_t s) {
  switch (M) {
    case 1: launch<T, 1>(j, s); break;
    case 2: launch<T, 2>(j, s); break;
    case 3: launch<T, 3>(j, s); break;
    case 4: launch<T, 4>(j, s); break;
    case 5: launch<T, 5>(j, s); break;
    case 6: launch<T, 6>(j, s); break;
    case 7: launch<T, 7>(j, s); break;
    default: launch<T, 8>(j, s); break;
  }
}

/// The most rows one launch takes for this K: x's codes for all of them must fit in shared memory beside the
/// rings (8 at Llama-3-8B's widest K, 14,336; 4 at 70B's 28,672). 0 when not even one row does.
int rows_per_launch(DType type, std::int64_t K) {
  int m = kGemvMaxRows;
  while (m > 0 && smem_bytes(type, m, K) > kMaxSmem) --m;
  return m;
}


/// job.N: the weight's rows (with swiglu a stacked [gate; up], N / 2 output columns).
void run(DType type, Job job, int M, void* stream) {
  const DTypeInfo ti = info(type);
  const std::int64_t N = job.N, K = job.K;
  if (!gemv_supports(type))
    throw UnsupportedError(infer::detail::cat("cuda::gguf_gemv: weight type ", ti.name,
                                       " is not supported (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, iq4_nl, "
                                       "iq4_xs are); use gguf_gemm"));
  if (M < 1 || M > kGemvMaxRows)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", ti.name, "): M = ", M, " rows; it takes 1..", kGemvMaxRows,
                                      " (use gguf_gemm for larger batches)"));
  if (N < 0 || K < 1 || K % ti.block_elems != 0)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", ti.name, "): bad shape N=", N, " K=", K,
                                      " (K must be a positive multiple of the block size ", ti.block_elems, ")"));
  const int per_launch = rows_per_launch(type, K);
  if (per_launch < 1)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", ti.name, "): K=", K, " is too wide for one row of x in ",
                                      kMaxSmem / 1024, " KiB of shared memory; use gguf_gemm"));
  const std::int64_t outs = job.swiglu ? N / 2 : N;
  if (job.ldy == 0) job.ldy = outs;
  if (job.ldy < outs)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", ti.name, "): output row stride ", job.ldy, " < N=", outs));
  if (N == 0) return;
  ResidualNorm& n = job.norm;
  const bool normed = n.weight != nullptr;
  if (job.w == nullptr || (!normed && job.x == nullptr) || (normed && n.residual == nullptr) || job.y == nullptr)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", ti.name, "): null ",
                                      job.w == nullptr ? "weight" : job.y == nullptr ? "y" : normed ? "residual" : "x",
                                      " pointer"));
  if (!normed && !prenorm::aligned16(job.x))
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", ti.name, "): x pointer ", static_cast<const void*>(job.x),
                                      " is not 16-byte aligned"));
  if (normed) prenorm::check(infer::detail::cat("cuda::gguf_gemv(", ti.name, ")").c_str(), n);
  if (reinterpret_cast<std::uintptr_t>(job.w) % 2 != 0 || reinterpret_cast<std::uintptr_t>(job.y) % (job.y_f32 ? 4 : 2) != 0)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", ti.name, "): weight and y pointers must be aligned to 2 (",
                                      "y: to its element) bytes"));
  auto s = static_cast<cudaStream_t>(stream);
  const std::size_t y_elem = job.y_f32 ? 4 : 2;
  const Job all = job;
  for (int m0 = 0; m0 < M; m0 += per_launch) {  // more than one launch only where K is very wide
    const int rows = M - m0 < per_launch ? M - m0 : per_launch;
    const std::int64_t off = static_cast<std::int64_t>(m0) * K;  // x's (and the norm's) rows m0..
    Job j = all;
    if (j.x) j.x += off;
    if (normed) {
      j.norm.residual += off;
      if (j.norm.delta) j.norm.delta += off;
      if (j.norm.residual_out) j.norm.residual_out += off;
      if (j.norm.normed_out) j.norm.normed_out += off;
    }
    j.y = static_cast<char*>(job.y) + static_cast<std::size_t>(m0 * job.ldy) * y_elem;
    switch (type) {
      case DType::q8_0: launch_rows<DType::q8_0>(rows, j, s); break;
      case DType::q4_0: launch_rows<DType::q4_0>(rows, j, s); break;
      case DType::q4_1: launch_rows<DType::q4_1>(rows, j, s); break;
      case DType::q5_0: launch_rows<DType::q5_0>(rows, j, s); break;
      case DType::q5_1: launch_rows<DType::q5_1>(rows, j, s); break;
      case DType::q4_k: launch_rows<DType::q4_k>(rows, j, s); break;
      case DType::q5_k: launch_rows<DType::q5_k>(rows, j, s); break;
      case DType::q6_k: launch_rows<DType::q6_k>(rows, j, s); break;
      case DType::iq4_nl: launch_rows<DType::iq4_nl>(rows, j, s); break;
      case DType::iq4_xs: launch_rows<DType::iq4_xs>(rows, j, s); break;
      default: break;
    }
  }
}

}  // namespace

void gguf_gemv(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y_bf16, void* stream, std::int64_t ldy) {
  run(type, Job{w_blocks, x_bf16, {}, N, K, y_bf16, ldy, false, false}, M, stream);
}

void gguf_gemv(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
               float* y_f32, void* stream, std::int64_t ldy) {
  run(type, Job{w_blocks, x_bf16, {}, N, K, y_f32, ldy, true, false}, M, stream);
}

void gguf_gemv_swiglu(DType type, const void* w_gate_up, const std::uint16_t* x_bf16, int M, std::int64_t I,
                      std::int64_t K, std::uint16_t* y_bf16, void* stream) {
  if (I < 0)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv_swiglu(", info(type).name, "): bad shape I=", I));
  run(type, Job{w_gate_up, x_bf16, {}, 2 * I, K, y_bf16, 0, false, true}, M, stream);
}

namespace {
void require_norm(DType type, const ResidualNorm& x) {
  if (x.weight == nullptr)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv(", info(type).name, "): the pre-norm has no weight"));
}
}  // namespace

void gguf_gemv(DType type, const void* w_blocks, const ResidualNorm& x, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y_bf16, void* stream, std::int64_t ldy) {
  require_norm(type, x);
  run(type, Job{w_blocks, nullptr, x, N, K, y_bf16, ldy, false, false}, M, stream);
}

void gguf_gemv(DType type, const void* w_blocks, const ResidualNorm& x, int M, std::int64_t N, std::int64_t K,
               float* y_f32, void* stream, std::int64_t ldy) {
  require_norm(type, x);
  run(type, Job{w_blocks, nullptr, x, N, K, y_f32, ldy, true, false}, M, stream);
}

void gguf_gemv_swiglu(DType type, const void* w_gate_up, const ResidualNorm& x, int M, std::int64_t I, std::int64_t K,
                      std::uint16_t* y_bf16, void* stream) {
  require_norm(type, x);
  if (I < 0)
    throw InvalidArgument(infer::detail::cat("cuda::gguf_gemv_swiglu(", info(type).name, "): bad shape I=", I));
  run(type, Job{w_gate_up, nullptr, x, 2 * I, K, y_bf16, 0, false, true}, M, stream);
}

bool gguf_gemv_fuses_norm(int M, std::int64_t K) {
  static const int mode = [] {  // -1: by size, 0: never, 1: always
    const char* e = std::getenv("INFER_GGUF_GEMV_NORM");
    if (e == nullptr) return -1;
    return std::string_view(e) == "0" ? 0 : std::string_view(e) == "1" ? 1 : -1;
  }();
  if (mode >= 0) return mode == 1;
  return static_cast<std::int64_t>(M) * K <= kGemvNormMaxValues;
}

}  // namespace infer::kernels::cuda
