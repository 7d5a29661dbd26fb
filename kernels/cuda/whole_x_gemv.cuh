#pragma once
// GEMVs at one row of x whose every CTA holds all of x in shared memory, formed in the CTA's own prologue: from
// bf16 values or from the decoder's pre-norm (residual_norm.cuh), and for FP8 quantized there as well. What that
// saves a batch-1 decode step is the small kernels between its GEMVs (the norms; FP8's activation quantizations):
// each costs ~2 µs of latency in a graph (the GGUF paths bench), and a Llama-3-8B step has 64 norms and, in FP8,
// 128 quantizations. bf16_gemv.cu and fp8_linear.cu instantiate `kernel` with their Format. Measured, the steps
// that use them were slower, not faster (kUsedByDefault below): the decoder takes them only where asked.
//
// Work layout. Since every CTA repeats the prologue (reading x, or the residual, delta and norm weight: ~40 KB
// from L2 at K = 4,096), the grid is what the GPU holds at once (2-4 CTAs an SM, grid_for), not one CTA per few
// rows: the eighth session's FP8 GEMV that quantized x in each of its 1,792 CTAs ran gate_up at 55 µs against 46
// (docs/benchmarks.md). CTA c owns a balanced contiguous range of outputs (rows, or gate/up pairs with SwiGLU)
// and its warp w takes outputs w, w + kWarps, ... one at a time; lane l reads 16-byte chunks l, l + 32, ... of the
// row (both rows of a pair), kChunks chunks in flight. An output's sum is its lane's chunks in order, then a
// butterfly across the warp: the same bits at every call. Before its chained wait a warp issues its first
// output's first loads (weights are never written during a step), so the prologue runs while they are in flight.
//
// A Format F supplies: kValues (values in a 16-byte weight chunk), Params (what its output needs, e.g. the
// weight's row scales), State (what the prologue leaves, e.g. x's scale), smem_bytes(K), prologue(src, K, smem)
// (forms x's chunks, ending with a barrier), x_chunks(smem, K), dot(w, x) over one chunk, and out(sum, row,
// state, params), the output's f32 value before SwiGLU and the rounding to bf16.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "chained_launch.cuh"
#include "gemv_split.cuh"
#include "residual_norm.cuh"

