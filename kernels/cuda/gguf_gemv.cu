// Fused dequantize-GEMV on GGUF blocks for small batches: y[M][N] = x[M][K] · W[N][K]ᵀ, M = 1..8.
//
// Batch-1 decode reads every weight once per token, so this kernel is about moving block bytes at the
// copy rate. Layout of the work:
// - a CTA of 8 warps; each warp owns whole output rows (row = CTA * 8 + warp, strided by the grid, which
//   is sized to fill the GPU once, so x is staged once per CTA and not once per row);
// - x (M×K bf16) is copied to shared memory once per CTA when it fits (≤ 32 KiB), else read through L1;
// - a warp streams its rows' blocks through a 3-stage ring of shared buffers with 16-byte `cp.async`
//   copies (two steps of ~2 KiB in flight per warp while it decodes the third). A step is a whole number
//   of blocks, so no block straddles two buffers; block sizes (34, 18, 20, 144, 210 bytes) do not keep
//   16-byte alignment, so a step copies the aligned 16-byte chunks covering it, and the rare chunk
//   reaching outside the tensor is copied 2 bytes at a time instead;
// - a lane decodes one *segment* of 32 consecutive values (a Q8_0/Q4_0/Q4_1 block, a 32-value sub-block
//   of Q4_K, two 16-value sub-blocks of Q6_K) into registers, and folds the scales out of the inner sum:
//   Σ (a·q + b)·x = a·Σ q·x + b·Σ x, so the inner loop is one FMA per value and row;
// - per-row partial sums are reduced across the warp with shuffles, f32 throughout, bf16 once at the end.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/gemm.hpp"
#include "infer/quant/gguf_blocks.hpp"
#include "chained_launch.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
/// x is staged in shared memory up to this size (M = 4 with K = 4096); beyond, it is read through L1
/// (staging more would leave one CTA per multiprocessor: too few warps to hide memory latency).
constexpr std::int64_t kMaxStagedX = 32 * 1024;

/// Per-format constants: block bytes and values, 32-value segments per block, blocks per pipeline step
/// (chosen so that a step is about 2 KiB), and whether values carry an additive min.
template <DType T>
struct Fmt;
template <>
struct Fmt<DType::q8_0> {
  static constexpr int bytes = 34, elems = 32, segs = 1, step_blocks = 64;
  static constexpr bool has_min = false;
};
template <>
struct Fmt<DType::q4_0> {
  static constexpr int bytes = 18, elems = 32, segs = 1, step_blocks = 128;
  static constexpr bool has_min = false;
};
template <>
struct Fmt<DType::q4_1> {
  static constexpr int bytes = 20, elems = 32, segs = 1, step_blocks = 128;
  static constexpr bool has_min = true;
};
template <>
struct Fmt<DType::q4_k> {
  static constexpr int bytes = 144, elems = 256, segs = 8, step_blocks = 16;
  static constexpr bool has_min = true;
};
template <>
struct Fmt<DType::q6_k> {
  static constexpr int bytes = 210, elems = 256, segs = 8, step_blocks = 8;
  static constexpr bool has_min = false;
};

/// Bytes of one pipeline buffer: a step's blocks, up to 15 bytes of alignment slack in front, the last
/// chunk rounded up to 16, and 16 more so the word loads of `load_words` may read past the end.
template <class F>
constexpr int buf_bytes() {
  return (F::step_blocks * F::bytes + 15 + 15) / 16 * 16 + 16;
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float h2f(const unsigned char* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const std::uint16_t*>(p)));
}

/// NW little-endian 32-bit words starting at any byte address p (shared memory, readable 4 bytes past).
template <int NW>
__device__ __forceinline__ void load_words(const unsigned char* p, std::uint32_t (&w)[NW]) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const auto* base = reinterpret_cast<const std::uint32_t*>(addr & ~std::uintptr_t{3});
  const unsigned sh = static_cast<unsigned>(addr & 3u) * 8u;
  std::uint32_t raw[NW + 1];
