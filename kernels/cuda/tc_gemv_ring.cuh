#pragma once
// What the tensor-core GEMVs (fp8_linear.cu's FP8 kernel, bf16_gemv.cu's tensor-core kernel) share: a block
// owns 16 weight rows (one mma's m16 extent); its kWarps warps take consecutive slices of the rows' slots
// (256 bytes of every row each, four k-steps of 64) and each warp streams its slice through its own ring of
// kStages slots in shared memory, filled by cp.async. The warp waits for its own copies only
// (cp.async.wait_group, then __syncwarp so that every lane's have landed): no block barrier in the loop.
//
// Why a ring: the first tensor-core GEMVs (2026-12-05/06) loaded weights into registers, eight warps on
// interleaved k-steps of the same 16 rows; ncu on an H100 (2026-12-06, cold caches, each kernel alone) had the
// FP8 one at 2.8 TB/s on Llama-3-8B's gate_up but ~1.9 TB/s on the N = 4096 projections. A ring keeps
// kStages - 1 slots in flight per warp whatever the registers.
// Why 256 contiguous bytes of a row per slot: the first ring (9b7349e) copied 64 bytes of each of the 16 rows
// per k-step, half a 128-byte line, and read only 2.0-2.4 TB/s on an H100 (bf16: 153.6 tok/s against 178.2 for
// the CUDA-core GEMV, whose warps read 512 contiguous bytes of a row per load). Here one cp.async instruction of
// a warp covers two rows × 256 bytes.
//
// Slot layout: row r's 16 pieces of 16 bytes at r · 256, piece c stored at c ^ ((r & 1) · 4) so that lane
// (g, t) reading piece 4h + t of rows g and g + 8 (k-step h of the slot) meets no bank conflict: a phase's
// eight lanes read rows g = 0, 1, whose pieces then sit in different halves of the 128-byte bank window.
// x's M rows follow the weights in a slot, placed the same way (stream).
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "infer/backend/cuda_runtime.hpp"
#include "chained_launch.cuh"
#include "mma_bf16.cuh"