namespace infer::kernels::cuda::whole_x {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunks = 8;                     // 16-byte weight chunks in flight per lane
constexpr std::size_t kMaxSmem = 48 * 1024;    // the default limit: no attribute to raise
constexpr std::size_t kRedBytes = sizeof(float) * (kWarps + 1);  // the prologue's sums, then its result

/// Where x comes from: bf16 values, or (norm.weight given) the decoder's pre-norm.
struct Source {
  const std::uint16_t* x = nullptr;
  ResidualNorm norm{};
  [[nodiscard]] __host__ __device__ bool normed() const { return norm.weight != nullptr; }
};

/// x as K / 8 chunks of 8 bf16 values into xs: copied, or the pre-norm's (its inverse computed first in `red`,
/// kWarps + 1 floats; the CTA writes its share of r and x). The whole CTA calls it; ends with a barrier.
__device__ __forceinline__ void form_bf16(const Source& s, std::int64_t K, uint4* xs, float* red) {
  const std::int64_t chunks = K / 8;
  if (s.normed()) {
    prenorm::inv_rms<1, kWarps>(s.norm, K, red, red + kWarps);
    const float inv = red[kWarps];
    for (std::int64_t c = threadIdx.x; c < chunks; c += kThreads)
      xs[c] = prenorm::normed_chunk(s.norm, c, static_cast<std::uint32_t>(chunks), inv, blockIdx.x, gridDim.x);
  } else {
    const auto* x4 = reinterpret_cast<const uint4*>(s.x);
    for (std::int64_t c = threadIdx.x; c < chunks; c += kThreads) xs[c] = x4[c];
  }
  __syncthreads();
}

/// y[o] for o < outs (SwiGLU: gate rows 0..outs-1, up rows outs..2·outs-1 of w): the file comment's layout.
template <class F, bool kSwiglu>
__global__ void __launch_bounds__(kThreads) kernel(const uint4* __restrict__ w, const typename F::Params prm,
                                                   const Source src, std::int64_t outs, std::int64_t K,
                                                   std::uint16_t* __restrict__ y, int early) {
  constexpr int R = kSwiglu ? 2 : 1;  // weight rows an output
  constexpr int U = kChunks / R;      // chunks of each in flight
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t chunks = K / F::kValues;
  const std::int64_t o_end = (static_cast<std::int64_t>(blockIdx.x) + 1) * outs / gridDim.x;
  std::int64_t o = static_cast<std::int64_t>(blockIdx.x) * outs / gridDim.x + warp;
  uint4 wv[R][U];
  const auto load = [&](std::int64_t base) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* row = w + (r == 0 ? o : outs + o) * chunks;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const std::int64_t c = base + u * 32;
        wv[r][u] = c < chunks ? __ldcs(row + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  if (early) {
    if (o < o_end) load(lane);
    chained::wait_for_previous_kernel();
  } else {
    chained::wait_for_previous_kernel();
    if (o < o_end) load(lane);
  }
  const typename F::State st = F::prologue(src, K, smem);
  const uint4* xs = F::x_chunks(smem, K);
  bool loaded = true;  // the first output's first chunks, loaded above
  for (; o < o_end; o += kWarps) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (std::int64_t base = lane; base < chunks; base += 32 * U) {
      if (!loaded) load(base);
      loaded = false;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const std::int64_t c = base + u * 32;
        if (c >= chunks) break;
        const uint4 xv = xs[c];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += F::dot(wv[r][u], xv);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    if (lane == 0) {
      const float g = F::out(acc[0], o, st, prm);
      if constexpr (kSwiglu) {
        const float u = F::out(acc[R - 1], outs + o, st, prm);
        y[o] = gemv_split::to_bf16(g / (1.0f + expf(-g)) * u);  // swiglu.cu's silu, accurate expf
      } else {
        y[o] = gemv_split::to_bf16(g);
      }
    }
  }
}

/// CTAs for `outs` outputs: 2, 3 or 4 an SM (at most `resident` an SM, what the kernel's registers and shared
/// memory let an SM hold, so that the whole grid runs at once), whichever gives the warps the most even share (the
/// kernel takes as long as its busiest warp), the fewest on a tie (each CTA repeats the prologue's reads).
inline unsigned grid_for(std::int64_t outs, int resident) {
  const int sms = backend::cuda::sm_count();
  std::int64_t best = 1;
  double best_share = -1.0;
  for (int per_sm = 2; per_sm <= std::max(2, std::min(4, resident)); ++per_sm) {
    const std::int64_t g = std::max<std::int64_t>(1, std::min<std::int64_t>(std::int64_t{per_sm} * sms, outs));
    const std::int64_t most = ((outs + g - 1) / g + kWarps - 1) / kWarps;  // the busiest warp's outputs
    const double share = static_cast<double>(outs) / static_cast<double>(g * kWarps) / static_cast<double>(most);
    if (share > best_share + 1e-9) {
      best_share = share;
      best = g;
    }
  }
  return static_cast<unsigned>(best);
}

/// Whether the decoder runs these kernels at batch 1 by default (bf16_gemv_fuses_norm, fp8_gemv_quantizes_x): no.
/// Measured on an H100 (acfdce2's parent, bench/results/gpu-2026-12-07d; Llama-3-8B dummy, batch 1, 512 + 128, static
/// engine, two runs each): bf16 163.1 / 163.3 tok/s with the pre-norm in the qkv and gate_up GEMVs against 175.6 /
/// 176.1 with the norm kernels (-7%), FP8 238.8 / 239.5 with no quantization or norm kernel against 263.4 / 263.4
/// (-9%), although alone, in a graph of the same kernel on cold weights (the GGUF paths bench), the fused bf16 qkv
/// and gate_up took 20.97 and 83.18 us against 21.18 and 82.24 for norm kernel + GEMV. Until the step's loss is
/// understood (what differs from the bench is the kernels around them: the ring GEMVs before, whose 104 KiB of
/// shared memory a CTA leave no room for these CTAs to start early), INFER_BF16_GEMV_NORM=1 and
/// INFER_FP8_GEMV_ROW=1 turn them on for A/B runs (gpu_suite.sh norm-ab, early-x-ab).
inline constexpr bool kUsedByDefault = false;
/// A decoder switch for A/B runs in one build: `env` = 1 on, 0 off, unset kUsedByDefault (read once by the caller).
inline bool switch_from_env(const char* env) {
  const char* e = std::getenv(env);
  if (e != nullptr && std::strcmp(e, "1") == 0) return true;
  if (e != nullptr && std::strcmp(e, "0") == 0) return false;
  return kUsedByDefault;
}

/// Whether a warp issues its first loads before the chained wait (the file comment): yes unless
/// INFER_WHOLE_X_EARLY=0 (read once; an A/B switch).
inline int early_loads() {
  static const int v = [] {
    const char* e = std::getenv("INFER_WHOLE_X_EARLY");
    return e != nullptr && std::strcmp(e, "0") == 0 ? 0 : 1;
  }();
  return v;
}

/// Whether F's kernel takes a row of K: a whole number of chunks (and of bf16 chunks), x within kMaxSmem.
template <class F>
[[nodiscard]] bool takes(std::int64_t K) {
  return K >= F::kValues && K % F::kValues == 0 && K % 8 == 0 && F::smem_bytes(K) <= kMaxSmem;
}

/// Checks the operands (InvalidArgument naming `who` and what is wrong), then launches the kernel chained.
template <class F, bool kSwiglu>
void launch(const char* who, const void* w, const typename F::Params& prm, const Source& src, std::int64_t outs,
            std::int64_t K, std::uint16_t* y, void* stream) {
  using infer::detail::cat;
  if (outs < 0 || !takes<F>(K))
    throw InvalidArgument(cat(who, ": N = ", outs, ", K = ", K, "; one row of x takes N >= 0 and K a multiple of ",
                              F::kValues, " whose x fits ", kMaxSmem / 1024, " KiB of shared memory"));
  if (w == nullptr || y == nullptr || !prenorm::aligned16(w))
    throw InvalidArgument(cat(who, ": the weight must be given, 16-byte aligned, and y given"));
  if (src.normed()) prenorm::check(who, src.norm);
  else if (src.x == nullptr || !prenorm::aligned16(src.x)) throw InvalidArgument(cat(who, ": x must be given, 16-byte aligned"));
  if (outs == 0) return;
  int resident = 0;
  backend::cuda::check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel<F, kSwiglu>, kThreads, F::smem_bytes(K)),
                       who);
  chained::launch(kernel<F, kSwiglu>, dim3(grid_for(outs, resident)), dim3(kThreads), F::smem_bytes(K),
                  static_cast<cudaStream_t>(stream), static_cast<const uint4*>(w), prm, src, outs, K, y, early_loads());
  backend::cuda::check(cudaGetLastError(), who);
}

}  // namespace infer::kernels::cuda::whole_x