#pragma unroll
  for (int i = 0; i < NW + 1; ++i) raw[i] = base[i];
#pragma unroll
  for (int i = 0; i < NW; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], sh);
}

/// v (< 2^23) as a float minus `bias`, exactly, without the slow integer-to-float conversion:
/// 0x4B000000 | v is the float 2^23 + v.
__device__ __forceinline__ float magic_float(std::uint32_t v, float bias) {
  return __uint_as_float(0x4B000000u | v) - bias;
}

/// One decoded segment: value l = a0·q[l] + b for l < 16, a1·q[l] + b for l ≥ 16.
struct Seg {
  float q[32];
  float a0, a1, b;
};

template <DType T>
__device__ __forceinline__ void decode(const unsigned char* blk, int s, Seg& g);

template <>
__device__ __forceinline__ void decode<DType::q8_0>(const unsigned char* blk, int, Seg& g) {
  g.a0 = g.a1 = h2f(blk);
  g.b = 0.0f;
  std::uint32_t w[8];
  load_words<8>(blk + 2, w);
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      g.q[4 * i + k] = magic_float(((w[i] >> (8 * k)) & 0xffu) ^ 0x80u, 8388736.0f);  // (q + 128) - 128
}

template <>
__device__ __forceinline__ void decode<DType::q4_0>(const unsigned char* blk, int, Seg& g) {
  g.a0 = g.a1 = h2f(blk);
  g.b = 0.0f;
  std::uint32_t w[4];
  load_words<4>(blk + 2, w);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const std::uint32_t byte = w[j / 4] >> (8 * (j % 4));
    g.q[j] = magic_float(byte & 15u, 8388616.0f);  // q - 8
    g.q[j + 16] = magic_float((byte >> 4) & 15u, 8388616.0f);
  }
}

template <>
__device__ __forceinline__ void decode<DType::q4_1>(const unsigned char* blk, int, Seg& g) {
  g.a0 = g.a1 = h2f(blk);
  g.b = h2f(blk + 2);
  std::uint32_t w[4];
  load_words<4>(blk + 4, w);
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const std::uint32_t byte = w[j / 4] >> (8 * (j % 4));
    g.q[j] = magic_float(byte & 15u, 8388608.0f);
    g.q[j + 16] = magic_float((byte >> 4) & 15u, 8388608.0f);
  }
}

template <>
__device__ __forceinline__ void decode<DType::q4_k>(const unsigned char* blk, int s, Seg& g) {
  const quant::ScaleMin sm = quant::unpack_scale_min_k4(s, blk + 4);
  g.a0 = g.a1 = h2f(blk) * static_cast<float>(sm.scale);
  g.b = -(h2f(blk + 2) * static_cast<float>(sm.min));
  std::uint32_t w[8];
  load_words<8>(blk + 16 + 32 * (s >> 1), w);
  const unsigned shift = 4u * static_cast<unsigned>(s & 1);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::uint32_t v = w[i] >> shift;
#pragma unroll
    for (int k = 0; k < 4; ++k) g.q[4 * i + k] = magic_float((v >> (8 * k)) & 15u, 8388608.0f);
  }
}

template <>
__device__ __forceinline__ void decode<DType::q6_k>(const unsigned char* blk, int s, Seg& g) {
  const int half = s >> 2, quarter = s & 3;
  std::uint32_t wl[8], wh[8];
  load_words<8>(blk + 64 * half + 32 * (quarter & 1), wl);
  load_words<8>(blk + 128 + 32 * half, wh);
  const unsigned lshift = 4u * static_cast<unsigned>(quarter >> 1), hshift = 2u * static_cast<unsigned>(quarter);
  const auto* scales = reinterpret_cast<const signed char*>(blk + 192);
  const float d = h2f(blk + 208);
  g.a0 = d * static_cast<float>(scales[8 * half + 2 * quarter]);
  g.a1 = d * static_cast<float>(scales[8 * half + 2 * quarter + 1]);
  g.b = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const std::uint32_t lo = wl[i] >> lshift, hi = wh[i] >> hshift;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::uint32_t q = ((lo >> (8 * k)) & 15u) | (((hi >> (8 * k)) & 3u) << 4);
      g.q[4 * i + k] = magic_float(q, 8388640.0f);  // q - 32
    }
  }
}

