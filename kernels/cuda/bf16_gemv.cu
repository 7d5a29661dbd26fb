// bf16 GEMV for small batches: y[M][N] = x[M][K] · W[N][K]ᵀ with M ≤ 8, f32 accumulation.
//
// Why not cuBLASLt: at M = 1..8 the product is bound by reading W once (2·N·K bytes), and cuBLASLt's
// tensor-core tiles for such thin shapes reach ~70% of the H200's copy bandwidth on Llama-3-8B's
// layers. This kernel streams W with 16-byte loads, several in flight per lane, and no shared memory:
//   - each warp owns kRows consecutive output rows; lane l reads 16-byte chunks l, l + 32, ... of each
//     row (coalesced 512-byte warp accesses), kUnroll chunks per row in flight before any arithmetic;
//   - x's matching chunk (M rows × 16 bytes) is read once per chunk and reused for the warp's kRows
//     rows, so x traffic (from L1/L2: x is tiny) is M/kRows of W's;
//   - each lane keeps kRows × M f32 partial sums, reduced across the warp by shuffles at the end.
// Split across warps (kSplit = 1, 2 or 4; gemv_split.cuh says why and how): the kSplit warps of a row
// group read interleaved slices of the same rows (thread t of the group reads chunks t, t + 32·kSplit, ...).
//
// SwiGLU variant (bf16_gemv_swiglu): a warp's two rows are gate row i and up row i of the stacked
// [gate; up] weight instead of two neighbours, so lane 0 ends with both dot products and writes
// silu(gate) * up itself: the decode step's separate SwiGLU kernel, and the bf16 round trip of gate and up
// through memory, disappear (one kernel of ~3 µs per layer at batch 1).
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "gemv_split.cuh"
#include "mma_bf16.cuh"
#include "tc_gemv_ring.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kRows = 2;    // output rows per row group
constexpr int kUnroll = 4;  // 16-byte chunks per row in flight per lane
using gemv_split::kWarps;

__device__ __forceinline__ float lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  float s = lo(w.x) * lo(x.x);
  s = fmaf(hi(w.x), hi(x.x), s);
  s = fmaf(lo(w.y), lo(x.y), s);
  s = fmaf(hi(w.y), hi(x.y), s);
  s = fmaf(lo(w.z), lo(x.z), s);
  s = fmaf(hi(w.z), hi(x.z), s);
  s = fmaf(lo(w.w), lo(x.w), s);
  s = fmaf(hi(w.w), hi(x.w), s);
  return s;
}

using gemv_split::Epilogue;

/// y[m][n] = x[m]·W[n] for n < N; with swiglu (W = [gate; up], 2N rows) y[m][n] = silu(x[m]·W[n]) ·
/// x[m]·W[N + n]. A row group (kSplit warps) owns kRows rows (swiglu: gate row i and up row i).
template <int M, class Out, Epilogue kEpilogue, int kSplit>
__global__ void __launch_bounds__(kWarps * 32) bf16_gemv_kernel(const uint4* __restrict__ w, const uint4* __restrict__ x,
                                                                std::int64_t N, std::int64_t chunks, Out* __restrict__ y) {
  constexpr bool kPaired = kEpilogue != Epilogue::store;
  static_assert(!kPaired || (kRows == 2 && sizeof(Out) == 2), "a paired epilogue takes two rows, bf16 out");
  static_assert(kWarps % kSplit == 0, "a block holds whole row groups");
  const int warp_in_block = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t group = static_cast<std::int64_t>(blockIdx.x) * (kWarps / kSplit) + warp_in_block / kSplit;
  const std::int64_t row0 = kPaired ? group : group * kRows;
  // A group past the last row still reaches the block's barrier (kSplit > 1); it reads nothing.
  const bool active = row0 < N;
  const uint4* wr[kRows];
  if constexpr (kEpilogue == Epilogue::swiglu) {
    wr[0] = w + row0 * chunks;
    wr[1] = w + (N + row0) * chunks;
  } else {
    for (int r = 0; r < kRows; ++r) wr[r] = w + (row0 + r < N ? row0 + r : row0) * chunks;  // a missing row re-reads row0
  }
  gemv_split::begin();
  if constexpr (kSplit == 1) {
    if (!active) return;  // exiting counts as letting the next kernel launch
  }
  float acc[kRows][M];
  gemv_split::stream_rows<M, kRows, kUnroll, kSplit>(wr, x, chunks, active, acc,
                                                     [](const uint4& a, const uint4& b) { return dot8(a, b); });
  if (!gemv_split::combine<kSplit, kRows, M>(acc, active)) return;
  if constexpr (kEpilogue == Epilogue::swiglu) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float g = acc[0][m], u = acc[1][m];
      y[m * N + row0] = gemv_split::to_bf16(g / (1.0f + expf(-g)) * u);  // swiglu.cu's silu, accurate expf
    }
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row0 + r >= N) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if constexpr (sizeof(Out) == 2) y[m * N + row0 + r] = gemv_split::to_bf16(acc[r][m]);
        else y[m * N + row0 + r] = acc[r][m];
      }
    }
  }
}

