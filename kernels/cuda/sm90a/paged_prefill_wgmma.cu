// The paged prefill attention on Hopper's warpgroup MMA (wgmma, sm_90a): flash-attention with both products
// on wgmma, for a bf16 cache and head_dim 64 or 128. Compiled for sm_90a alone (kernels/CMakeLists.txt).
//
// Why: at 2,048 tokens the mma.sync kernel (paged_prefill_attention.cu) runs at ~245 TFLOP/s on an H200,
// 4.5 ms of a 47 ms time to first token, a quarter of the bf16 peak; mma.sync cannot issue Hopper's tensor
// cores at their full rate, wgmma can.
//
// Shape: a thread block of two warpgroups takes BQ = 128 queries of one (sequence, query head); warpgroup w
// owns rows 64w..64w+63. K/V are walked in tiles of BK = 64 positions up to the tile's last visible position,
// gathered through the block table by cp.async (16 bytes a row chunk, zero fill past the last position) into
// a double buffer, in the 128-byte-swizzled panels wgmma reads (wgmma_bf16.cuh). Per K/V tile and warpgroup:
//   S (64 x 64, f32 registers) = Q·Kᵀ         wgmma m64n64k16, Q and K from shared memory (K-major);
//   online softmax on S in the registers (f32, log2 domain; the quad that shares a row reduces its max);
//   O (64 x D, f32 registers) += P·V         wgmma m64nDk16, P rounded to bf16 in registers (the A layout
//                                            is S's C layout), V from shared memory (MN-major, transposed).
// Only tiles that cross the diagonal are masked; a warpgroup skips a tile none of its rows can see. The
// numerics are the mma.sync kernel's: the same f32 scores and sums, P rounded to bf16 once.
//
// Two thread blocks an SM (registers capped at 128 a thread; D = 128 spills 20 bytes): the warpgroups of one
// block run their products and softmax in step (one barrier per tile), so the other block's fill the tensor
// cores' idle time. Measured on an H100 (2026-12-07, bench/results/gpu-2026-12-07e): 326 TFLOP/s at 2,048
// tokens (a Llama-3-8B layer) against 289 at one block an SM and 242 for the mma.sync kernel; 406 against 343
// and 289 at 4 x 4,096. Flash-attention 3's overlap inside a warpgroup (S_j issued with P_{j-1}·V_{j-1}, K/V in
// three stages, one block an SM) measured 232 and 279: slower, not kept.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "infer/backend/cuda_runtime.hpp"
#include "../mma_bf16.cuh"
#include "../paged_prefill.cuh"
#include "../wgmma_bf16.cuh"