template <DType T, int MM>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const unsigned char* __restrict__ w,
                                                        const std::uint16_t* __restrict__ x, std::int64_t N,
                                                        std::int64_t K, std::uint16_t* __restrict__ y, int stage_x) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  using F = Fmt<T>;
  constexpr int kBuf = buf_bytes<F>();
  extern __shared__ __align__(16) unsigned char smem[];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  const std::uint16_t* xs = x;
  std::int64_t x_bytes = 0;
  if (stage_x) {
    x_bytes = static_cast<std::int64_t>(MM) * K * 2;
    const std::int64_t n16 = x_bytes / 16;
    auto* dst = reinterpret_cast<uint4*>(smem);
    const auto* src = reinterpret_cast<const uint4*>(x);
    for (std::int64_t i = threadIdx.x; i < n16; i += kThreads) dst[i] = src[i];
    __syncthreads();
    xs = reinterpret_cast<const std::uint16_t*>(smem);
  }
  unsigned char* bufs = smem + x_bytes + static_cast<std::int64_t>(warp) * kStages * kBuf;

  const std::int64_t nb = K / F::elems;
  const std::int64_t row_bytes = nb * F::bytes;
  const std::int64_t steps = (nb + F::step_blocks - 1) / F::step_blocks;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  const std::int64_t row_stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  if (row0 >= N) return;  // no block-wide barrier follows
  const int steps_i = static_cast<int>(steps);
  const auto wbeg = reinterpret_cast<std::uintptr_t>(w);
  const std::uintptr_t wend = wbeg + static_cast<std::uintptr_t>(N * row_bytes);

  // A warp's items are the steps of its rows in order: step t of row row0 + r * row_stride. Issue and
  // decode walk them with their own counters (no 64-bit division in the loop).
  auto step_at = [&](std::int64_t row, int t, std::int64_t& first, int& count, std::uintptr_t& start) {
    first = static_cast<std::int64_t>(t) * F::step_blocks;
    const std::int64_t left = nb - first;
    count = left < F::step_blocks ? static_cast<int>(left) : F::step_blocks;
    start = wbeg + static_cast<std::uintptr_t>(row * row_bytes + first * F::bytes);
  };
  std::int64_t irow = row0;
  int it = 0, ibuf = 0;
  auto issue = [&]() {
    if (irow < N) {
      std::int64_t first;
      int count;
      std::uintptr_t start;
      step_at(irow, it, first, count, start);
      const std::uintptr_t end = start + static_cast<std::uintptr_t>(count) * F::bytes;
      const std::uintptr_t a = start & ~std::uintptr_t{15};
      const int chunks = static_cast<int>((end - a + 15) / 16);
      unsigned char* buf = bufs + ibuf * kBuf;
      for (int c = lane; c < chunks; c += 32) {
        const std::uintptr_t src = a + 16u * static_cast<unsigned>(c);
        if (src >= wbeg && src + 16 <= wend) {
          cp_async16(buf + 16 * c, reinterpret_cast<const void*>(src));
        } else {  // a chunk reaching outside the tensor: copy only the step's own bytes
          for (int o = 0; o < 16; o += 2) {
            const std::uintptr_t p = src + static_cast<unsigned>(o);
            if (p >= start && p < end)
              *reinterpret_cast<std::uint16_t*>(buf + 16 * c + o) = *reinterpret_cast<const std::uint16_t*>(p);
          }
        }
      }
      if (++it == steps_i) {
        it = 0;
        irow += row_stride;
      }
    }
    ibuf = ibuf + 1 == kStages ? 0 : ibuf + 1;
    cp_async_commit();  // empty groups too, so wait_group counts stay uniform
  };

  for (int s = 0; s < kStages - 1; ++s) issue();
  float acc[MM];