template <int M, class Out, Epilogue kEpilogue>
void launch_m(int split, std::int64_t groups, const uint4* w, const uint4* x, std::int64_t N, std::int64_t chunks, Out* y,
              cudaStream_t s) {
  const dim3 block(kWarps * 32);
  const auto grid = [&](int k) { return dim3(gemv_split::grid_for(groups, k)); };
  switch (split) {
    case 1: gemv_split::launch(bf16_gemv_kernel<M, Out, kEpilogue, 1>, grid(1), block, s, w, x, N, chunks, y); break;
    case 2: gemv_split::launch(bf16_gemv_kernel<M, Out, kEpilogue, 2>, grid(2), block, s, w, x, N, chunks, y); break;
    default: gemv_split::launch(bf16_gemv_kernel<M, Out, kEpilogue, 4>, grid(4), block, s, w, x, N, chunks, y); break;
  }
}

// ---- on the tensor cores, the weights streamed through shared memory (the default) ------------------------
// tc_gemv_ring.cuh's layout: a block owns 16 rows, each warp streams a slice of the slots (256 bytes, 128
// values, of every row: four k-steps) through its ring of cp.async slots, and mma.sync m16n8k16 multiplies
// them by x's M ≤ 8 rows (the n8 extent), which ride in the slot after the weights (M · 256 bytes). Lane (g, t) holds 8
// values of rows g and g + 8 (chunk t of the step) and the matching 8 of x row g: words 0-1 are the first
// mma's logical k 2t..2t+1 and 2t+8..2t+9, words 2-3 the second's (a dot product does not care in which
// order its k run). Sums in the tensor cores' f32 accumulators across the whole slice.
// Why: the CUDA-core kernel above holds its loads in registers (4 KiB in flight per warp), and at M > 1 each
// lane re-reads x and keeps kRows · M sums, which is why cuBLASLt wins from M = 2 (kBf16GemvPreferredRows).
// Measured on an H100 (bench/results/gpu-2026-12-06b, Llama-3-8B, 512 + 128): at batch 1 equal to the CUDA-core
// kernel (175.9 against 175.9 tok/s, 173176b), at batch 4 and 8 6% faster than cuBLASLt (669.9 against 631.8,
// 1303.5 against 1234.4, 6f343e6), so it is the default and the decoder takes it up to 8 rows;
// INFER_BF16_GEMV=cuda_cores keeps the kernel above. The first ring, 64 bytes of a row per copy, had been 14%
// slower (153.6 against 178.2, 9b7349e).
__host__ __device__ constexpr int bf16_slot_bytes(int M) { return tc_ring::kWeightBytes + M * tc_ring::kRowBytes; }
constexpr std::size_t bf16_tc_smem_bytes(int M) {
  return static_cast<std::size_t>(tc_ring::kWarps) * tc_ring::kStages * bf16_slot_bytes(M) + sizeof(float) * tc_ring::kPartFloats;
}

template <class Out>
__global__ void __launch_bounds__(tc_ring::kWarps * 32) bf16_gemv_tc_kernel(const std::uint16_t* __restrict__ w,
                                                                            const std::uint16_t* __restrict__ x, int M,
                                                                            std::int64_t N, std::int64_t K, Out* __restrict__ y,
                                                                            int early) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int slot_bytes = bf16_slot_bytes(M);
  float* part = reinterpret_cast<float*>(smem + tc_ring::kWarps * tc_ring::kStages * slot_bytes);
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * tc_ring::kRows;
  const std::int64_t chunks = K / 8;  // 16-byte chunks of 8 values a row
  const tc_ring::Slice sl = tc_ring::slice_of((chunks + tc_ring::kPieces - 1) / tc_ring::kPieces, warp);
  unsigned char* ring = smem + warp * tc_ring::kStages * slot_bytes;
  const tc_ring::WeightPieces pieces(reinterpret_cast<const std::uint8_t*>(w), row0, N, K * 2, lane);
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  tc_ring::stream(ring, slot_bytes, pieces, reinterpret_cast<const std::uint8_t*>(x), K * 2, M, chunks, sl, lane, early != 0,
                  [&](const uint4& va, const uint4& vb, const uint4& vx) {
                    const std::uint32_t a0[4] = {va.x, vb.x, va.y, vb.y}, a1[4] = {va.z, vb.z, va.w, vb.w};
                    detail::mma_m16n8k16_bf16(c, a0, vx.x, vx.y);
                    detail::mma_m16n8k16_bf16(c, a1, vx.z, vx.w);
                  });
  tc_ring::write_outputs(part, c, warp, lane, row0, N, M, [&](std::int64_t row, int m, float sum) {
    if constexpr (sizeof(Out) == 2) y[m * N + row] = gemv_split::to_bf16(sum);
    else y[m * N + row] = sum;
  });
}

