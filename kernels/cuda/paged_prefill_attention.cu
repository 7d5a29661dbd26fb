// CUDA paged prefill / chunked-prefill attention. Three kernels behind one entry point: on compute capability
// 9.0 with a bf16 cache, the wgmma kernel (sm90a/paged_prefill_wgmma.cu, the default there); elsewhere, and
// where a PrefillPath asks for them, the two here:
//
//  - the mma.sync kernel (the default off Hopper), flash-attention-2 style with mma.sync m16n8k16 bf16 -> f32.
//    A thread block of 4 warps takes BQ = 64·MT queries of one (sequence, query head); warp w owns rows 16·MT·w ..
//    16·MT·(w+1)-1 of the tile, MT m16 tiles of them. K/V are walked in tiles of 64 positions from 0 up to
//    the tile's last visible position, gathered through the block table by cp.async (16 bytes a row chunk,
//    zero fill past the last position) into a double buffer: tile t+1 is in flight while tile t is used.
//    Shared rows are padded by 16 bytes (a row stride of 4 mod 32 banks), so the 8 row addresses of every
//    ldmatrix phase fall on 8 distinct 4-bank groups, and every fragment address is a per-lane base plus
//    a compile-time offset (an XOR swizzle would need a register per k step).
//    S = Q·Kᵀ: Q is the row-major A operand (ldmatrix from [row][d]; kept in registers when it fits), K the
//    col operand (ldmatrix without .trans on [pos][d] rows gives Kᵀ's fragments). The online softmax runs
//    on the S accumulators in f32 (scale·log2 e applied in f32, exp2; row max reduced over the quad that
//    shares a row; row sums kept per thread and reduced once at the end). P is rounded to bf16 in registers
//    and reused directly as the A operand of O += P·V (the C layout of two n8 tiles is the A layout of one
//    k16 step), V through ldmatrix.trans. Only tiles that cross the diagonal are masked; a warp skips a tile
//    that none of its rows can see. O / l is staged through the warp's own Q rows in shared memory and
//    written with 16-byte stores, rows past the chunk not at all.
//  - the CUDA-core kernel it replaced (f32 throughout; set_paged_prefill_path(PrefillPath::cuda_cores) or
//    INFER_PREFILL_ATTENTION=cuda_cores), one thread block = one sequence x one query head x 32 queries.
//
// An FP8 cache (e4m3 codes, KvCacheDtype::fp8_e4m3): both kernels widen the codes to bf16 exactly
// (kv_fp8.cuh), K's scale folded into the softmax scale and V's applied to the output. The tensor-core
// kernel copies a tile's codes (D bytes a row) into the upper half of its padded bf16 rows, then each thread
// widens the codes it copied into the row's bf16 half: two more barriers per tile, no more shared memory.
//
// Both read only cache rows at positions <= the chunk's last position, so unwritten rows are never touched,
// and size their grids from max_blocks_per_seq * block_size (the lengths stay on the device): thread blocks
// past their chunk exit at once.
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/attention.hpp"
#include "kv_fp8.cuh"
#include "mma_bf16.cuh"
#include "paged_prefill.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTileQ = 32;  // CUDA-core kernel: kThreads / 4 lanes per query row
constexpr int kMaxGridX = 4096;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using detail::PrefillParams;

// ---- CUDA-core kernel (the fallback) ------------------------------------------------------------------
// One thread block = one sequence x one query head x a tile of BQ = 32 queries (grid-striding over the
// chunk's tiles). K/V are walked in tiles of BK rows gathered through the block table into shared memory
// (16-byte loads, converted to f32); each query row is owned by 4 consecutive lanes, which split the tile's
// keys for the scores and the head's dims for the accumulator; online softmax (log2 domain) in registers,
// one rescale per tile.

__device__ __forceinline__ void unpack8_to(const uint4& r, float* f, float mul) {
  f[0] = __uint_as_float(r.x << 16) * mul;
  f[1] = __uint_as_float(r.x & 0xffff0000u) * mul;
  f[2] = __uint_as_float(r.y << 16) * mul;
  f[3] = __uint_as_float(r.y & 0xffff0000u) * mul;
  f[4] = __uint_as_float(r.z << 16) * mul;
  f[5] = __uint_as_float(r.z & 0xffff0000u) * mul;
  f[6] = __uint_as_float(r.w << 16) * mul;
  f[7] = __uint_as_float(r.w & 0xffff0000u) * mul;
}

