// CUDA paged decode attention (flash-decoding) on the tensor cores. One thread block = one sequence x one
// KV head x up to 8 query heads of its group x one split of the context, so each K/V row is read from
// memory once for the whole group. Each of the block's 4 warps walks its own chunks of 16 positions
// (chunk w, w + 4, ...), loading K and V straight from global memory into mma.sync fragments: no shared
// memory staging, and the next chunk's loads are issued before the current chunk's arithmetic, so every
// warp keeps a chunk of K or V in flight at all times. Per chunk:
//   S  = Q · Kᵀ      m16n8k16 with the heads as M (rows past the group are zero) and K's rows as B,
//   P  = exp2(S - m) online softmax in f32 per head (max across the 4 lanes that share a head),
//   Oᵀ += Vᵀ · Pᵀ    m16n8k16 with head dims as M, positions as K and the heads as N: S's accumulator
//                    layout is exactly Pᵀ's B-fragment layout, so P never leaves its registers.
// Two permutations make every load 16 contiguous bytes (see load_k, load_v): the dims of each QK k-step
// are permuted the same way for Q and K (a dot product does not care), and the head dims of Oᵀ are
// permuted and undone when the result is written. The warps' partial states are merged through shared
// memory; the splits of a sequence by a second kernel (paged_decode_merge_kernel). Scores are kept in the
// log2 domain (S is scaled by scale * log2 e in f32) so the softmax uses exp2.
//
// Why tensor cores for a bandwidth-bound kernel: the CUDA-core version it replaced reduced every score
// across 16 lanes with shuffles and spent more issue slots on that than on its loads (2.4-2.8 TB/s on
// batch 64 x ctx 2048 against a 4.27 TB/s copy). Here a chunk of 16 positions (8 KiB of K and V for
// D = 128) costs 32 mma, 2 shuffles for the max and 2 for the rescale.
// Rounding: the tensor cores take bf16, so P is split as P = hi + lo (two bf16 parts, lo the residual)
// and Oᵀ += Vᵀ·hiᵀ + Vᵀ·loᵀ: P·V is then exact to ~2^-16 relative, like the f32 kernel this replaced
// (P rounded to bf16 alone perturbs the output by up to 2^-8 Σ p|v| / Σ p, enough to flip near-ties of
// greedy decoding against an f32 reference more often). The 8 extra mma per chunk and the registers
// they hold cost a few percent: 3.81 TB/s with P in bf16 alone, 3.63-3.70 with both parts (H200).
//
// An FP8 cache (e4m3 codes, KvCacheDtype::fp8_e4m3): the same loads at half the bytes (8 of K per slice, D/8
// of V per position), two chunks in flight per warp (as many bytes as the bf16 kernel's one), kept as codes
// in registers until the chunk is used, then widened to f16 by one instruction per two codes (kv_fp8.cuh),
// and the mma take f16: Q as f16 too (q · 2^-8, exact for every bf16 q whose magnitude is in [2^-6, 2^23]:
// f16 holds bf16's 8 significant bits), P as two f16 parts. K's scale and the 2^8 are folded into the
// softmax scale, V's applied to the output, so the scores and P·V are those of a bf16 cache holding code ·
// scale, but for the scales' roundings. (Widening to bf16 instead took ~5 instructions per two codes, and the
// kernel read 2.5 TB/s where the bf16 kernel reads 3.7: H200, 6fc447b.)
//
// Splits: the grid has a fixed number of splits per sequence (chosen on the host from the shapes, so a
// CUDA graph can replay it), but the positions of a split are computed on the device from the sequence's
// actual length (split_length): a short context in a graph captured for long ones is still spread over
// every split, instead of leaving all but the first split empty.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/attention.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "chained_launch.cuh"
#include "kv_fp8.cuh"
#include "mma_bf16.cuh"