#pragma unroll
  for (int m = 0; m < MM; ++m) acc[m] = 0.0f;

  std::int64_t row = row0;
  int dt = 0, dbuf = 0;
  while (row < N) {
    issue();
    cp_async_wait<kStages - 1>();  // the group of this item has landed (this lane's part)
    __syncwarp();                  // ... and every other lane's part

    std::int64_t first;
    int count;
    std::uintptr_t start;
    step_at(row, dt, first, count, start);
    const unsigned char* buf = bufs + dbuf * kBuf + (start & 15u);
    const int nseg = count * F::segs;
    for (int sg = lane; sg < nseg; sg += 32) {
      const int j = sg / F::segs, s = sg % F::segs;
      Seg g;
      decode<T>(buf + j * F::bytes, s, g);
      const std::int64_t k0 = (first + j) * F::elems + s * 32;
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        const std::uint16_t* xp = xs + m * K + k0;
        float s0 = 0.0f, s1 = 0.0f, sx = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const uint4 v = *reinterpret_cast<const uint4*>(xp + 8 * c);
          const std::uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float lo = __uint_as_float(u[e] << 16), hi = __uint_as_float(u[e] & 0xffff0000u);
            const int l = 8 * c + 2 * e;
            if (c < 2) {
              s0 = fmaf(g.q[l], lo, s0);
              s0 = fmaf(g.q[l + 1], hi, s0);
            } else {
              s1 = fmaf(g.q[l], lo, s1);
              s1 = fmaf(g.q[l + 1], hi, s1);
            }
            if constexpr (F::has_min) sx += lo + hi;
          }
        }
        float r = g.a0 * s0 + g.a1 * s1;
        if constexpr (F::has_min) r = fmaf(g.b, sx, r);
        acc[m] += r;
      }
    }

    if (first + count == nb) {  // last step of this row
#pragma unroll
      for (int m = 0; m < MM; ++m) {
        float v = acc[m];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == m) y[m * N + row] = f32_to_bf16(v);
        acc[m] = 0.0f;
      }
    }
    __syncwarp();  // everyone is done with this buffer before the next issue overwrites it
    dbuf = dbuf + 1 == kStages ? 0 : dbuf + 1;
    if (++dt == steps_i) {
      dt = 0;
      row += row_stride;
    }
  }
  cp_async_wait<0>();
}

void check(cudaError_t e, DType type, const char* what) {
  if (e != cudaSuccess)
    throw DeviceError(detail::cat("cuda::gguf_gemv(", name(type), "): ", what, " failed: ", cudaGetErrorName(e), ": ",
                                  cudaGetErrorString(e)));
}

template <DType T, int MM>
void launch(const void* w, const std::uint16_t* x, std::int64_t N, std::int64_t K, std::uint16_t* y,
            cudaStream_t stream) {
  auto kernel = gemv_kernel<T, MM>;
  const std::int64_t x_bytes = static_cast<std::int64_t>(MM) * K * 2;
  const bool stage = x_bytes <= kMaxStagedX;
  const auto smem = static_cast<std::size_t>((stage ? x_bytes : 0) + kWarps * kStages * buf_bytes<Fmt<T>>());
  if (smem > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), T,
          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  int device = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&device), T, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), T, "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem), T,
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (per_sm < 1) per_sm = 1;
  const std::int64_t wanted = (N + kWarps - 1) / kWarps;
  const std::int64_t resident = static_cast<std::int64_t>(sms) * per_sm;
  const auto grid = static_cast<unsigned>(wanted < resident ? wanted : resident);
  chained::launch(kernel, grid, kThreads, smem, stream, static_cast<const unsigned char*>(w), x, N, K, y,
                  stage ? 1 : 0);
  check(cudaGetLastError(), T, "kernel launch");
}