template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads) paged_prefill_cuda_core_kernel(const PrefillParams p) {
  constexpr int BQ = kTileQ;
  constexpr int BK = D == 64 ? 32 : 16;  // keeps the four tiles under 48 KB of static shared memory
  constexpr int KPT = BK / 4;            // keys per lane
  constexpr int DPT = D / 4;             // accumulator dims per lane
  constexpr int VPR = D / 8;             // 16-byte vectors per row
  // Rows padded by one word: the 4 lanes of a row read different keys/dims without bank conflicts.
  __shared__ float sq[BQ][D + 1];
  __shared__ float sk[BK][D + 1];
  __shared__ float sv[BK][D + 1];
  __shared__ float sp[BQ][BK + 1];

  const int h = static_cast<int>(blockIdx.y);
  const detail::PrefillSeq ps(p, static_cast<int>(blockIdx.z), h);
  const int tid = static_cast<int>(threadIdx.x);
  const int i = tid >> 2;  // query row of the tile
  const int kq = tid & 3;  // this lane's quarter
  const int q_begin = ps.q_begin, count = ps.count, start = ps.start, cap = ps.cap;

  for (int tile = static_cast<int>(blockIdx.x); tile * BQ < count; tile += static_cast<int>(gridDim.x)) {
    const int q0 = tile * BQ;
    const int nq = min(BQ, count - q0);
    __syncthreads();  // the previous tile's readers of sq are done
    for (int idx = tid; idx < BQ * VPR; idx += kThreads) {
      const int r = idx / VPR, c = idx % VPR;
      float f[8] = {};
      if (r < nq) {
        const uint4 raw = *reinterpret_cast<const uint4*>(
            p.q + static_cast<std::size_t>(q_begin + q0 + r) * p.q_stride + static_cast<std::size_t>(h) * D + c * 8);
        unpack8_to(raw, f, p.scale_log2);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) sq[r][c * 8 + j] = f[j];
    }
    const bool row_valid = i < nq;
    const int qpos = start + q0 + i;
    const int last = min(start + q0 + nq - 1, cap - 1);  // the tile's last visible position

    float m = kNegInf, l = 0.0f;
    float o[DPT];
#pragma unroll
    for (int d = 0; d < DPT; ++d) o[d] = 0.0f;

    for (int k0 = 0; k0 <= last; k0 += BK) {
      __syncthreads();  // the previous K/V tile is consumed (and sq is written, on the first pass)
      for (int idx = tid; idx < BK * VPR; idx += kThreads) {
        const int r = idx / VPR, c = idx % VPR;
        const int kp = k0 + r;
        float kf[8] = {}, vf[8] = {};
        if (kp <= last) {
          const std::size_t off = ps.kv_offset(p, kp, D) + c * 8;  // values
          if constexpr (kFp8) {
            unpack8_to(kv_fp8::widen8(__ldg(reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(p.k) + off))), kf, 1.0f);
            unpack8_to(kv_fp8::widen8(__ldg(reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(p.v) + off))), vf, 1.0f);
          } else {
            unpack8_to(__ldg(reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p.k) + off)), kf, 1.0f);
            unpack8_to(__ldg(reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p.v) + off)), vf, 1.0f);
          }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          sk[r][c * 8 + j] = kf[j];
          sv[r][c * 8 + j] = vf[j];
        }
      }
      __syncthreads();

      float s[KPT];
#pragma unroll
      for (int jj = 0; jj < KPT; ++jj) s[jj] = 0.0f;
#pragma unroll 8
      for (int d = 0; d < D; ++d) {
        const float qv = sq[i][d];
#pragma unroll
        for (int jj = 0; jj < KPT; ++jj) s[jj] = fmaf(qv, sk[kq + 4 * jj][d], s[jj]);
      }
      float mx = m;