namespace infer::kernels::cuda {
namespace {

using detail::fast_exp2;
using detail::mma_m16n8k16_bf16;
using detail::pack_bf16x2;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 16;       ///< positions per warp step (one mma K extent)
constexpr int kStep = kWarps * kChunk;  ///< positions per block step: the granule of split lengths
constexpr int kMaxGroup = 8;     ///< query heads per block: the N extent of Oᵀ's mma
/// Three blocks (12 warps) per SM, each keeping a chunk of K or V in flight, come near HBM's copy rate
/// (3.6-3.8 TB/s measured at D = 128); the bound keeps the compiler under the 168 registers that allows
/// (unbounded it takes 178, and two blocks per SM).
constexpr int kMinBlocksPerSm = 3;
constexpr int kMaxSplits = 256;
/// Block-table entries a thread block stages in shared memory at a time.
constexpr int kTableWindow = 1024;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct DecodeParams {
  const void* k;  ///< bf16 bits, or e4m3 codes (kFp8)
  const void* v;
  const std::int32_t* tables;
  const std::int32_t* lens;
  const std::uint16_t* q;
  std::int64_t q_stride;  ///< elements from one sequence's q to the next
  std::uint16_t* out;
  float* ws_ml;   ///< [seq][head][split][2]: max (log2 domain), sum
  float* ws_acc;  ///< [seq][head][split][D]: unnormalized accumulator
  int max_blocks;
  int block_shift;
  int kv_heads;
  int num_heads;
  int group;        ///< query heads per KV head
  int head_chunks;  ///< thread blocks per KV head along the group (group > kMaxGroup)
  int splits;
  float scale_log2;  ///< scale · log2 e (kFp8: · K's scale · 2^8, q being · 2^-8)
  float v_scale;     ///< V's scale (kFp8), else 1
};

/// The positions each split of a sequence of `len` covers: the context shared evenly by the splits, in
/// whole block steps (every split but the last is full), at least one step.
__device__ __forceinline__ int split_length(int len, int splits) {
  const int per = (len + splits - 1) / splits;
  return max(kStep, (per + kStep - 1) / kStep * kStep);
}

/// The bf16 in the low / high half of a .b32, as f32.
__device__ __forceinline__ float lo_bf16(std::uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(std::uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ uint4 load_nc(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 load_nc(const uint2* p) {
  uint2 r;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

/// The fragments one lane holds of a chunk's K rows and V rows (D = head dim), as loaded: bf16 values, or
/// (kFp8) e4m3 codes, widened to f16 by k_frag / v_frag when the chunk is used.
template <int D, bool kFp8>
struct ChunkRegs {
  static constexpr int kSlices = D / 32;  ///< K loads per position (16 bytes, FP8 8): 2 QK k-steps each
  static constexpr int kVLoads = D / 64;  ///< 16-byte bf16 V loads per position: D/8 contiguous dims
  static constexpr int kVCodeWords = D / 32;  ///< FP8: words of a position's D/8 codes of V
  using KLoad = std::conditional_t<kFp8, uint2, uint4>;
  KLoad k[2][kSlices];  ///< K rows g and g + 8 of the chunk
  std::conditional_t<kFp8, std::uint32_t[4][kVCodeWords], uint4[4][kVLoads]> v;  ///< V rows 2t, 2t+1, 2t+8, 2t+9

  /// K row h·8 + g's slice c as the mma takes it: bf16 values, or (kFp8) f16.
  __device__ __forceinline__ uint4 k_frag(int h, int c) const {
    if constexpr (kFp8) return kv_fp8::to_f16x8(k[h][c]);
    else return k[h][c];
  }
  /// V row i's D/8 values as the mma takes them (kVLoads 16-byte pieces): bf16, or (kFp8) f16.
  __device__ __forceinline__ void v_frag(int i, uint4 (&out)[kVLoads]) const {
#pragma unroll
    for (int c = 0; c < kVLoads; ++c) {
      if constexpr (kFp8) out[c] = kv_fp8::to_f16x8(make_uint2(v[i][2 * c], v[i][2 * c + 1]));
      else out[c] = v[i][c];
    }
  }
};

constexpr std::uint32_t kNoRow = 0xffffffffu;

/// Where a chunk's rows are: a position's row for this KV head in 16-byte units of the cache (32 bits
/// cover 64 GiB of one layer's K or V, and save the registers 64-bit offsets would take), or kNoRow when
/// the position is past the range: its loads are skipped and read as zero (unwritten rows may hold NaN).
struct ChunkRows {
  const std::int32_t* table;  ///< the staged window of block-table entries, in shared memory
  int first_block, block_shift, block_mask, end;
  std::uint32_t row_units;    ///< 16-byte units from one cache row (all KV heads) to the next
  std::uint32_t head_units;   ///< this KV head's offset in a row, in 16-byte units

  __device__ __forceinline__ std::uint32_t offset(int pos) const {
    if (pos >= end) return kNoRow;
    const auto blk = static_cast<std::uint32_t>(table[(pos >> block_shift) - first_block]);
    const std::uint32_t row = (blk << block_shift) + static_cast<std::uint32_t>(pos & block_mask);
    return row * row_units + head_units;
  }
};

/// D += A·B on the tensor cores in the kernel's input type: f16 (kFp8) or bf16.
template <bool kFp8>
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  if constexpr (kFp8) detail::mma_m16n8k16_f16(d, a, b0, b1);
  else mma_m16n8k16_bf16(d, a, b0, b1);
}

/// P's two parts in the kernel's input type: hi = P rounded, lo = what that left (P = hi + lo to ~2^-16 in
/// bf16, ~2^-22 in f16), each a .b32 of two values.
template <bool kFp8>
__device__ __forceinline__ void split_p(float p0, float p1, std::uint32_t& hi, std::uint32_t& lo) {
  if constexpr (kFp8) {
    hi = detail::pack_f16x2(p0, p1);
    lo = detail::pack_f16x2(p0 - detail::lo_f16(hi), p1 - detail::hi_f16(hi));
  } else {
    hi = pack_bf16x2(p0, p1);
    lo = pack_bf16x2(p0 - lo_bf16(hi), p1 - hi_bf16(hi));
  }
}

/// K for S = Q·Kᵀ: B fragment of k-step s holds K[pos g][logical dims 2t, 2t+1] (b0) and [2t+8, 2t+9] (b1).
/// Logical dims of k-step 2c + s are mapped to physical dims c*32 + t*8 + 4s + {0, 1, 2, 3}, so lane (g, t)
/// loads the 16 bytes K[pos][c*32 + t*8 .. +8] and the words are b0, b1 of k-step 2c and of 2c + 1.
/// FP8: the same dims' 8 codes, 8 bytes at byte c*32 + t*8 of the row (rows are D bytes: whole 16-byte units).
template <int D, bool kFp8>
__device__ __forceinline__ void load_k(const void* k, const ChunkRows& rows, int base, int g, int t, ChunkRegs<D, kFp8>& r) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::uint32_t off = rows.offset(base + h * 8 + g);
#pragma unroll
    for (int c = 0; c < ChunkRegs<D, kFp8>::kSlices; ++c) {
      if constexpr (kFp8)
        r.k[h][c] = off == kNoRow ? make_uint2(0, 0) : load_nc(static_cast<const uint2*>(k) + 2 * off + c * 4 + t);
      else
        r.k[h][c] = off == kNoRow ? make_uint4(0, 0, 0, 0) : load_nc(static_cast<const uint4*>(k) + off + c * 4 + t);
    }
  }
}

/// V for Oᵀ = Vᵀ·Pᵀ: A fragment of m-tile j holds Vᵀ[rows g, g+8][positions 2t.., 2t+8..]. Row r of m-tile j is
/// mapped to physical dim g*(D/8) + j (r = g) or g*(D/8) + D/16 + j (r = g + 8), so lane (g, t) needs dims
/// g*(D/8) .. +D/8 of its four positions: D/64 16-byte loads each (FP8: those D/8 codes, one 16- or 8-byte load).
template <int D, bool kFp8>
__device__ __forceinline__ void load_v(const void* v, const ChunkRows& rows, int base, int g, int t, ChunkRegs<D, kFp8>& r) {
  constexpr int kPos[4] = {0, 1, 8, 9};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t off = rows.offset(base + 2 * t + kPos[i]);
    if constexpr (kFp8 && D == 128) {
      const uint4 c = off == kNoRow ? make_uint4(0, 0, 0, 0) : load_nc(static_cast<const uint4*>(v) + off + g);
      r.v[i][0] = c.x;
      r.v[i][1] = c.y;
      r.v[i][2] = c.z;
      r.v[i][3] = c.w;
    } else if constexpr (kFp8) {
      static_assert(D == 64);
      const uint2 c = off == kNoRow ? make_uint2(0, 0) : load_nc(static_cast<const uint2*>(v) + 2 * off + g);
      r.v[i][0] = c.x;
      r.v[i][1] = c.y;
    } else {
#pragma unroll
      for (int c = 0; c < ChunkRegs<D, kFp8>::kVLoads; ++c)
        r.v[i][c] = off == kNoRow ? make_uint4(0, 0, 0, 0) : load_nc(static_cast<const uint4*>(v) + off + g * (D / 64) + c);
    }
  }
}

/// Word w of the 16-byte-load array `a` (kVLoads loads of 4 words).
__device__ __forceinline__ std::uint32_t word(const uint4* a, int w) {
  const uint4& x = a[w / 4];
  return (w & 3) == 0 ? x.x : (w & 3) == 1 ? x.y : (w & 3) == 2 ? x.z : x.w;
}

/// Two positions' values of one physical dim (element e of a lane's D/8 dims) packed as a .b32: the low
/// half from position a, the high half from position b.
__device__ __forceinline__ std::uint32_t pair(const uint4* a, const uint4* b, int e) {
  return __byte_perm(word(a, e / 2), word(b, e / 2), (e & 1) == 0 ? 0x5410 : 0x7632);
}

template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) paged_decode_kernel(const DecodeParams p) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  constexpr int kKSteps = D / 16;   // QK k-steps
  constexpr int kMTiles = D / 16;   // Oᵀ m-tiles
  using Regs = ChunkRegs<D, kFp8>;
  constexpr int kSlices = Regs::kSlices;
  constexpr int kRowUnits = kFp8 ? D / 16 : D / 8;  // 16-byte units of one head's row

