#pragma once
// What the streaming GEMVs (bf16_gemv.cu, fp8_linear.cu, int_linear.cu) share: a row group of kSplit warps reads
// interleaved 512-byte slices of the same kRows weight rows, so that a short matrix still launches enough
// warps to keep the H200's HBM busy, and the group's partial sums meet in shared memory in a fixed order.
//
// Why split: ncu at c9c0352 (bench/results/gpu-2026-12-05c) timed the batch-1 bf16 GEMVs alone; with one
// warp per row pair, Llama-3-8B's o, down and qkv projections launch 2,048-3,072 warps (16-23 per SM) and
// read 2.6-3.0 TB/s, where gate_up's 14,336 warps read 3.96 TB/s and the LM head's 64,128 warps 4.40: too
// few loads in flight per SM. The split depends on N and K only, never on M, so a row's summation order
// does not depend on the batch.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "chained_launch.cuh"

namespace infer::kernels::cuda::gemv_split {

/// What a GEMV does with its sums: store them, or SwiGLU them (a row group owns gate row i and up row i of a
/// stacked [gate; up] weight).
enum class Epilogue { store, swiglu };

constexpr int kWarps = 4;     // warps per block
constexpr int kMaxSplit = 4;  // warps per row group at most (kWarps / kSplit groups per block)
/// Warps a GEMV should launch: gate_up's 14,336 read at 3.96 TB/s; 2,048 read at 2.6.
constexpr std::int64_t kTargetWarps = 8192;

/// The largest split allowed, for the bf16 and FP8 GEMVs alike: kMaxSplit, or INFER_GEMV_MAX_SPLIT = 1 or 2
/// (read once), which exists to measure the split against one-warp groups in the same build (measured on
/// the H200 at 2162603 with `INFER_GEMV_MAX_SPLIT=1 infer-bench-latency ...`: +0.7% at bf16 batch 1).
inline int max_split() {
  static const int value = [] {
    const char* e = std::getenv("INFER_GEMV_MAX_SPLIT");
    const int k = e != nullptr ? std::atoi(e) : kMaxSplit;
    return k == 1 || k == 2 ? k : kMaxSplit;
  }();
  return value;
}

/// How the streaming GEMVs launch: chained (chained_launch.cuh), so that a GEMV's first wave is resident and
/// waiting while the norm, attention or quantization before it finishes, which hides its launch; or plain
/// (<<<>>>, after the previous kernel has drained) when INFER_GEMV_CHAIN=0 (read once), which exists to
/// measure the one against the other in one build (bench/gpu_suite.sh decode-ab).
/// Measured (H100, c118e8f, Llama-3-8B batch 1, two runs each): chained 182.9 tok/s against plain 181.0 in
/// bf16, 251.4 against 249.5 in FP8; holding the next kernel's launch back until the weight stream ends was
/// between the two (182.5, 251.1). 2026-12-03's chained GEMV, which loaded weights before its wait, was 5%
/// slower than plain.
inline bool chained_launch() {
  static const bool value = [] {
    const char* e = std::getenv("INFER_GEMV_CHAIN");
    return e == nullptr || std::atoi(e) != 0;
  }();
  return value;
}

/// A GEMV kernel's wait before it reads x: waits for the previous kernel, then lets the next one launch.
/// Both are no-ops when the kernel was launched plainly.
__device__ __forceinline__ void begin() { chained::wait_for_previous_kernel(); }

/// Launches a GEMV kernel chained or plainly, as chained_launch() says.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  if (chained_launch()) chained::launch(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
  else kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
}

/// Warps per row group for `groups` groups of rows `chunks` 16-byte chunks long, read `unroll` chunks per
/// lane per pass: doubled (up to max_split()) while the grid has fewer than kTargetWarps warps and each warp
/// still has at least one full pass (32 · unroll chunks) of every row.
inline int split_for(std::int64_t groups, std::int64_t chunks, int unroll) {
  int split = 1;
  while (split < max_split() && groups * split < kTargetWarps && chunks >= std::int64_t{64} * unroll * split) split *= 2;
  return split;
}

/// Blocks for `groups` row groups of kSplit warps each.
inline unsigned grid_for(std::int64_t groups, int split) {
  const std::int64_t per_block = kWarps / split;
  return static_cast<unsigned>((groups + per_block - 1) / per_block);
}

/// f32 → bf16 bits, rounding to nearest even, NaN kept quiet: infer::f32_to_bf16's rounding.
__device__ __forceinline__ std::uint16_t to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// The activation values that meet one 16-byte chunk of weights, when they are wider than the weights:
/// kN 16-byte chunks (int8 codes against bf16 values: 2). Where the two are equally wide
/// (bf16 against bf16, e4m3 against e4m3) the activation chunk is a plain uint4.
template <int kN>
struct XChunks {
  uint4 v[kN];
};
__device__ __forceinline__ uint4 load_x(const uint4* p) { return __ldg(p); }
template <int kN>
__device__ __forceinline__ XChunks<kN> load_x(const XChunks<kN>* p) {
  XChunks<kN> r;
#pragma unroll
  for (int i = 0; i < kN; ++i) r.v[i] = __ldg(&p->v[i]);
  return r;
}

/// The streaming loop of the GEMVs: thread (sub, lane) of a group reads 16-byte chunks sub·32 + lane,
/// + 32·kSplit, ... of each of the group's kRows rows (`wr`), kUnroll chunks per row in flight before any
/// arithmetic, and adds dot(weight chunk, x chunk) for each of the M rows of x (each `chunks` XV long) into
/// acc[row][m]; then reduces acc across the warp by shuffles (the sums end in every lane).
template <int M, int kRows, int kUnroll, int kSplit, class XV, class Dot>
__device__ __forceinline__ void stream_rows(const uint4* const (&wr)[kRows], const XV* __restrict__ x,
                                            std::int64_t chunks, bool active, float (&acc)[kRows][M], Dot dot) {
  const int lane = static_cast<int>(threadIdx.x) % 32, sub = (static_cast<int>(threadIdx.x) / 32) % kSplit;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  constexpr int kStride = 32 * kSplit;
  for (std::int64_t base = sub * 32 + lane; active && base < chunks; base += kStride * kUnroll) {
    uint4 wv[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t c = base + u * kStride;
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[u][r] = c < chunks ? __ldcs(wr[r] + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t c = base + u * kStride;
      if (c >= chunks) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const XV xv = load_x(x + m * chunks + c);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][m] += dot(wv[u][r], xv);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
}

/// Adds up `acc` (already reduced within each warp, valid in lane 0) over the kSplit warps of each group;
/// returns true in the lane that then holds the group's sums (lane 0 of the group's first warp, and only for
/// an active group). Every thread of the block must call it (a barrier when kSplit > 1).
template <int kSplit, int kRows, int M>
__device__ __forceinline__ bool combine(float (&acc)[kRows][M], bool active) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if constexpr (kSplit > 1) {
    __shared__ float part[kWarps][kRows][M];
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) part[warp][r][m] = acc[r][m];
    __syncthreads();
    if (!active || warp % kSplit != 0 || lane != 0) return false;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float sum = part[warp][r][m];
#pragma unroll
        for (int k = 1; k < kSplit; ++k) sum += part[warp + k][r][m];
        acc[r][m] = sum;
      }
    return true;
  } else {
    return active && lane == 0;
  }
}

}  // namespace infer::kernels::cuda::gemv_split