#pragma unroll
      for (int jj = 0; jj < KPT; ++jj) {
        const bool visible = row_valid && k0 + kq + 4 * jj <= qpos;
        s[jj] = visible ? s[jj] : kNegInf;
        mx = fmaxf(mx, s[jj]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float corr = m == kNegInf ? 0.0f : exp2f(m - mx);
      float sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < KPT; ++jj) {
        const float e = s[jj] == kNegInf ? 0.0f : exp2f(s[jj] - mx);
        sp[i][kq + 4 * jj] = e;
        sum += e;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l = fmaf(l, corr, sum);
      m = mx;
      __syncwarp();  // a row's probabilities are written and read by its own 4 lanes
#pragma unroll
      for (int d = 0; d < DPT; ++d) o[d] *= corr;
#pragma unroll 4
      for (int j = 0; j < BK; ++j) {
        const float pj = sp[i][j];
#pragma unroll
        for (int d = 0; d < DPT; ++d) o[d] = fmaf(pj, sv[j][kq + 4 * d], o[d]);
      }
    }

    if (row_valid) {
      const float inv = l > 0.0f ? 1.0f / l * p.v_scale : 0.0f;
      std::uint16_t* dst = p.out + (static_cast<std::size_t>(q_begin + q0 + i) * p.num_heads + h) * D;
#pragma unroll
      for (int d = 0; d < DPT; ++d) dst[kq + 4 * d] = f32_to_bf16(o[d] * inv);
    }
  }
}


// ---- tensor-core kernel -------------------------------------------------------------------------------

/// Tile shape of the tensor-core kernel for head_dim D and MT m16 tiles per warp (CUB-style constants).
template <int D, int MT>
struct TcTile {
  static_assert(D == 64 || D == 128, "the tensor-core prefill kernel is built for head_dim 64 and 128");
  static_assert(MT == 1 || MT == 2, "one or two m16 tiles of queries per warp");
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowsPerWarp = 16 * MT;
  static constexpr int kBQ = kWarps * kRowsPerWarp;  ///< queries per thread block
  static constexpr int kBK = 64;                      ///< K/V positions per tile
  static constexpr int kStages = 2;                   ///< K/V double buffer
  static constexpr int kChunks = D / 8;               ///< 16-byte chunks per row
  static constexpr int kRowBytes = D * 2 + 16;  ///< padded shared row
  static constexpr int kQBytes = kBQ * kRowBytes;
  static constexpr int kKvTileBytes = kBK * kRowBytes;
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvTileBytes;  ///< Q + K and V double buffers
  /// Q fragments in registers when they are at most 32 registers a thread (MT·D/4), else ldmatrix'd from
  /// shared memory at every tile (MT 2, D 128: 128 accumulators + 64 scores leave no room for 64 more).
  static constexpr bool kQInRegs = MT * D <= 128;
  static_assert((kBK * kChunks) % kThreads == 0 && kThreads % kChunks == 0, "K/V tile copy mapping");
};

/// Byte offset of 16-byte chunk `c` of row `r` in a padded [rows][D] bf16 shared tile: 8 rows at one chunk
/// are 4 banks apart (stride D/2 + 4 words), so ldmatrix phases and the C-layout stores are conflict-free.
template <int D>
__device__ __forceinline__ std::uint32_t tile_off(int r, int c) {
  return static_cast<std::uint32_t>(r * (D * 2 + 16) + c * 16);
}