  __shared__ std::int32_t sm_table[kTableWindow];
  __shared__ float sm_m[kWarps][kMaxGroup];
  __shared__ float sm_l[kWarps][kMaxGroup];
  __shared__ __align__(16) float sm_acc[kWarps][kMaxGroup][D];

  const int seq = static_cast<int>(blockIdx.z);
  const int kvh = static_cast<int>(blockIdx.y) / p.head_chunks;
  const int chunk_of_group = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int split = static_cast<int>(blockIdx.x);
  const int h0 = kvh * p.group + chunk_of_group * kMaxGroup;
  const int nh = min(kMaxGroup, p.group - chunk_of_group * kMaxGroup);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;

  // Never read past the block table, even when a caller's seq_len is too large.
  const int len = min(p.lens[seq], p.max_blocks << p.block_shift);
  const int split_len = split_length(len, p.splits);
  const int begin = split * split_len;
  const int end = min(len, begin + split_len);

  // Q as the A fragments of every k-step: row g is head h0 + g (zero past the group), rows g + 8 are zero.
  std::uint32_t qa[kKSteps][2];
  {
    uint4 raw[kSlices];
#pragma unroll
    for (int c = 0; c < kSlices; ++c) raw[c] = make_uint4(0, 0, 0, 0);
    if (g < nh) {
      const std::uint16_t* qrow = p.q + static_cast<std::size_t>(seq) * static_cast<std::size_t>(p.q_stride) +
                                  static_cast<std::size_t>(h0 + g) * D;
#pragma unroll
      for (int c = 0; c < kSlices; ++c) raw[c] = *reinterpret_cast<const uint4*>(qrow + c * 32 + t * 8);
    }
#pragma unroll
    for (int c = 0; c < kSlices; ++c) {
      qa[2 * c][0] = raw[c].x;
      qa[2 * c][1] = raw[c].y;
      qa[2 * c + 1][0] = raw[c].z;
      qa[2 * c + 1][1] = raw[c].w;
    }
    if constexpr (kFp8) {  // f16 · 2^-8 (the scale has the 2^8): exact for bf16 magnitudes in [2^-6, 2^23]
#pragma unroll
      for (int k = 0; k < kKSteps; ++k)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          qa[k][i] = detail::pack_f16x2(lo_bf16(qa[k][i]) * 0.00390625f, hi_bf16(qa[k][i]) * 0.00390625f);
    }
  }