namespace infer::kernels::cuda::detail {
namespace {

constexpr int kThreads = 256;  // two warpgroups
constexpr int kMaxGridZ = 4096;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <int D>
struct WgTile {
  static_assert(D == 64 || D == 128, "the wgmma prefill kernel is built for head_dim 64 and 128");
  static constexpr int kBlocks = 2;                    ///< thread blocks an SM holds
  static constexpr int kStages = 2;                    ///< K/V tiles resident at once (a double buffer)
  static constexpr int kBQ = 128;                      ///< queries per thread block
  static constexpr int kBK = 64;                       ///< K/V positions per tile
  static constexpr int kPanels = D / 64;               ///< 128-byte panels of a row
  static constexpr int kChunks = D / 8;                ///< 16-byte chunks of a row
  static constexpr int kQPanel = kBQ * 128;            ///< bytes of one panel of Q
  static constexpr int kKvPanel = kBK * 128;           ///< bytes of one panel of a K or V tile
  static constexpr int kQBytes = kPanels * kQPanel;
  static constexpr int kKvBytes = kPanels * kKvPanel;  ///< one K (or V) tile
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + 1024;  ///< Q, K and V stages, alignment
  static_assert((kBK * kChunks) % kThreads == 0 && kThreads % kChunks == 0, "K/V tile copy mapping");
};

/// Byte offset of 16-byte chunk `c` of row `r` in a swizzled tile of `rows` rows (panels of 64 values).
template <int kRows>
__device__ __forceinline__ std::uint32_t sw_off(int r, int c) {
  return static_cast<std::uint32_t>((c >> 3) * kRows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

template <int D>
__global__ void __launch_bounds__(kThreads, WgTile<D>::kBlocks) paged_prefill_wgmma_kernel(const PrefillParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = WgTile<D>;
  constexpr int BQ = T::kBQ;
  constexpr int BK = T::kBK;
  constexpr int NC = T::kChunks;
  constexpr int NT = BK / 8;  // n8 tiles of S
  constexpr int DT = D / 8;   // n8 tiles of O
  constexpr int KS = D / 16;  // k16 steps of Q·Kᵀ
  constexpr int STAGES = T::kStages;

  extern __shared__ unsigned char smem_raw[];
  const std::uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u;  // panels on the swizzle period
  const std::uint32_t sk = sq + T::kQBytes;
  const std::uint32_t sv = sk + STAGES * T::kKvBytes;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wg = warp >> 2;  // warpgroup: query rows 64wg..64wg+63
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int r0 = wg * 64 + (warp & 3) * 16 + g;  // this thread's rows of the tile: r0 and r0 + 8
  const int h = static_cast<int>(blockIdx.x);
  const int slots = static_cast<int>(gridDim.z);
  const PrefillSeq ps(p, static_cast<int>(blockIdx.y), h);
  const int q_begin = ps.q_begin, start = ps.start;

  // Query tiles last to first: the longest causal rows start first and the short ones fill the tail.
  for (int tile = slots - 1 - static_cast<int>(blockIdx.z); tile * BQ < ps.count; tile += slots) {
    const PrefillTile qt(ps, tile, BQ, BK);
    const int q0 = qt.q0, nq = qt.nq, last = qt.last, diag = qt.diag, n_tiles = qt.n_tiles;
    // The K/V tiles this warpgroup computes: those starting at or before its last visible position; none where
    // all its rows lie past the chunk.
    const int wg_last = wg * 64 < nq ? min(start + q0 + wg * 64 + 63, last) : -1;
    const int n_wg = wg_last < 0 ? 0 : wg_last / BK + 1;
    __syncthreads();  // the previous query tile's readers of sQ / sK / sV are done

    for (int i = tid; i < BQ * NC; i += kThreads) {  // Q rows (rows past the chunk zero-filled)
      const int r = i / NC, c = i % NC;
      const bool ok = r < nq;
      const std::uint16_t* src =
          ok ? p.q + static_cast<std::size_t>(q_begin + q0 + r) * p.q_stride + static_cast<std::size_t>(h) * D + c * 8 : p.q;
      cp_async_16(sq + sw_off<BQ>(r, c), src, ok);
    }
    cp_async_commit();

    // K/V tile t -> its stage: each thread copies one chunk column of BK · NC / kThreads rows; positions past
    // `last` are zero-filled from the address of position `last` (nothing is read).
    const auto load_kv = [&](int t) {
      const int c = tid % NC;
      const auto st = static_cast<std::uint32_t>(t % STAGES);
#pragma unroll
      for (int i = 0; i < BK * NC / kThreads; ++i) {
        const int r = tid / NC + i * (kThreads / NC);
        const int kp = t * BK + r;
        const bool ok = kp <= last;
        const std::size_t off = ps.kv_offset(p, min(kp, last), D) + c * 8;
        const std::uint32_t so = st * T::kKvBytes + sw_off<BK>(r, c);
        cp_async_16(sk + so, static_cast<const std::uint16_t*>(p.k) + off, ok);
        cp_async_16(sv + so, static_cast<const std::uint16_t*>(p.v) + off, ok);
      }
    };
    if (n_tiles > 0) load_kv(0);
    cp_async_commit();

    float o[DT * 4];
#pragma unroll
    for (int i = 0; i < DT * 4; ++i) o[i] = 0.0f;
    float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};  // rows r0, r0 + 8: running max (log2), partial sum

    // S += Q·K_tᵀ, issued (the caller zeroes S and fences before, commits and waits after).
    const auto issue_scores = [&](int t, float (&s)[NT * 4]) {
      const std::uint32_t qa = sq + static_cast<std::uint32_t>(wg * 64 * 128);
      const std::uint32_t kb = sk + static_cast<std::uint32_t>((t % STAGES) * T::kKvBytes);
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        const auto panel = static_cast<std::uint32_t>(kk >> 2), within = static_cast<std::uint32_t>((kk & 3) * 32);
        wgmma::mma_m64n64k16_ss(s, wgmma::desc_sw128(qa + panel * T::kQPanel + within, 16, 1024),
                                wgmma::desc_sw128(kb + panel * T::kKvPanel + within, 16, 1024));
      }
    };
    // O += P·V_t, issued: k16 step kk = positions 16kk..16kk+15, A from S's n8 tiles 2kk and 2kk + 1.
    const auto issue_pv = [&](int t, const std::uint32_t (&pk)[NT][2]) {
      const std::uint32_t vb = sv + static_cast<std::uint32_t>((t % STAGES) * T::kKvBytes);
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const std::uint32_t a[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
        const std::uint64_t dv = wgmma::desc_sw128(vb + static_cast<std::uint32_t>(kk * 16 * 128), T::kKvPanel, 1024);
        if constexpr (D == 128) wgmma::mma_m64n128k16_rs_tb(o, a, dv);
        else wgmma::mma_m64n64k16_rs_tb(o, a, dv);
      }
    };
    // The online softmax of tile t's scores: scale (f32, log2 domain), mask where the tile crosses the diagonal
    // (s[4j + e] is row r0 + 8(e / 2), position kv0 + 8j + 2tq + e % 2; a row sees positions <= min(its
    // position, last)), new row maxima (over the quad that shares a row), P packed to bf16 pairs (pk[j][hh]: row
    // half hh of n8 tile j), l updated. Returns O's correction per row half in corr; O itself is not touched.
    const auto softmax = [&](int t, float (&s)[NT * 4], std::uint32_t (&pk)[NT][2], float (&corr)[2]) {
      const int kv0 = t * BK;
#pragma unroll
      for (int i = 0; i < NT * 4; ++i) s[i] *= p.scale_log2;
      if (kv0 + BK - 1 > diag) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int lim = min(start + q0 + r0 + ((e >> 1) << 3), last);
#pragma unroll
          for (int j = 0; j < NT; ++j)
            if (kv0 + j * 8 + tq * 2 + (e & 1) > lim) s[4 * j + e] = kNegInf;
        }
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = m[hh];
#pragma unroll
        for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with nothing visible yet keeps max -inf: exponentiate against 0 (no -inf - -inf NaN).
        const float mu = mx == kNegInf ? 0.0f : mx;
        corr[hh] = fast_exp2(m[hh] - mu);
        m[hh] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const float p0 = fast_exp2(s[4 * j + 2 * hh] - mu);
          const float p1 = fast_exp2(s[4 * j + 2 * hh + 1] - mu);
          sum += p0 + p1;
          pk[j][hh] = pack_bf16x2(p0, p1);
        }
        l[hh] = fmaf(l[hh], corr[hh], sum);
      }
    };
    const auto rescale = [&](const float (&corr)[2]) {
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        o[4 * j + 0] *= corr[0];
        o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1];
        o[4 * j + 3] *= corr[1];
      }
    };

    // One barrier per K/V tile: after it, tile t is visible to all and every warpgroup is done with tile t - 1,
    // whose stage then takes tile t + 1 while tile t is used.
    for (int t = 0; t < n_tiles; ++t) {
      cp_async_wait<0>();  // this thread's copies of tile t (and of Q)
      wgmma::fence_proxy_async();
      __syncthreads();
      if (t + 1 < n_tiles) load_kv(t + 1);
      cp_async_commit();
      if (t < n_wg) {  // warpgroup-uniform
        float s[NT * 4];
#pragma unroll
        for (int i = 0; i < NT * 4; ++i) s[i] = 0.0f;
        wgmma::fence();
        issue_scores(t, s);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(s);
        std::uint32_t pk[NT][2];
        float corr[2];
        softmax(t, s, pk, corr);
        rescale(corr);
        wgmma::fence();
        issue_pv(t, pk);
        wgmma::commit();
        wgmma::wait<0>();
        wgmma::fence_operands(o);
#pragma unroll
        for (int j = 0; j < NT; ++j) wgmma::fence_operands(pk[j]);
      }
    }
    cp_async_wait<0>();  // with no K/V tile at all, the Q copy may still be in flight

    // O / l -> out, rows r0 and r0 + 8 (rows past the chunk not at all).
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float sum = l[hh];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum * p.v_scale : 0.0f;
      const int r = r0 + hh * 8;
      if (r < nq) {
        std::uint16_t* dst = p.out + (static_cast<std::size_t>(q_begin + q0 + r) * p.num_heads + h) * D + tq * 2;
#pragma unroll
        for (int j = 0; j < DT; ++j)
          *reinterpret_cast<std::uint32_t*>(dst + j * 8) = pack_bf16x2(o[4 * j + 2 * hh] * inv, o[4 * j + 2 * hh + 1] * inv);
      }
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for another architecture: launch_prefill_wgmma never launches it there
#endif
}

