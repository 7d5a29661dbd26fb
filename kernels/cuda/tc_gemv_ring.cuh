#pragma once
// What the tensor-core GEMVs (fp8_linear.cu's FP8 kernel, int_linear.cu's INT4 kernel) share: a block owns 16
// weight rows (one mma's m16 extent); its kWarps warps take consecutive slices of the k-steps (64 bytes of
// every row each) and each warp streams its slice through its own ring of kStages slots in shared memory,
// filled by cp.async. The warp waits for its own copies only (cp.async.wait_group, then __syncwarp so that
// every lane's have landed): no block barrier in the streaming loop.
//
// Why: the first tensor-core GEMVs (2026-12-05/06) loaded weights into registers, eight warps on
// interleaved k-steps of the same 16 rows. ncu on an H100 (2026-12-06, cold caches, each kernel alone):
// the FP8 one read 2.8 TB/s on Llama-3-8B's gate_up but ~1.9 TB/s on the N = 4096 projections, the INT4
// one 1.6-2.0. With ~60-85 registers a thread and 2-4 KiB of loads in flight per warp, an SM had 50-65 KiB
// in flight, about what the H100's HBM needs to cover its latency at full rate and no margin. A ring holds
// kStages - 1 slots in flight per warp whatever the registers: ~110 KiB an SM at two blocks.
//
// A slot begins with the weights' k-step: piece p (of 64: row p / 4, 16 bytes p % 4 of the step) at p · 16,
// so that lane (g, t) reads its rows' pieces g·4 + t and (g + 8)·4 + t with no bank conflict (a phase's
// eight lanes read two rows, 128 contiguous bytes). What follows the weights in a slot is the kernel's.
#include <cuda_runtime.h>

#include <cstdint>

#include "mma_bf16.cuh"

namespace infer::kernels::cuda::tc_ring {

constexpr int kWarps = 8;                  // warps per block
constexpr int kStages = 8;                 // slots in each warp's ring
constexpr int kRows = 16;                  // weight rows per block
constexpr int kWeightBytes = kRows * 64;   // one k-step of the block's rows: 64 pieces of 16 bytes

/// Warp `warp`'s k-steps: first, first + 1, ..., first + count - 1, of `steps`.
struct Slice {
  std::int64_t first;
  int count;
};
__device__ __forceinline__ Slice slice_of(std::int64_t steps, int warp) {
  const std::int64_t per = (steps + kWarps - 1) / kWarps;
  const std::int64_t first = min(steps, warp * per);
  return {first, static_cast<int>(min(steps, first + per) - first)};
}

/// The two weight pieces this lane copies into every slot (pieces lane and lane + 32): their rows' start
/// plus the piece's offset in a step. Rows past N re-read row N - 1 (their sums are never written).
struct WeightPieces {
  const std::uint8_t* src[2];
  __device__ __forceinline__ WeightPieces(const std::uint8_t* w, std::int64_t row0, std::int64_t N, std::int64_t row_bytes,
                                          int lane) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int p = lane + 32 * j;
      src[j] = w + min(row0 + p / 4, N - 1) * row_bytes + (p % 4) * 16;
    }
  }
  /// Copies k-step s (`chunks` 16-byte chunks a row; pieces past them zero-filled) into `slot`.
  __device__ __forceinline__ void copy(unsigned char* slot, std::int64_t s, std::int64_t chunks, int lane) const {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool ok = s * 4 + (lane + 32 * j) % 4 < chunks;
      detail::cp_async_16(detail::smem_u32(slot + (lane + 32 * j) * 16), ok ? src[j] + s * 64 : src[j], ok);
    }
  }
};

/// Waits until slot i of the ring has landed for every lane (kStages - 2 younger groups may be pending) and
/// every lane has finished reading slot i - 1, which the next copy overwrites.
__device__ __forceinline__ void wait_slot() {
  detail::cp_async_wait<kStages - 2>();
  __syncwarp();
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

}  // namespace infer::kernels::cuda::tc_ring