  // This lane's online-softmax state for head g (m, its share of l) and Oᵀ for heads 2t, 2t+1.
  float m = kNegInf, l = 0.0f;
  float o[kMTiles][4];
#pragma unroll
  for (int j = 0; j < kMTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  const int block_mask = (1 << p.block_shift) - 1;
  const void* kv_k = p.k;
  const void* kv_v = p.v;
  const std::int32_t* table = p.tables + static_cast<std::size_t>(seq) * p.max_blocks;
  const int window = (kTableWindow - 1) << p.block_shift;  // positions whose blocks fit, at any alignment
  for (int wbeg = begin; wbeg < end; wbeg += window) {
    const int wend = min(end, wbeg + window);
    const int first_block = wbeg >> p.block_shift;
    const int nblocks = ((wend - 1) >> p.block_shift) - first_block + 1;
    __syncthreads();  // the previous window's readers are done
    for (int i = static_cast<int>(threadIdx.x); i < nblocks; i += kThreads) sm_table[i] = __ldg(table + first_block + i);
    __syncthreads();
    const ChunkRows rows{sm_table, first_block, p.block_shift, block_mask, wend,
                         static_cast<std::uint32_t>(p.kv_heads * kRowUnits), static_cast<std::uint32_t>(kvh * kRowUnits)};

    int first = wbeg + warp * kChunk;  // this warp's first chunk
    if (first >= wend) continue;
    // One chunk of this warp: its scores, the softmax update and O += P·V from `cur`, whose K and V registers
    // then take the chunk at `next` (as soon as each is used, so that it is in flight during the rest).
    const auto step = [&](Regs& cur, const int base, const int next) {
      // S = Q·Kᵀ: n-tile h covers positions base + 8h .. +7.
      float s[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s[h][0] = s[h][1] = s[h][2] = s[h][3] = 0.0f;
#pragma unroll
        for (int c = 0; c < kSlices; ++c) {
          const uint4 kb = cur.k_frag(h, c);
          const std::uint32_t a0[4] = {qa[2 * c][0], 0u, qa[2 * c][1], 0u};
          mma<kFp8>(s[h], a0, kb.x, kb.y);
          const std::uint32_t a1[4] = {qa[2 * c + 1][0], 0u, qa[2 * c + 1][1], 0u};
          mma<kFp8>(s[h], a1, kb.z, kb.w);
        }
      }
      if (next < wend) load_k<D>(kv_k, rows, next, g, t, cur);  // K's registers are free again

      // Online softmax for head g over positions base + 2t, +1, +8, +9 (s[h][0..1]; s[h][2..3] are rows g+8).
      float x[4];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int pos = base + 8 * h + 2 * t + e;
          x[2 * h + e] = pos < wend ? s[h][e] * p.scale_log2 : kNegInf;
        }
      float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m, mx);  // finite: the chunk's first position is always in range
      const float corr = fast_exp2(m - m_new);  // 0 while m is -inf
      float pr[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = fast_exp2(x[i] - m_new);
      l = fmaf(l, corr, (pr[0] + pr[1]) + (pr[2] + pr[3]));
      m = m_new;
      // Oᵀ's columns are heads 2t and 2t+1: their factors live in the lanes of groups 2t and 2t+1.
      const float c0 = __shfl_sync(0xffffffffu, corr, 8 * t);
      const float c1 = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
      for (int j = 0; j < kMTiles; ++j) {
        o[j][0] *= c0;
        o[j][1] *= c1;
        o[j][2] *= c0;
        o[j][3] *= c1;
      }
      // Oᵀ += Vᵀ·Pᵀ: Pᵀ's B fragment is (positions 2t, 2t+1 | 2t+8, 2t+9) x head g, i.e. this lane's p.
      // P = hi + lo (see the top of the file).
      std::uint32_t hi0, hi1, lo0, lo1;
      split_p<kFp8>(pr[0], pr[1], hi0, lo0);
      split_p<kFp8>(pr[2], pr[3], hi1, lo1);
      uint4 vb[4][Regs::kVLoads];
#pragma unroll
      for (int i = 0; i < 4; ++i) cur.v_frag(i, vb[i]);
#pragma unroll
      for (int j = 0; j < kMTiles; ++j) {
        const std::uint32_t va[4] = {pair(vb[0], vb[1], j), pair(vb[0], vb[1], kMTiles + j),
                                     pair(vb[2], vb[3], j), pair(vb[2], vb[3], kMTiles + j)};
        mma<kFp8>(o[j], va, hi0, hi1);
        mma<kFp8>(o[j], va, lo0, lo1);
      }
      if (next < wend) load_v<D>(kv_v, rows, next, g, t, cur);
    };
    constexpr int kStride = kWarps * kChunk;  // positions from one of a warp's chunks to its next
    Regs a;
    load_k<D>(kv_k, rows, first, g, t, a);
    load_v<D>(kv_v, rows, first, g, t, a);
    if constexpr (!kFp8) {
      for (; first < wend; first += kStride) step(a, first, first + kStride);
    } else {
      // An FP8 chunk is half a bf16 chunk's bytes: two chunks in flight (registers a and b, used in turn) keep
      // as many bytes in flight per warp as the bf16 kernel does, in the registers it needs for one.
      Regs b;
      if (first + kStride < wend) {
        load_k<D>(kv_k, rows, first + kStride, g, t, b);
        load_v<D>(kv_v, rows, first + kStride, g, t, b);
      }
      for (; first < wend; first += 2 * kStride) {
        step(a, first, first + 2 * kStride);
        if (first + kStride >= wend) break;
        step(b, first + kStride, first + 3 * kStride);
      }
    }
  }  // table window