namespace infer::kernels::cuda::tc_ring {

constexpr int kWarps = 4;                        // warps per block
constexpr int kStages = 6;                       // slots in each warp's ring
constexpr int kRows = 16;                        // weight rows per block
constexpr int kPieces = 16;                      // 16-byte pieces of a row in a slot
constexpr int kRowBytes = kPieces * 16;          // 256
constexpr int kWeightBytes = kRows * kRowBytes;  // the weights' part of a slot
constexpr int kStepsPerSlot = kPieces / 4;       // k-steps of 64 bytes

/// Where piece c of row r sits in a block of rows laid out as a slot's weights are.
__device__ __forceinline__ int piece_offset(int r, int c) { return r * kRowBytes + ((c ^ ((r & 1) << 2)) << 4); }

/// Warp `warp`'s slots: first, first + 1, ..., first + count - 1, of `slots`.
struct Slice {
  std::int64_t first;
  int count;
};
__device__ __forceinline__ Slice slice_of(std::int64_t slots, int warp) {
  const std::int64_t per = (slots + kWarps - 1) / kWarps;
  const std::int64_t first = min(slots, warp * per);
  return {first, static_cast<int>(min(slots, first + per) - first)};
}

/// The weight pieces this lane copies into every slot: piece lane % 16 of rows 2j + lane / 16, j = 0..7 (one
/// instruction of the warp: two rows, 256 contiguous bytes each). Rows past N re-read row N - 1 (their sums
/// are never written).
struct WeightPieces {
  const std::uint8_t* src[kRows / 2];
  int col;
  __device__ __forceinline__ WeightPieces(const std::uint8_t* w, std::int64_t row0, std::int64_t N, std::int64_t row_bytes,
                                          int lane)
      : col(lane % kPieces) {
#pragma unroll
    for (int j = 0; j < kRows / 2; ++j) src[j] = w + min(row0 + 2 * j + lane / kPieces, N - 1) * row_bytes + col * 16;
  }
  /// Copies slot s of the rows (`chunks` 16-byte chunks a row; pieces past them zero-filled) into `slot`.
  __device__ __forceinline__ void copy(unsigned char* slot, std::int64_t s, std::int64_t chunks, int lane) const {
    const bool ok = s * kPieces + col < chunks;
#pragma unroll
    for (int j = 0; j < kRows / 2; ++j)
      detail::cp_async_16(detail::smem_u32(slot + piece_offset(2 * j + lane / kPieces, col)),
                          ok ? src[j] + s * kRowBytes : src[j], ok);
  }
};

/// Waits until slot i of the ring has landed for every lane (kStages - 2 younger groups may be pending) and
/// every lane has finished reading slot i - 1, which the next copy overwrites.
__device__ __forceinline__ void wait_slot() {
  detail::cp_async_wait<kStages - 2>();
  __syncwarp();
}

/// A warp's whole stream: waits for the previous kernel (chained launch), then runs its slice `sl` of the
/// block's rows through its ring (kStages slots of `slot_bytes` at `ring`), each slot holding the weights' 256
/// bytes of the 16 rows and then x's M rows' 256 bytes at the same inputs (x row m at x + m·x_row_bytes, the
/// same 16-byte chunk order as the weights). For every 64-byte k-step it calls mma_step(va, vb, vx): lane (g,
/// t)'s 16 bytes of rows g and g + 8 and of x row g (zero for g >= M), all at chunk t of the step.
/// `early`: the weights of the first kStages - 1 slots are copied before the wait (they are never written
/// during a step; only x comes from the previous kernel), their x after it, all as one group (early_copies()).
template <class MmaStep>
__device__ __forceinline__ void stream(unsigned char* ring, int slot_bytes, const WeightPieces& pieces,
                                       const std::uint8_t* x, std::int64_t x_row_bytes, int M, std::int64_t chunks,
                                       Slice sl, int lane, bool early, MmaStep&& mma_step) {
  const int g = lane >> 2, t = lane & 3;
  auto copy_w = [&](int i) {  // slot sl.first + i's weights into ring slot i % kStages
    if (i < sl.count) pieces.copy(ring + (i % kStages) * slot_bytes, sl.first + i, chunks, lane);
  };
  auto copy_x = [&](int i) {  // ... and its x
    if (i >= sl.count) return;
    const std::int64_t s = sl.first + i;
    unsigned char* slot = ring + (i % kStages) * slot_bytes;
    for (int q = lane; q < M * kPieces; q += 32) {  // x: row q / 16, piece q % 16
      const int m = q / kPieces, col = q % kPieces;
      const std::int64_t ch = s * kPieces + col;
      const bool ok = ch < chunks;
      detail::cp_async_16(detail::smem_u32(slot + kWeightBytes + piece_offset(m, col)), x + m * x_row_bytes + (ok ? ch * 16 : 0),
                          ok);
    }
  };
  auto issue = [&](int i) {  // a group is committed either way
    copy_w(i);
    copy_x(i);
    detail::cp_async_commit();
  };
  if (early) {
    // One group holds the first kStages - 1 slots whole, then empty groups keep wait_slot's count: the first
    // wait_slot waits for all of them (their weights have been in flight since before the wait).
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) copy_w(i);
    chained::wait_for_previous_kernel();
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) copy_x(i);
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) detail::cp_async_commit();
  } else {
    chained::wait_for_previous_kernel();
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue(i);
  }
  const bool has_x = g < M;
  for (int i = 0; i < sl.count; ++i) {
    wait_slot();
    const unsigned char* slot = ring + (i % kStages) * slot_bytes;
    uint4 va[kStepsPerSlot], vb[kStepsPerSlot], vx[kStepsPerSlot];
#pragma unroll
    for (int h = 0; h < kStepsPerSlot; ++h) {
      const int col = 4 * h + t;
      va[h] = *reinterpret_cast<const uint4*>(slot + piece_offset(g, col));
      vb[h] = *reinterpret_cast<const uint4*>(slot + piece_offset(g + 8, col));
      vx[h] = has_x ? *reinterpret_cast<const uint4*>(slot + kWeightBytes + piece_offset(g, col)) : make_uint4(0, 0, 0, 0);
    }
    issue(i + kStages - 1);
#pragma unroll
    for (int h = 0; h < kStepsPerSlot; ++h) mma_step(va[h], vb[h], vx[h]);
  }
  detail::cp_async_wait<0>();
}