template <int D>
cudaError_t launch(const PrefillParams& p, int num_seqs, std::int64_t cap, cudaStream_t stream) {
  using T = WgTile<D>;
  const auto kernel = paged_prefill_wgmma_kernel<D>;
  static backend::cuda::PerDevice prepared;
  if (cudaError_t e = prepared.once([&] {
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes);
      });
      e != cudaSuccess)
    return e;
  std::int64_t tiles = (cap + T::kBQ - 1) / T::kBQ;
  if (tiles > kMaxGridZ) tiles = kMaxGridZ;
  const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(num_seqs), static_cast<unsigned>(tiles));
  kernel<<<grid, kThreads, T::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool prefill_wgmma_runs_here() {
  static backend::cuda::PerDevice memo;  // 1: runs, 2: does not
  return memo.value(
             [](int dev) {
               int major = 0, minor = 0;
               const bool runs = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                                 cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                                 major == 9 && minor == 0;
               return runs ? 1 : 2;
             },
             2) == 1;
}

cudaError_t launch_prefill_wgmma(const PrefillParams& p, int head_dim, int num_seqs, std::int64_t cap,
                                 cudaStream_t stream) {
  return head_dim == 64 ? launch<64>(p, num_seqs, cap, stream) : launch<128>(p, num_seqs, cap, stream);
}

}  // namespace infer::kernels::cuda::detail