  // Merge the warps of this block: each warp's (m, l) per head and its Oᵀ columns, in physical dims.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (t == 0) {
    sm_m[warp][g] = m;
    sm_l[warp][g] = l;
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int head = 2 * t + e;
    float* dst = &sm_acc[warp][head][g * (D / 8)];
#pragma unroll
    for (int j = 0; j < kMTiles; ++j) {
      dst[j] = o[j][e];                // row g of m-tile j
      dst[kMTiles + j] = o[j][2 + e];  // row g + 8
    }
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < nh * D; idx += kThreads) {
    const int hh = idx / D, d = idx % D;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][hh]);
    float sum = 0.0f, a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = sm_m[w][hh] == kNegInf ? 0.0f : exp2f(sm_m[w][hh] - mx);
      sum = fmaf(sm_l[w][hh], wt, sum);
      a = fmaf(sm_acc[w][hh][d], wt, a);
    }
    const std::size_t head = static_cast<std::size_t>(seq) * p.num_heads + h0 + hh;
    if (p.splits == 1) {
      p.out[head * D + d] = f32_to_bf16(sum > 0.0f ? a / sum * p.v_scale : 0.0f);
    } else {
      const std::size_t slot = head * p.splits + split;
      p.ws_acc[slot * D + d] = a;
      if (d == 0) {
        p.ws_ml[slot * 2] = mx;
        p.ws_ml[slot * 2 + 1] = sum;
      }
    }
  }
}