/// The block's partial sums: warp `warp`'s mma accumulator c (rows g, g + 8; activation columns 2t, 2t + 1)
/// into part[warp][row][8], then a block barrier. Every thread of the block must call it.
__device__ __forceinline__ void store_partial(float* part, const float (&c)[4], int warp, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float* mine = part + warp * kRows * 8;
  mine[g * 8 + 2 * t] = c[0];
  mine[g * 8 + 2 * t + 1] = c[1];
  mine[(g + 8) * 8 + 2 * t] = c[2];
  mine[(g + 8) * 8 + 2 * t + 1] = c[3];
  __syncthreads();
}

/// Σ over the warps, in warp order, of row r's sum for activation row m.
__device__ __forceinline__ float row_sum(const float* part, int r, int m) {
  float sum = part[r * 8 + m];
#pragma unroll
  for (int k = 1; k < kWarps; ++k) sum += part[(k * kRows + r) * 8 + m];
  return sum;
}

constexpr int kPartFloats = kWarps * kRows * 8;

/// The block's end: its warps' accumulators c into `part` (store_partial), then thread i < 16·M writes output (row
/// row0 + i / M, activation row i % M) for rows below N by calling write(row, m, Σ over the warps). Every thread of
/// the block must call it.
template <class Write>
__device__ __forceinline__ void write_outputs(float* part, const float (&c)[4], int warp, int lane, std::int64_t row0,
                                              std::int64_t N, int M, Write&& write) {
  store_partial(part, c, warp, lane);
  const int i = static_cast<int>(threadIdx.x);
  if (i >= kRows * M) return;
  const int r = i / M, m = i % M;
  if (row0 + r < N) write(row0 + r, m, row_sum(part, r, m));
}

/// Launches ring kernel `kKernel` chained, one block per 16 rows of N, with `smem` bytes of shared memory; its
/// limit is raised past the 48 KiB default to `max_smem` (what any M takes) once, at the first launch.
template <auto kKernel, class... Args>
void launch(std::size_t max_smem, std::size_t smem, std::int64_t N, cudaStream_t stream, const char* who, Args&&... args) {
  static const cudaError_t raised =
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_smem));
  backend::cuda::check(raised, who);
  chained::launch(kKernel, dim3(static_cast<unsigned>((N + kRows - 1) / kRows)), dim3(kWarps * 32), smem, stream,
                  std::forward<Args>(args)...);
}

/// Whether the ring kernels copy their first slots' weights before the chained wait (stream's `early`):
/// set_tensor_core_gemv_early_copies's choice, else INFER_TC_GEMV_EARLY=1 (read once); off by default until
/// measured. The GGUF GEMV's early copies gained 5-6% at batch 1 on the H200 (gguf_gemv.cu); a 2026-12-03 bf16
/// GEMV that loaded weights before its wait had been 5% slower (gemv_split.cuh), so this is a switch to A/B.
inline std::atomic<int> g_early_copies{-1};
inline bool early_copies() {
  const int v = g_early_copies.load(std::memory_order_relaxed);
  if (v >= 0) return v != 0;
  static const bool from_env = [] {
    const char* e = std::getenv("INFER_TC_GEMV_EARLY");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return from_env;
}

/// A GEMV's process-wide choice between its CUDA-core kernel and its ring kernel (Bf16GemvPath, Fp8GemvPath:
/// automatic, cuda_cores, tensor_cores): what set() chose, else, for automatic, the environment variable named
/// at the first get() (read once): `cuda_cores` picks the CUDA cores, anything else the tensor cores.
template <class Path>
class PathSwitch {
 public:
  [[nodiscard]] Path get(const char* env) const {
    const auto p = static_cast<Path>(chosen_.load(std::memory_order_relaxed));
    if (p != Path::automatic) return p;
    static const Path from_env = [env] {
      const char* v = std::getenv(env);
      return v != nullptr && std::strcmp(v, "cuda_cores") == 0 ? Path::cuda_cores : Path::tensor_cores;
    }();
    return from_env;
  }
  /// Sets the choice; returns the previous one.
  Path set(Path p) { return static_cast<Path>(chosen_.exchange(static_cast<int>(p), std::memory_order_relaxed)); }

 private:
  std::atomic<int> chosen_{static_cast<int>(Path::automatic)};
};

}  // namespace infer::kernels::cuda::tc_ring