template <int D, int MT, bool kFp8>
__global__ void __launch_bounds__(kThreads, 2) paged_prefill_tc_kernel(const PrefillParams p) {
  using T = TcTile<D, MT>;
  using detail::cp_async_16;
  using detail::fast_exp2;
  using detail::ldmatrix_x4;
  using detail::ldmatrix_x4_trans;
  using detail::mma_m16n8k16_bf16;
  using detail::pack_bf16x2;
  constexpr int BQ = T::kBQ;
  constexpr int BK = T::kBK;
  constexpr int WM = T::kRowsPerWarp;
  constexpr int NC = T::kChunks;
  constexpr int NT = BK / 8;   // n8 tiles of S per m16 tile
  constexpr int DT = D / 8;    // n8 tiles of O per m16 tile
  constexpr int KS = D / 16;   // k16 steps of Q·Kᵀ
  constexpr int kValueBytes = kFp8 ? 1 : 2;  // of one cached value
  // FP8: 16-byte chunks of codes per row, and each thread's share of a tile's.
  constexpr int NC8 = D / 16;
  constexpr int KV8_PER_THREAD = BK * NC8 / kThreads;
  constexpr int KV8_ROW_STEP = kThreads / NC8;
  static_assert((BK * NC8) % kThreads == 0 && kThreads % NC8 == 0, "FP8 K/V tile copy mapping");

  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t sq = detail::smem_u32(smem);
  const std::uint32_t sk = sq + T::kQBytes;
  const std::uint32_t sv = sk + T::kStages * T::kKvTileBytes;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;   // mma group: rows g and g + 8 of each m16 tile
  const int tq = lane & 3;   // thread in the group: columns 2tq, 2tq + 1 of each n8 tile
  const int wr0 = warp * WM;  // the warp's first row in the query tile
  // Heads vary fastest in launch order (a GQA group's heads read the same K/V while it is in L2), and the
  // query tiles come last to first: the longest causal rows start first and the short ones fill the tail.
  const int h = static_cast<int>(blockIdx.x);
  const int slots = static_cast<int>(gridDim.z);
  const detail::PrefillSeq ps(p, static_cast<int>(blockIdx.y), h);
  const int q_begin = ps.q_begin, start = ps.start;

  for (int tile = slots - 1 - static_cast<int>(blockIdx.z); tile * BQ < ps.count; tile += slots) {
    const detail::PrefillTile qt(ps, tile, BQ, BK);
    const int q0 = qt.q0, nq = qt.nq, last = qt.last, diag = qt.diag, n_tiles = qt.n_tiles;
    // The warp's own last visible position: a K/V tile starting past it contributes nothing to its rows.
    const int warp_last = min(start + q0 + wr0 + WM - 1, last);
    __syncthreads();  // the previous query tile's readers of sQ / sK / sV are done

    // The warp's Q rows -> sQ (rows past the chunk zero-filled, never read from global memory).
    for (int i = lane; i < WM * NC; i += 32) {
      const int r = wr0 + i / NC, c = i % NC;
      const bool ok = r < nq;
      const std::uint16_t* src =
          ok ? p.q + static_cast<std::size_t>(q_begin + q0 + r) * p.q_stride + static_cast<std::size_t>(h) * D + c * 8 : p.q;
      cp_async_16(sq + tile_off<D>(r, c), src, ok);
    }
    detail::cp_async_commit();

    // K/V tile `t` -> stage `st` (only called with last >= 0). Each thread copies the same chunk column of
    // BK · chunks / kThreads rows. Positions past `last` are zero-filled (their scores are masked, and 0·0 adds
    // nothing to O): branch-free, their address is that of position `last`, and nothing is read from it.
    // FP8: chunk c of a row's codes lands in the row's upper half (bytes D + 16 + 16c: the row is D·2 + 16
    // bytes), widened into the bf16 half by widen_kv.
    // The cache row (all KV heads) of tile t's row r, in values from the layer's start to this KV head's, and
    // whether it is a position the tile may see.
    const auto head_row = [&](int t, int r, bool& ok) {
      const int kp = t * BK + r;
      ok = kp <= last;
      return ps.kv_offset(p, min(kp, last), D);
    };
    const auto load_kv = [&](int t, int st) {
      constexpr int kRowChunks = kFp8 ? NC8 : NC;  // 16-byte chunks of a row in the cache
      const int c = tid % kRowChunks;
#pragma unroll
      for (int i = 0; i < BK * kRowChunks / kThreads; ++i) {
        const int r = tid / kRowChunks + i * (kThreads / kRowChunks);
        bool ok;
        const std::size_t off = (head_row(t, r, ok) + c * (16 / kValueBytes)) * kValueBytes;  // bytes
        const std::uint32_t so = static_cast<std::uint32_t>(st * T::kKvTileBytes) +
                                 (kFp8 ? static_cast<std::uint32_t>(r * (D * 2 + 16) + D + 16 + c * 16) : tile_off<D>(r, c));
        cp_async_16(sk + so, static_cast<const unsigned char*>(p.k) + off, ok);
        cp_async_16(sv + so, static_cast<const unsigned char*>(p.v) + off, ok);
      }
    };
    // FP8: stage `st`'s codes -> its bf16 rows. Each thread widens the chunks it copied itself (complete after
    // its cp_async_wait); the barrier between the reads and the writes is there because a row's bf16 half
    // overlaps other threads' codes.
    const auto widen_kv = [&](int st) {
      const int c = tid % NC8;
      uint4 kc[KV8_PER_THREAD], vc[KV8_PER_THREAD];
#pragma unroll
      for (int i = 0; i < KV8_PER_THREAD; ++i) {
        const int r = tid / NC8 + i * KV8_ROW_STEP;
        const int so = st * T::kKvTileBytes + r * (D * 2 + 16) + D + 16 + c * 16;
        kc[i] = *reinterpret_cast<const uint4*>(smem + T::kQBytes + so);
        vc[i] = *reinterpret_cast<const uint4*>(smem + T::kQBytes + T::kStages * T::kKvTileBytes + so);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < KV8_PER_THREAD; ++i) {
        const int r = tid / NC8 + i * KV8_ROW_STEP;
        unsigned char* kd = smem + T::kQBytes + st * T::kKvTileBytes + tile_off<D>(r, 2 * c);
        unsigned char* vd = kd + T::kStages * T::kKvTileBytes;
        *reinterpret_cast<uint4*>(kd) = kv_fp8::widen8(make_uint2(kc[i].x, kc[i].y));
        *reinterpret_cast<uint4*>(kd + 16) = kv_fp8::widen8(make_uint2(kc[i].z, kc[i].w));
        *reinterpret_cast<uint4*>(vd) = kv_fp8::widen8(make_uint2(vc[i].x, vc[i].y));
        *reinterpret_cast<uint4*>(vd + 16) = kv_fp8::widen8(make_uint2(vc[i].z, vc[i].w));
      }
      __syncthreads();
    };
    if (n_tiles > 0) load_kv(0, 0);
    detail::cp_async_commit();

    // Q fragments (A operand, row-major 16x16 per (m16 tile, k16 step)): lane l addresses row l % 16 and
    // chunk l / 16 of the step, so matrices 0..3 are (rows 0-7, d 0-7), (rows 8-15, d 0-7), (rows 0-7,
    // d 8-15), (rows 8-15, d 8-15) = a0..a3.
    std::uint32_t qf[T::kQInRegs ? MT : 1][T::kQInRegs ? KS : 1][4];
    if constexpr (T::kQInRegs) {
      detail::cp_async_wait<1>();  // the Q group (the K/V group of tile 0 may still be in flight)
      __syncwarp();                // the warp's Q rows were copied by its own lanes
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < KS; ++kk)
          ldmatrix_x4(qf[mt][kk], sq + tile_off<D>(wr0 + mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
    }

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];  // per row half (g, g + 8): running max (log2 domain), this thread's partial sum
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int j = 0; j < DT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][j][e] = 0.0f;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        m[mt][hh] = kNegInf;
        l[mt][hh] = 0.0f;
      }
    }

    // One barrier per K/V tile: after it, tile t (and Q) is visible to all, and every warp is done with
    // tile t - 1, whose stage then takes tile t + 1 while tile t is used.
    for (int t = 0; t < n_tiles; ++t) {
      const int st = t & 1;
      detail::cp_async_wait<0>();  // this thread's copies of tile t (the only group in flight)
      __syncthreads();
      if (t + 1 < n_tiles) load_kv(t + 1, st ^ 1);
      detail::cp_async_commit();
      if constexpr (kFp8) widen_kv(st);

      const int kv0 = t * BK;
      if (kv0 <= warp_last) {  // warp-uniform
        const std::uint32_t kb = sk + static_cast<std::uint32_t>(st * T::kKvTileBytes);
        const std::uint32_t vb = sv + static_cast<std::uint32_t>(st * T::kKvTileBytes);

        // S = Q·Kᵀ. B operand of n8 tile j (positions 8j..8j+7) for a k16 step: b0 = K rows (pos) x d 0-7,
        // b1 = d 8-15, both non-transposed 8x8 loads of [pos][d]. One x4 covers n8 tiles 2np and 2np + 1:
        // lane l addresses position 16np + 8(l / 16) + l % 8 and chunk (l / 8) % 2 of the step, so matrices
        // 0..3 are b0, b1 of tile 2np and b0, b1 of tile 2np + 1.
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          std::uint32_t a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if constexpr (T::kQInRegs) {
#pragma unroll
              for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kk][e];
            } else {
              ldmatrix_x4(a[mt], sq + tile_off<D>(wr0 + mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
            }
          }
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            std::uint32_t b[4];
            ldmatrix_x4(b, kb + tile_off<D>(np * 16 + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_m16n8k16_bf16(s[mt][2 * np], a[mt], b[0], b[1]);
              mma_m16n8k16_bf16(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
          }
        }

        // Scale (f32, log2 domain), then mask where the tile crosses the diagonal: s[mt][j][e] is row
        // wr0 + 16mt + g + 8(e / 2), position kv0 + 8j + 2tq + e % 2; a row sees positions <= min(qpos, last).
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][j][e] *= p.scale_log2;
        if (kv0 + BK - 1 > diag) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int lim = min(start + q0 + wr0 + mt * 16 + g + ((e >> 1) << 3), last);
#pragma unroll
              for (int j = 0; j < NT; ++j)
                if (kv0 + j * 8 + tq * 2 + (e & 1) > lim) s[mt][j][e] = kNegInf;
            }
        }

        // Online softmax per row half. The quad (same g) holds the whole row: max over its 4 lanes. P is
        // packed to bf16 pairs at once (pk[mt][j][hh] = row half hh of n8 tile j), so the f32 scores die here.
        std::uint32_t pk[MT][NT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            float mx = m[mt][hh];
#pragma unroll
            for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hh], s[mt][j][2 * hh + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // A row with nothing visible yet keeps max -inf: exponentiate against 0 so that -inf - -inf
            // never makes a NaN (every p is 0 then, and so is the correction of the empty state).
            const float mu = mx == kNegInf ? 0.0f : mx;
            const float corr = fast_exp2(m[mt][hh] - mu);
            m[mt][hh] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              const float p0 = fast_exp2(s[mt][j][2 * hh] - mu);
              const float p1 = fast_exp2(s[mt][j][2 * hh + 1] - mu);
              sum += p0 + p1;  // the f32 values: the bf16 rounding of P is bounded in the tests
              pk[mt][j][hh] = detail::pack_bf16x2(p0, p1);
            }
            l[mt][hh] = fmaf(l[mt][hh], corr, sum);