/// The merge of the splits: one block per (head, sequence), one thread per dim, each a loop over the splits
/// that hold positions. (Merging in the last block of each sequence's splits, found by arrival counters,
/// measured 1-2% slower at batch 1 and was removed.)
template <int D>
__global__ void __launch_bounds__(D) paged_decode_merge_kernel(const DecodeParams p) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  const int h = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const int d = static_cast<int>(threadIdx.x);
  const int len = min(p.lens[seq], p.max_blocks << p.block_shift);
  const int split_len = split_length(len, p.splits);
  const int used = len <= 0 ? 0 : min(p.splits, (len + split_len - 1) / split_len);
  const std::size_t head = static_cast<std::size_t>(seq) * p.num_heads + h;
  const float* ml = p.ws_ml + head * p.splits * 2;
  const float* acc = p.ws_acc + head * p.splits * D;
  float mx = kNegInf;
  for (int s = 0; s < used; ++s) mx = fmaxf(mx, ml[2 * s]);
  float sum = 0.0f, a = 0.0f;
  for (int s = 0; s < used; ++s) {
    const float ms = ml[2 * s];
    const float w = ms == kNegInf ? 0.0f : exp2f(ms - mx);
    sum = fmaf(ml[2 * s + 1], w, sum);
    a = fmaf(acc[static_cast<std::size_t>(s) * D + d], w, a);
  }
  p.out[head * D + d] = f32_to_bf16(sum > 0.0f ? a / sum * p.v_scale : 0.0f);
}

