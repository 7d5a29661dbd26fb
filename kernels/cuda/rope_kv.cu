// RoPE on the fused QKV output plus the paged KV-cache write. A token's work is spread over a row of
// blocks (grid.x = tokens, grid.y = blocks per token), one thread per unit of work: rotating P pairs of
// one q or k head (P = 8 with 16-byte accesses when head_dim % 16 == 0 and the pointers allow, else 1),
// or copying 16 bytes (or one value) of v into the cache. Each block first puts its token's (sin, cos) per
// pair into shared memory: angle = f32(position) * inv_freq, an accurate sincosf.
//
// An FP8 cache (kFp8) gets e4m3 codes of value · (1 / scale) instead of the bf16 values: 8 bytes where bf16
// wrote 16.
//
// Why so many threads for a few kilobytes: at batch 1 the whole kernel is one token, and the one block per
// token this replaced walked Llama-3-8B's 2,560 pairs 128 at a time with dependent 2-byte loads, 12.5 µs
// per layer (ncu) against ~3 µs for its neighbours.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "chained_launch.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 128;

/// Rotates the pair (x, y) of bf16 values by the angle whose sine and cosine are s and c: f32 arithmetic,
/// bf16 results.
__device__ __forceinline__ void rope_rotate(float s, float c, std::uint16_t& x, std::uint16_t& y) {
  const float a = bf16_to_f32(x), b = bf16_to_f32(y);
  x = f32_to_bf16(a * c - b * s);
  y = f32_to_bf16(a * s + b * c);
}

/// The sine and cosine of pair i's angle for a token at `position`: f32(position) * inv_freq[i], an accurate
/// sincosf.
__device__ __forceinline__ void rope_angle(int position, const float* inv_freq, int i, float& s, float& c) {
  sincosf(static_cast<float>(position) * __ldg(inv_freq + i), &s, &c);
}

/// rope_write_kv's arguments but the projection's output and T, as its checks see them.
struct RopeKvWrite {
  const std::int32_t* positions = nullptr;  ///< [T]
  const float* inv_freq = nullptr;          ///< [hd / 2]
  int nq = 0, nkv = 0, hd = 0;
  int rope_style = 0;  ///< 0 neox, 1 interleaved
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const std::int64_t* slot = nullptr;  ///< [T]; negative: a padding token, nothing written to the cache

  /// Values per token of the projection: (nq + 2 nkv) heads of hd.
  [[nodiscard]] std::int64_t row_length() const noexcept { return static_cast<std::int64_t>(nq + 2 * nkv) * hd; }
};

/// The cache's value for a bf16 result: itself, or (FP8 cache) its e4m3 code of value · inv_scale.
template <class Kv>
__device__ __forceinline__ Kv to_cache(std::uint16_t x, float inv_scale) {
  if constexpr (std::is_same_v<Kv, std::uint8_t>)
    return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(bf16_to_f32(x) * inv_scale, __NV_SATFINITE, __NV_E4M3));
  else
    return x;
}

/// 8 bf16 values (16 bytes) stored at `dst`: as they are, or as 8 e4m3 codes (8 bytes).
template <class Kv>
__device__ __forceinline__ void store8(Kv* dst, const uint4& v, float inv_scale) {
  if constexpr (std::is_same_v<Kv, std::uint8_t>) {
    const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
    std::uint32_t c[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const auto x = static_cast<std::uint16_t>(w[i / 2] >> (16 * (i & 1)));
      c[i / 4] |= static_cast<std::uint32_t>(to_cache<Kv>(x, inv_scale)) << (8 * (i & 3));
    }
    *reinterpret_cast<uint2*>(dst) = make_uint2(c[0], c[1]);
  } else {
    *reinterpret_cast<uint4*>(dst) = v;
  }
}