#pragma unroll
            for (int j = 0; j < DT; ++j) {
              o[mt][j][2 * hh] *= corr;
              o[mt][j][2 * hh + 1] *= corr;
            }
          }

        // O += P·V. A operand of k16 step kk (positions 16kk..16kk+15) from the accumulators of n8 tiles
        // 2kk (a0 = row g, a1 = row g + 8) and 2kk + 1 (a2, a3), rounded to bf16 above. B operand of O's n8 tile
        // j (d 8j..8j+7): b0 = V rows 16kk + 2tq, +1 at column g (a transposed 8x8 load of [pos][d]), b1 =
        // rows + 8. One x4.trans covers d tiles 2dp and 2dp + 1: lane l addresses position 16kk + l % 16 and
        // chunk 2dp + l / 16, so matrices 0..3 are b0, b1 of tile 2dp and b0, b1 of tile 2dp + 1.
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          std::uint32_t a[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            a[mt][0] = pk[mt][2 * kk][0];
            a[mt][1] = pk[mt][2 * kk][1];
            a[mt][2] = pk[mt][2 * kk + 1][0];
            a[mt][3] = pk[mt][2 * kk + 1][1];
          }
#pragma unroll
          for (int dp = 0; dp < DT / 2; ++dp) {
            std::uint32_t b[4];
            ldmatrix_x4_trans(b, vb + tile_off<D>(kk * 16 + (lane & 15), dp * 2 + (lane >> 4)));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_m16n8k16_bf16(o[mt][2 * dp], a[mt], b[0], b[1]);
              mma_m16n8k16_bf16(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
            }
          }
        }
      }
    }

    // O / l -> the warp's own rows of sQ (bf16, C layout: row g / g + 8, d 8j + 2tq, +1) -> 16-byte stores.
    detail::cp_async_wait<0>();  // with no K/V tile at all, the Q copy may still be in flight
    __syncwarp();  // and the warp's last ldmatrix reads of its Q rows are done (the Q-in-shared variant)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float sum = l[mt][hh];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = sum > 0.0f ? 1.0f / sum * p.v_scale : 0.0f;
        const int r = wr0 + mt * 16 + g + hh * 8;