template <DType T>
void launch_rows(int M, const void* w, const std::uint16_t* x, std::int64_t N, std::int64_t K, std::uint16_t* y,
                 cudaStream_t s) {
  switch (M) {
    case 1: launch<T, 1>(w, x, N, K, y, s); break;
    case 2: launch<T, 2>(w, x, N, K, y, s); break;
    case 3: launch<T, 3>(w, x, N, K, y, s); break;
    case 4: launch<T, 4>(w, x, N, K, y, s); break;
    case 5: launch<T, 5>(w, x, N, K, y, s); break;
    case 6: launch<T, 6>(w, x, N, K, y, s); break;
    case 7: launch<T, 7>(w, x, N, K, y, s); break;
    default: launch<T, 8>(w, x, N, K, y, s); break;
  }
}

}  // namespace

void gguf_gemv(DType type, const void* w_blocks, const std::uint16_t* x_bf16, int M, std::int64_t N, std::int64_t K,
               std::uint16_t* y_bf16, void* stream) {
  const DTypeInfo ti = info(type);
  if (!gemv_supports(type))
    throw UnsupportedError(detail::cat("cuda::gguf_gemv: weight type ", ti.name,
                                       " is not supported (q8_0, q4_0, q4_1, q4_k, q6_k are); use gguf_gemm"));
  if (M < 1 || M > kGemvMaxRows)
    throw InvalidArgument(detail::cat("cuda::gguf_gemv(", ti.name, "): M = ", M, " rows; it takes 1..", kGemvMaxRows,
                                      " (use gguf_gemm for larger batches)"));
  if (N < 0 || K < 1 || K % ti.block_elems != 0)
    throw InvalidArgument(detail::cat("cuda::gguf_gemv(", ti.name, "): bad shape N=", N, " K=", K,
                                      " (K must be a positive multiple of the block size ", ti.block_elems, ")"));
  if (N == 0) return;
  if (w_blocks == nullptr || x_bf16 == nullptr || y_bf16 == nullptr)
    throw InvalidArgument(detail::cat("cuda::gguf_gemv(", ti.name, "): null ",
                                      w_blocks == nullptr ? "weight" : (x_bf16 == nullptr ? "x" : "y"), " pointer"));
  if (reinterpret_cast<std::uintptr_t>(x_bf16) % 16 != 0)
    throw InvalidArgument(detail::cat("cuda::gguf_gemv(", ti.name, "): x pointer ", static_cast<const void*>(x_bf16),
                                      " is not 16-byte aligned"));
  if (reinterpret_cast<std::uintptr_t>(w_blocks) % 2 != 0 || reinterpret_cast<std::uintptr_t>(y_bf16) % 2 != 0)
    throw InvalidArgument(detail::cat("cuda::gguf_gemv(", ti.name, "): weight and y pointers must be 2-byte aligned"));
  auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case DType::q8_0: launch_rows<DType::q8_0>(M, w_blocks, x_bf16, N, K, y_bf16, s); break;
    case DType::q4_0: launch_rows<DType::q4_0>(M, w_blocks, x_bf16, N, K, y_bf16, s); break;
    case DType::q4_1: launch_rows<DType::q4_1>(M, w_blocks, x_bf16, N, K, y_bf16, s); break;
    case DType::q4_k: launch_rows<DType::q4_k>(M, w_blocks, x_bf16, N, K, y_bf16, s); break;
    case DType::q6_k: launch_rows<DType::q6_k>(M, w_blocks, x_bf16, N, K, y_bf16, s); break;
    default: break;
  }
}

}  // namespace infer::kernels::cuda