template <class Out>
void launch_tensor_cores(const std::uint16_t* w, const std::uint16_t* x, int M, std::int64_t N, std::int64_t K, Out* y,
                         cudaStream_t s) {
  tc_ring::launch<bf16_gemv_tc_kernel<Out>>(bf16_tc_smem_bytes(kGemvMaxRows), bf16_tc_smem_bytes(M), N, s,
                                            "cuda::bf16_gemv: raising the tensor-core kernel's shared memory", w, x, M, N,
                                            K, y, tc_ring::early_copies() ? 1 : 0);
}

tc_ring::PathSwitch<Bf16GemvPath> g_gemv_path;
Bf16GemvPath resolve_gemv_path() { return g_gemv_path.get("INFER_BF16_GEMV"); }

/// N: output rows (store) or gate rows (swiglu).
template <class Out, Epilogue kEpilogue = Epilogue::store>
void launch(const std::uint16_t* w, const std::uint16_t* x, int M, std::int64_t N, std::int64_t K, Out* y,
            cudaStream_t s) {
  const std::int64_t groups = kEpilogue != Epilogue::store ? N : (N + kRows - 1) / kRows;
  const std::int64_t chunks = K / 8;
  const int split = gemv_split::split_for(groups, chunks, kUnroll);
  const auto* w4 = reinterpret_cast<const uint4*>(w);
  const auto* x4 = reinterpret_cast<const uint4*>(x);
  switch (M) {
    case 1: launch_m<1, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
    case 2: launch_m<2, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
    case 3: launch_m<3, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
    case 4: launch_m<4, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
    case 5: launch_m<5, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
    case 6: launch_m<6, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
    case 7: launch_m<7, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
    default: launch_m<8, Out, kEpilogue>(split, groups, w4, x4, N, chunks, y, s); break;
  }
}

void check_args(const std::uint16_t* w, const std::uint16_t* x, const void* y, int M, std::int64_t N, std::int64_t K) {
  using infer::detail::cat;
  if (M < 1 || M > kGemvMaxRows || N < 0 || K < 1)
    throw InvalidArgument(cat("cuda::bf16_gemv: M = ", M, ", N = ", N, ", K = ", K, "; needs 1 <= M <= ", kGemvMaxRows,
                              ", N >= 0, K >= 1"));
  if (!bf16_gemv_supports(w, x, K))
    throw InvalidArgument(cat("cuda::bf16_gemv: K = ", K, " must be a multiple of 8 and w, x 16-byte aligned"));
  if (y == nullptr) throw InvalidArgument("cuda::bf16_gemv: null output");
  if (N > 0x7fffffffLL * kWarps * kRows) throw InvalidArgument(cat("cuda::bf16_gemv: N = ", N, " exceeds one grid"));
}


template <class Out>
void gemv(const std::uint16_t* w, const std::uint16_t* x, int M, std::int64_t N, std::int64_t K, Out* y, void* stream) {
  check_args(w, x, y, M, N, K);
  if (N == 0) return;
  if (resolve_gemv_path() == Bf16GemvPath::tensor_cores)
    launch_tensor_cores(w, x, M, N, K, y, static_cast<cudaStream_t>(stream));
  else
    launch(w, x, M, N, K, y, static_cast<cudaStream_t>(stream));
  backend::cuda::check(cudaGetLastError(), "cuda::bf16_gemv: kernel launch");
}

}  // namespace

void bf16_gemv(const std::uint16_t* w, const std::uint16_t* x, int M, std::int64_t N, std::int64_t K, std::uint16_t* y,
               void* stream) {
  gemv(w, x, M, N, K, y, stream);
}

void bf16_gemv(const std::uint16_t* w, const std::uint16_t* x, int M, std::int64_t N, std::int64_t K, float* y,
               void* stream) {
  gemv(w, x, M, N, K, y, stream);
}

int bf16_gemv_preferred_rows() noexcept {
  return resolve_gemv_path() == Bf16GemvPath::tensor_cores ? kGemvMaxRows : kBf16GemvPreferredRows;
}

Bf16GemvPath set_bf16_gemv_path(Bf16GemvPath path) {
  return g_gemv_path.set(path);
}

int set_tensor_core_gemv_early_copies(int on) {
  return tc_ring::g_early_copies.exchange(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed);
}

void bf16_gemv_swiglu(const std::uint16_t* w_gate_up, const std::uint16_t* x, int M, std::int64_t I, std::int64_t K,
                      std::uint16_t* y, void* stream) {
  check_args(w_gate_up, x, y, M, I, K);
  if (I == 0) return;
  launch<std::uint16_t, Epilogue::swiglu>(w_gate_up, x, M, I, K, y, static_cast<cudaStream_t>(stream));
  backend::cuda::check(cudaGetLastError(), "cuda::bf16_gemv_swiglu: kernel launch");
}

}  // namespace infer::kernels::cuda