#pragma unroll
        for (int j = 0; j < DT; ++j)
          *reinterpret_cast<std::uint32_t*>(smem + tile_off<D>(r, j) + tq * 4) =
              pack_bf16x2(o[mt][j][2 * hh] * inv, o[mt][j][2 * hh + 1] * inv);
      }
    __syncwarp();
    for (int i = lane; i < WM * NC; i += 32) {
      const int r = wr0 + i / NC, c = i % NC;
      if (r < nq) {
        const uint4 val = *reinterpret_cast<const uint4*>(smem + tile_off<D>(r, c));
        *reinterpret_cast<uint4*>(p.out + (static_cast<std::size_t>(q_begin + q0 + r) * p.num_heads + h) * D + c * 8) =
            val;
      }
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------------

std::atomic<int> g_path{static_cast<int>(PrefillPath::automatic)};

/// INFER_PREFILL_ATTENTION, read once.
PrefillPath env_path() {
  static const PrefillPath path = [] {
    const char* v = std::getenv("INFER_PREFILL_ATTENTION");
    if (v == nullptr) return PrefillPath::tensor_cores_wgmma;
    if (std::strcmp(v, "cuda_cores") == 0 || std::strcmp(v, "fallback") == 0) return PrefillPath::cuda_cores;
    if (std::strcmp(v, "tc64") == 0) return PrefillPath::tensor_cores_q64;
    if (std::strcmp(v, "tc128") == 0) return PrefillPath::tensor_cores_q128;
    return PrefillPath::tensor_cores_wgmma;
  }();
  return path;
}

PrefillPath resolve_path() {
  const auto p = static_cast<PrefillPath>(g_path.load(std::memory_order_relaxed));
  return p == PrefillPath::automatic ? env_path() : p;
}

/// Opts a kernel instance into its dynamic shared memory (> 48 KB) once per device.
template <int D, int MT, bool kFp8>
cudaError_t prepare_tc_kernel() {
  static backend::cuda::PerDevice prepared;
  return prepared.once([] {
    const auto kernel = paged_prefill_tc_kernel<D, MT, kFp8>;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             TcTile<D, MT>::kSmemBytes);
        e != cudaSuccess)
      return e;
    // A hint: the largest shared-memory carveout, so that two thread blocks fit on an SM.
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  });
}