void check(const PagedKvBatch& b, int num_heads) {
  using infer::detail::cat;
  if (b.num_seqs < 0 || b.num_seqs > 65535)
    throw InvalidArgument(cat("cuda::paged_decode_attention: num_seqs = ", b.num_seqs, " must be in [0, 65535]"));
  if (b.head_dim != 64 && b.head_dim != 128)
    throw InvalidArgument(cat("cuda::paged_decode_attention: head_dim = ", b.head_dim,
                              " is not supported; the kernels are built for 64 and 128"));
  if (b.num_kv_heads <= 0 || num_heads <= 0 || num_heads % b.num_kv_heads != 0)
    throw InvalidArgument(cat("cuda::paged_decode_attention: num_heads = ", num_heads, ", num_kv_heads = ",
                              b.num_kv_heads, "; both must be positive and num_kv_heads must divide num_heads"));
  if (b.block_size <= 0 || b.block_size > 1024 || (b.block_size & (b.block_size - 1)) != 0)
    throw InvalidArgument(cat("cuda::paged_decode_attention: block_size = ", b.block_size,
                              " must be a power of two in [1, 1024]"));
  if (b.max_blocks_per_seq <= 0)
    throw InvalidArgument(cat("cuda::paged_decode_attention: max_blocks_per_seq = ", b.max_blocks_per_seq,
                              " must be positive"));
  if (static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size > (std::int64_t{1} << 30))
    throw InvalidArgument(cat("cuda::paged_decode_attention: ", b.max_blocks_per_seq, " blocks of ", b.block_size,
                              " tokens exceed the 2^30 positions a sequence may have"));
  if (b.kv_dtype == KvCacheDtype::fp8_e4m3) require_kv_scales("cuda::paged_decode_attention", b.k_scale, b.v_scale);
  const int chunks = (num_heads / b.num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  if (static_cast<std::int64_t>(b.num_kv_heads) * chunks > 65535)
    throw InvalidArgument(cat("cuda::paged_decode_attention: ", num_heads, " heads are too many"));
}

/// Resident blocks per SM of one kernel instance (register use differs by D; the bf16 instance's count plans
/// for the FP8 one too, so a shape's splits and workspace do not depend on the cache's type); cached per
/// instance, so this assumes one kind of GPU per process.
template <int D>
int blocks_per_sm() {
  static const int n = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, paged_decode_kernel<D, false>, kThreads, 0) != cudaSuccess || b <= 0) {
      (void)cudaGetLastError();
      b = 2;
    }
    return b;
  }();
  return n;
}

int resident_blocks(int d) { return (d == 64 ? blocks_per_sm<64>() : blocks_per_sm<128>()) * backend::cuda::sm_count(); }

/// Splits per sequence so that the grid fills the GPU in whole waves: none when the unsplit grid already
/// takes two waves or more (its last wave then costs at most a third of the time, and every split adds
/// its partial results' write, their merge and a block's fixed costs: 256 sequences of 256 positions
/// measured 3.28 TB/s unsplit against 2.51 split 3 ways); else the fewest whose last wave is at least 95%
/// full, or the best fill found, and no more than the table's capacity holds block steps.
int plan_splits(const PagedKvBatch& b, int num_heads) {
  const int group = num_heads / b.num_kv_heads;
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const std::int64_t cap = static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size;
  const std::int64_t ctas = std::int64_t{b.num_seqs} * b.num_kv_heads * chunks;
  const std::int64_t slots = resident_blocks(b.head_dim);
  if (ctas >= 2 * slots) return 1;
  std::int64_t max_splits = (cap + kStep - 1) / kStep;
  if (max_splits > kMaxSplits) max_splits = kMaxSplits;
  if (max_splits < 1) max_splits = 1;
  std::int64_t splits = 1;
  double best = 0.0;
  for (std::int64_t s = 1; s <= max_splits && ctas > 0; ++s) {
    const std::int64_t total = ctas * s;
    const std::int64_t waves = (total + slots - 1) / slots;
    const double fill = static_cast<double>(total) / static_cast<double>(waves * slots);
    if (fill > best + 1e-3) {
      best = fill;
      splits = s;
    }
    if (best >= 0.95) break;
  }
  return static_cast<int>(splits);
}

template <int D, bool kFp8>
void launch(const DecodeParams& p, int num_seqs, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.kv_heads * p.head_chunks),
                  static_cast<unsigned>(num_seqs));
  chained::launch(paged_decode_kernel<D, kFp8>, grid, kThreads, 0, stream, p);
  if (p.splits > 1)
    chained::launch(paged_decode_merge_kernel<D>,
                    dim3(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs)), D, 0, stream, p);
}

/// The workspace of a split shape: each split's (max, sum), then its accumulator.
struct WorkspaceLayout {
  std::size_t ml_floats, acc_floats;
  WorkspaceLayout(const PagedKvBatch& b, int num_heads, int splits) {
    const auto per_split = static_cast<std::size_t>(b.num_seqs) * static_cast<std::size_t>(num_heads) *
                           static_cast<std::size_t>(splits);
    ml_floats = per_split * 2;
    acc_floats = per_split * static_cast<std::size_t>(b.head_dim);
  }
  [[nodiscard]] std::size_t bytes() const { return (ml_floats + acc_floats) * sizeof(float); }
};

}  // namespace