/// Pair i of a head: kNeox (i, i + hd/2), else (2i, 2i + 1). kVec: 8 pairs per thread, 16-byte accesses.
/// Kv: the cache's values, bf16 bits or e4m3 codes (then written as value · inv_k or · inv_v).
template <bool kNeox, bool kVec, class Kv>
__global__ void __launch_bounds__(kThreads)
    rope_write_kv_kernel(std::uint16_t* __restrict__ qkv, const std::int32_t* __restrict__ positions,
                         const float* __restrict__ inv_freq, int nq, int nkv, int hd, Kv* __restrict__ k_cache,
                         Kv* __restrict__ v_cache, const std::int64_t* __restrict__ slot, float inv_k, float inv_v) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  constexpr int P = kVec ? 8 : 1;  // pairs per rotating thread
  const int half = hd / 2;
  const int groups = half / P;  // pair groups per head
  const int rotating = (nq + nkv) * groups;
  const int copying = kVec ? nkv * hd / 8 : nkv * hd;
  const std::int64_t t = blockIdx.x;
  const int pos = __ldg(positions + t);
  // The token's (sin, cos) per pair index, once per block: every q and k head rotates by the same angles, and
  // each thread computing its own repeated the sincosf (nq + nkv) times over (Llama-3-8B's 2,048-token prefill:
  // 5.2 M of them, a third of the kernel's time).
  extern __shared__ float2 angle[];
  for (int i = static_cast<int>(threadIdx.x); i < half; i += kThreads) {
    float s, c;
    rope_angle(pos, inv_freq, i, s, c);
    angle[i] = make_float2(s, c);
  }
  __syncthreads();
  const int u = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  if (u >= rotating + copying) return;
  std::uint16_t* row = qkv + t * static_cast<std::int64_t>(nq + 2 * nkv) * hd;
  const std::int64_t dst_row = __ldg(slot + t);
  const bool write = dst_row >= 0;  // a padding token writes nothing to the cache
  const std::int64_t cache_base = dst_row * nkv * hd;

  if (u >= rotating) {  // copy v
    if (!write) return;
    const int j = u - rotating;
    const std::uint16_t* vsrc = row + static_cast<std::int64_t>(nq + nkv) * hd;
    if constexpr (kVec)
      store8(v_cache + cache_base + 8 * j, reinterpret_cast<const uint4*>(vsrc)[j], inv_v);
    else
      v_cache[cache_base + j] = to_cache<Kv>(vsrc[j], inv_v);
    return;
  }

  const int h = u / groups, i0 = (u - h * groups) * P;
  std::uint16_t* head = row + static_cast<std::int64_t>(h) * hd;
  Kv* kdst = h >= nq && write ? k_cache + cache_base + static_cast<std::int64_t>(h - nq) * hd : nullptr;
  // Rotates pair (x, y) by the angle of pair index i.
  const auto rotate = [&](int i, std::uint16_t& x, std::uint16_t& y) {
    const float2 a = angle[i];
    rope_rotate(a.x, a.y, x, y);
  };
  if constexpr (!kVec) {
    const int ia = kNeox ? i0 : 2 * i0, ib = kNeox ? i0 + half : 2 * i0 + 1;
    std::uint16_t x = head[ia], y = head[ib];
    rotate(i0, x, y);
    head[ia] = x;
    head[ib] = y;
    if (kdst) {
      kdst[ia] = to_cache<Kv>(x, inv_k);
      kdst[ib] = to_cache<Kv>(y, inv_k);
    }
  } else {
    // Two 16-byte pieces of 8 values: neox, the 8 first halves at i0 and the 8 second halves at i0 + hd/2
    // (pair j = element j of each); interleaved, 16 consecutive values (pair j = word j: low, high half).
    const int o0 = kNeox ? i0 : 2 * i0, o1 = kNeox ? i0 + half : 2 * i0 + 8;
    const uint4 r0 = *reinterpret_cast<const uint4*>(head + o0), r1 = *reinterpret_cast<const uint4*>(head + o1);
    std::uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
    if constexpr (kNeox) {
#pragma unroll
      for (int w = 0; w < 4; ++w)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int sh = 16 * e;
          auto x = static_cast<std::uint16_t>(w0[w] >> sh), y = static_cast<std::uint16_t>(w1[w] >> sh);
          rotate(i0 + 2 * w + e, x, y);
          w0[w] = (w0[w] & ~(0xffffu << sh)) | (static_cast<std::uint32_t>(x) << sh);
          w1[w] = (w1[w] & ~(0xffffu << sh)) | (static_cast<std::uint32_t>(y) << sh);
        }
    } else {
      const auto rotate_word = [&](int i, std::uint32_t& w) {
        auto x = static_cast<std::uint16_t>(w), y = static_cast<std::uint16_t>(w >> 16);
        rotate(i, x, y);
        w = static_cast<std::uint32_t>(x) | (static_cast<std::uint32_t>(y) << 16);
      };
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        rotate_word(i0 + w, w0[w]);
        rotate_word(i0 + 4 + w, w1[w]);
      }
    }
    const uint4 n0 = make_uint4(w0[0], w0[1], w0[2], w0[3]), n1 = make_uint4(w1[0], w1[1], w1[2], w1[3]);
    *reinterpret_cast<uint4*>(head + o0) = n0;
    *reinterpret_cast<uint4*>(head + o1) = n1;
    if (kdst) {
      store8(kdst + o0, n0, inv_k);
      store8(kdst + o1, n1, inv_k);
    }
  }
}