template <int D, int MT, bool kFp8>
cudaError_t launch_tc(const PrefillParams& p, int num_seqs, std::int64_t cap, cudaStream_t stream) {
  using T = TcTile<D, MT>;
  if (cudaError_t e = prepare_tc_kernel<D, MT, kFp8>(); e != cudaSuccess) return e;
  std::int64_t tiles = (cap + T::kBQ - 1) / T::kBQ;
  if (tiles > kMaxGridX) tiles = kMaxGridX;
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs), static_cast<unsigned>(tiles));
  paged_prefill_tc_kernel<D, MT, kFp8><<<grid, kThreads, T::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <bool kFp8>
cudaError_t launch_cuda_cores(const PrefillParams& p, int head_dim, int num_seqs, std::int64_t cap,
                              cudaStream_t stream) {
  std::int64_t tiles = (cap + kTileQ - 1) / kTileQ;
  if (tiles > kMaxGridX) tiles = kMaxGridX;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs));
  if (head_dim == 64) paged_prefill_cuda_core_kernel<64, kFp8><<<grid, kThreads, 0, stream>>>(p);
  else paged_prefill_cuda_core_kernel<128, kFp8><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

const char* path_name(PrefillPath path) {
  switch (path) {
    case PrefillPath::cuda_cores: return "CUDA cores";
    case PrefillPath::tensor_cores_q64: return "tensor cores, 64-query tiles";
    case PrefillPath::tensor_cores_wgmma: return "tensor cores, wgmma";
    default: return "tensor cores, 128-query tiles";
  }
}

}  // namespace

PrefillPath set_paged_prefill_path(PrefillPath path) {
  return static_cast<PrefillPath>(g_path.exchange(static_cast<int>(path), std::memory_order_relaxed));
}