int paged_decode_num_splits(const PagedKvBatch& batch, int num_heads) {
  check(batch, num_heads);
  return plan_splits(batch, num_heads);
}

std::size_t paged_decode_workspace_bytes(const PagedKvBatch& batch, int num_heads) {
  check(batch, num_heads);
  const int splits = plan_splits(batch, num_heads);
  if (splits <= 1) return 0;
  return WorkspaceLayout(batch, num_heads, splits).bytes();
}

void paged_decode_attention(const PagedKvBatch& batch, const std::uint16_t* q, int num_heads, float scale,
                            std::uint16_t* out, float* workspace, std::size_t workspace_bytes, void* stream,
                            std::int64_t q_row_stride) {
  using infer::detail::cat;
  check(batch, num_heads);
  const bool fp8 = batch.kv_dtype == KvCacheDtype::fp8_e4m3;
  const std::int64_t dense = static_cast<std::int64_t>(num_heads) * batch.head_dim;
  if (q_row_stride != 0 && (q_row_stride < dense || q_row_stride % 8 != 0))
    throw InvalidArgument(cat("cuda::paged_decode_attention: q_row_stride = ", q_row_stride, " must be 0 or a multiple",
                              " of 8 of at least num_heads * head_dim = ", dense));
  if (batch.num_seqs == 0) return;
  if (!batch.k || !batch.v || !batch.block_tables || !batch.seq_lens || !q || !out)
    throw InvalidArgument(cat("cuda::paged_decode_attention: null ",
                              !batch.k              ? "K"
                              : !batch.v            ? "V"
                              : !batch.block_tables ? "block_tables"
                              : !batch.seq_lens     ? "seq_lens"
                              : !q                  ? "q"
                                                    : "out",
                              " pointer"));
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(batch.k) || misaligned(batch.v) || misaligned(q))
    throw InvalidArgument("cuda::paged_decode_attention: K, V and q must be 16-byte aligned (16-byte loads)");
  const int splits = plan_splits(batch, num_heads);
  const std::size_t need = paged_decode_workspace_bytes(batch, num_heads);
  if (need > 0 && (workspace == nullptr || workspace_bytes < need))
    throw InvalidArgument(cat("cuda::paged_decode_attention: the workspace has ", workspace_bytes, " bytes",
                              workspace == nullptr ? " (null)" : "", "; this shape splits each context ", splits,
                              " ways and needs ", need, " (paged_decode_workspace_bytes)"));

  const int group = num_heads / batch.num_kv_heads;
  DecodeParams p{};
  p.k = batch.k;
  p.v = batch.v;
  p.tables = batch.block_tables;
  p.lens = batch.seq_lens;
  p.q = q;
  p.q_stride = q_row_stride != 0 ? q_row_stride : dense;
  p.out = out;
  if (splits > 1) {
    const WorkspaceLayout ws(batch, num_heads, splits);
    p.ws_ml = workspace;
    p.ws_acc = p.ws_ml + ws.ml_floats;
  }
  p.max_blocks = batch.max_blocks_per_seq;
  int shift = 0;
  while ((1 << shift) < batch.block_size) ++shift;
  p.block_shift = shift;
  p.kv_heads = batch.num_kv_heads;
  p.num_heads = num_heads;
  p.group = group;
  p.head_chunks = (group + kMaxGroup - 1) / kMaxGroup;
  p.splits = splits;
  p.scale_log2 = scale * kLog2e * (fp8 ? batch.k_scale * 256.0f : 1.0f);  // FP8: q · 2^-8 in the kernel
  p.v_scale = fp8 ? batch.v_scale : 1.0f;

  auto s = static_cast<cudaStream_t>(stream);
  if (batch.head_dim == 64) fp8 ? launch<64, true>(p, batch.num_seqs, s) : launch<64, false>(p, batch.num_seqs, s);
  else fp8 ? launch<128, true>(p, batch.num_seqs, s) : launch<128, false>(p, batch.num_seqs, s);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw DeviceError(cat("cuda::paged_decode_attention(", batch.num_seqs, " sequences, ", num_heads, "/",
                          batch.num_kv_heads, " heads of ", batch.head_dim, ", ", splits,
                          " splits): kernel launch failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace infer::kernels::cuda