/// The sizes and style of a RopeKvWrite (not its pointers).
void check_rope_shape(const RopeKvWrite& r, const char* who) {
  using detail::cat;
  if (r.nq < 0 || r.nkv < 0) throw InvalidArgument(cat(who, ": negative head count (nq ", r.nq, ", nkv ", r.nkv, ")"));
  if (r.hd <= 0 || r.hd % 2 != 0 || r.hd > 8192)
    throw InvalidArgument(cat(who, ": head_dim ", r.hd, " must be even and in [2, 8192]"));
  if (r.rope_style != 0 && r.rope_style != 1)
    throw InvalidArgument(cat(who, ": rope_style ", r.rope_style, " is neither 0 (neox) nor 1 (interleaved)"));
  if (r.row_length() > 0x7fffffff)
    throw InvalidArgument(cat(who, ": a row of ", r.nq, " + 2 * ", r.nkv, " heads of ", r.hd, " values is too long"));
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <bool kNeox, bool kVec, class Kv>
void launch(std::int64_t T, cudaStream_t s, std::uint16_t* qkv, const RopeKvWrite& r, float inv_k, float inv_v) {
  constexpr int P = kVec ? 8 : 1;
  const int units = (r.nq + r.nkv) * (r.hd / 2 / P) + (kVec ? r.nkv * r.hd / 8 : r.nkv * r.hd);
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((units + kThreads - 1) / kThreads));
  const auto angles = static_cast<std::size_t>(r.hd / 2) * sizeof(float2);  // ≤ 32 KiB (head_dim ≤ 8192)
  chained::launch(rope_write_kv_kernel<kNeox, kVec, Kv>, grid, dim3(kThreads), angles, s, qkv, r.positions, r.inv_freq, r.nq,
                  r.nkv, r.hd, static_cast<Kv*>(r.k_cache), static_cast<Kv*>(r.v_cache), r.slot, inv_k, inv_v);
}

template <class Kv>
void launch_style(std::int64_t T, cudaStream_t s, std::uint16_t* qkv, const RopeKvWrite& r, bool vec, float inv_k,
                  float inv_v) {
  if (r.rope_style == 0) {
    if (vec) launch<true, true, Kv>(T, s, qkv, r, inv_k, inv_v);
    else launch<true, false, Kv>(T, s, qkv, r, inv_k, inv_v);
  } else {
    if (vec) launch<false, true, Kv>(T, s, qkv, r, inv_k, inv_v);
    else launch<false, false, Kv>(T, s, qkv, r, inv_k, inv_v);
  }
}

/// The pointers of a RopeKvWrite (its sizes checked already).
void check_rope_pointers(const RopeKvWrite& r, const char* who) {
  const void* ptrs[] = {r.positions, r.inv_freq, r.slot};
  const char* names[] = {"positions", "inv_freq", "slot"};
  for (int i = 0; i < 3; ++i)
    if (ptrs[i] == nullptr) throw InvalidArgument(detail::cat(who, ": null ", names[i], " pointer"));
  if (r.nkv > 0 && (r.k_cache == nullptr || r.v_cache == nullptr))
    throw InvalidArgument(detail::cat(who, ": null ", r.k_cache == nullptr ? "k_cache" : "v_cache", " pointer with ",
                                      r.nkv, " KV heads"));
}

}  // namespace

void rope_write_kv(std::uint16_t* qkv_bf16, const std::int32_t* positions, const float* inv_freq, std::int64_t T,
                   int nq, int nkv, int hd, int rope_style, void* k_cache, void* v_cache, const std::int64_t* slot,
                   void* stream, KvCacheDtype kv_dtype, float k_scale, float v_scale) {
  const RopeKvWrite r{positions, inv_freq, nq, nkv, hd, rope_style, k_cache, v_cache, slot};
  constexpr const char* who = "cuda::rope_write_kv";
  if (T < 0) throw InvalidArgument(detail::cat(who, ": negative size (T ", T, ")"));
  check_rope_shape(r, who);
  if (T > 0x7fffffff) throw InvalidArgument(detail::cat(who, ": ", T, " tokens exceed one grid"));
  // A token's units (one pair, or one value of v, per thread at most) spread over grid.y blocks.
  if ((static_cast<std::int64_t>(nq + nkv) * hd / 2 + static_cast<std::int64_t>(nkv) * hd) > std::int64_t{65535} * kThreads)
    throw InvalidArgument(detail::cat(who, ": ", nq, " + ", nkv, " heads of ", hd,
                                      " values are more than one token's row of blocks can take"));
  const bool fp8 = kv_dtype == KvCacheDtype::fp8_e4m3;
  if (fp8) require_kv_scales(who, k_scale, v_scale);
  if (T == 0 || nq + nkv == 0) return;
  if (qkv_bf16 == nullptr) throw InvalidArgument(detail::cat(who, ": null qkv pointer for ", T, " tokens"));
  check_rope_pointers(r, who);
  const bool vec = hd % 16 == 0 && aligned16(qkv_bf16) && (nkv == 0 || (aligned16(k_cache) && aligned16(v_cache)));
  const auto s = static_cast<cudaStream_t>(stream);
  if (fp8) launch_style<std::uint8_t>(T, s, qkv_bf16, r, vec, 1.0f / k_scale, 1.0f / v_scale);
  else launch_style<std::uint16_t>(T, s, qkv_bf16, r, vec, 1.0f, 1.0f);
  backend::cuda::check(cudaGetLastError(), "cuda::rope_write_kv: kernel launch");
}

}  // namespace infer::kernels::cuda