void paged_prefill_attention(const PagedKvBatch& batch, const std::uint16_t* q, const std::int32_t* q_indptr,
                             const std::int32_t* q_start, int num_heads, float scale, std::uint16_t* out,
                             void* stream, std::int64_t q_row_stride) {
  using infer::detail::cat;
  const PagedKvBatch& b = batch;
  if (b.num_seqs < 0 || b.num_seqs > 65535)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: num_seqs = ", b.num_seqs, " must be in [0, 65535]"));
  if (b.head_dim != 64 && b.head_dim != 128)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: head_dim = ", b.head_dim,
                              " is not supported; the kernels are built for 64 and 128"));
  if (b.num_kv_heads <= 0 || num_heads <= 0 || num_heads > 65535 || num_heads % b.num_kv_heads != 0)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: num_heads = ", num_heads, ", num_kv_heads = ",
                              b.num_kv_heads, "; both must be positive and num_kv_heads must divide num_heads"));
  if (b.block_size <= 0 || b.block_size > 1024 || (b.block_size & (b.block_size - 1)) != 0)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: block_size = ", b.block_size,
                              " must be a power of two in [1, 1024]"));
  if (b.max_blocks_per_seq <= 0 || static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size > (std::int64_t{1} << 30))
    throw InvalidArgument(cat("cuda::paged_prefill_attention: max_blocks_per_seq = ", b.max_blocks_per_seq,
                              " must be positive and cover at most 2^30 positions"));
  const bool fp8 = b.kv_dtype == KvCacheDtype::fp8_e4m3;
  if (fp8) require_kv_scales("cuda::paged_prefill_attention", b.k_scale, b.v_scale);
  if (b.num_seqs == 0) return;
  if (!b.k || !b.v || !b.block_tables || !q || !q_indptr || !q_start || !out)
    throw InvalidArgument(cat("cuda::paged_prefill_attention: null ",
                              !b.k              ? "K"
                              : !b.v            ? "V"
                              : !b.block_tables ? "block_tables"
                              : !q              ? "q"
                              : !q_indptr       ? "q_indptr"
                              : !q_start        ? "q_start"
                                                : "out",
                              " pointer"));
  const auto misaligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(b.k) || misaligned(b.v) || misaligned(q))
    throw InvalidArgument("cuda::paged_prefill_attention: K, V and q must be 16-byte aligned (16-byte loads)");
  const std::int64_t dense = static_cast<std::int64_t>(num_heads) * b.head_dim;
  if (q_row_stride != 0 && (q_row_stride < dense || q_row_stride % 8 != 0))
    throw InvalidArgument(cat("cuda::paged_prefill_attention: q_row_stride = ", q_row_stride, " must be 0 or a multiple",
                              " of 8 of at least num_heads * head_dim = ", dense));

  PrefillParams p{};
  p.k = b.k;
  p.v = b.v;
  p.tables = b.block_tables;
  p.q_indptr = q_indptr;
  p.q_start = q_start;
  p.q = q;
  p.q_stride = q_row_stride != 0 ? q_row_stride : dense;
  p.out = out;
  p.max_blocks = b.max_blocks_per_seq;
  int shift = 0;
  while ((1 << shift) < b.block_size) ++shift;
  p.block_shift = shift;
  p.kv_heads = b.num_kv_heads;
  p.num_heads = num_heads;
  p.group = num_heads / b.num_kv_heads;
  p.scale_log2 = scale * kLog2e * (fp8 ? b.k_scale : 1.0f);
  p.v_scale = fp8 ? b.v_scale : 1.0f;

  // The chunk lengths stay on the device: size the grid from the longest chunk a sequence can hold;
  // blocks past their chunk's end exit at once, and the kernels grid-stride beyond kMaxGridX tiles.
  const std::int64_t cap = static_cast<std::int64_t>(b.max_blocks_per_seq) * b.block_size;
  PrefillPath path = resolve_path();
  if (misaligned(out)) path = PrefillPath::cuda_cores;  // the tensor-core kernels store 16 bytes at a time
  // wgmma: Hopper (compute capability 9.0) only, and a bf16 cache; else the mma.sync kernel's 128-query tiles.
  if (path == PrefillPath::tensor_cores_wgmma && (fp8 || !detail::prefill_wgmma_runs_here()))
    path = PrefillPath::tensor_cores_q128;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaSuccess;
  const auto tc = [&]<int MT, bool kFp8>() {
    return b.head_dim == 64 ? launch_tc<64, MT, kFp8>(p, b.num_seqs, cap, s) : launch_tc<128, MT, kFp8>(p, b.num_seqs, cap, s);
  };
  switch (path) {
    case PrefillPath::cuda_cores:
      err = fp8 ? launch_cuda_cores<true>(p, b.head_dim, b.num_seqs, cap, s)
                : launch_cuda_cores<false>(p, b.head_dim, b.num_seqs, cap, s);
      break;
    case PrefillPath::tensor_cores_q64:
      err = fp8 ? tc.template operator()<1, true>() : tc.template operator()<1, false>();
      break;
    case PrefillPath::tensor_cores_wgmma:
      err = detail::launch_prefill_wgmma(p, b.head_dim, b.num_seqs, cap, s);
      break;
    default:
      err = fp8 ? tc.template operator()<2, true>() : tc.template operator()<2, false>();
      break;
  }
  if (err != cudaSuccess)
    throw DeviceError(cat("cuda::paged_prefill_attention(", b.num_seqs, " sequences, ", num_heads, "/",
                          b.num_kv_heads, " heads of ", b.head_dim, ", ", path_name(path), "): kernel launch failed: ", cudaGetErrorName(err),
                          ": ", cudaGetErrorString(err)));
}

}  // namespace infer::kernels::cuda
