// RoPE on the fused QKV output plus the paged KV-cache write. A token's work is spread over a row of
// blocks (grid.x = tokens, grid.y = blocks per token), one thread per unit of work: rotating P pairs of
// one q or k head (P = 8 with 16-byte accesses when head_dim % 16 == 0 and the pointers allow, else 1),
// or copying 16 bytes (or one value) of v into the cache. Each thread computes the (cos, sin) of its own
// pairs: angle = f32(position) * inv_freq, an accurate sincosf.
//
// Why so many threads for a few kilobytes: at batch 1 the whole kernel is one token, and the one block per
// token this replaced walked Llama-3-8B's 2,560 pairs 128 at a time with dependent 2-byte loads, 12.5 µs
// per layer (ncu) against ~3 µs for its neighbours.
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "chained_launch.cuh"
#include "rope_epilogue.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 128;

/// Pair i of a head: kNeox (i, i + hd/2), else (2i, 2i + 1). kVec: 8 pairs per thread, 16-byte accesses.
template <bool kNeox, bool kVec>
__global__ void __launch_bounds__(kThreads)
    rope_write_kv_kernel(std::uint16_t* __restrict__ qkv, const std::int32_t* __restrict__ positions,
                         const float* __restrict__ inv_freq, int nq, int nkv, int hd, std::uint16_t* __restrict__ k_cache,
                         std::uint16_t* __restrict__ v_cache, const std::int64_t* __restrict__ slot) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  constexpr int P = kVec ? 8 : 1;  // pairs per rotating thread
  const int half = hd / 2;
  const int groups = half / P;  // pair groups per head
  const int rotating = (nq + nkv) * groups;
  const int copying = kVec ? nkv * hd / 8 : nkv * hd;
  const int u = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  if (u >= rotating + copying) return;
  const std::int64_t t = blockIdx.x;
  std::uint16_t* row = qkv + t * static_cast<std::int64_t>(nq + 2 * nkv) * hd;
  const std::int64_t dst_row = __ldg(slot + t);
  const bool write = dst_row >= 0;  // a padding token writes nothing to the cache
  const std::int64_t cache_base = dst_row * nkv * hd;

  if (u >= rotating) {  // copy v
    if (!write) return;
    const int j = u - rotating;
    const std::uint16_t* vsrc = row + static_cast<std::int64_t>(nq + nkv) * hd;
    if constexpr (kVec)
      reinterpret_cast<uint4*>(v_cache + cache_base)[j] = reinterpret_cast<const uint4*>(vsrc)[j];
    else
      v_cache[cache_base + j] = vsrc[j];
    return;
  }

  const int h = u / groups, i0 = (u - h * groups) * P;
  std::uint16_t* head = row + static_cast<std::int64_t>(h) * hd;
  std::uint16_t* kdst = h >= nq && write ? k_cache + cache_base + static_cast<std::int64_t>(h - nq) * hd : nullptr;
  const int pos = __ldg(positions + t);
  // Rotates pair (x, y) by the angle of pair index i.
  const auto rotate = [&](int i, std::uint16_t& x, std::uint16_t& y) {
    float s, c;
    rope_epilogue::rope_angle(pos, inv_freq, i, s, c);
    rope_epilogue::rope_rotate(s, c, x, y);
  };
  if constexpr (!kVec) {
    const int ia = kNeox ? i0 : 2 * i0, ib = kNeox ? i0 + half : 2 * i0 + 1;
    std::uint16_t x = head[ia], y = head[ib];
    rotate(i0, x, y);
    head[ia] = x;
    head[ib] = y;
    if (kdst) {
      kdst[ia] = x;
      kdst[ib] = y;
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
      *reinterpret_cast<uint4*>(kdst + o0) = n0;
      *reinterpret_cast<uint4*>(kdst + o1) = n1;
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

template <bool kNeox, bool kVec>
void launch(std::int64_t T, cudaStream_t s, std::uint16_t* qkv, const std::int32_t* positions, const float* inv_freq,
            int nq, int nkv, int hd, std::uint16_t* k_cache, std::uint16_t* v_cache, const std::int64_t* slot) {
  constexpr int P = kVec ? 8 : 1;
  const int units = (nq + nkv) * (hd / 2 / P) + (kVec ? nkv * hd / 8 : nkv * hd);
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((units + kThreads - 1) / kThreads));
  chained::launch(rope_write_kv_kernel<kNeox, kVec>, grid, dim3(kThreads), 0, s, qkv, positions, inv_freq, nq, nkv,
                  hd, k_cache, v_cache, slot);
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

void check_rope_kv_write(const RopeKvWrite& r, const char* who) {
  check_rope_shape(r, who);
  check_rope_pointers(r, who);
}

void rope_write_kv(std::uint16_t* qkv_bf16, const std::int32_t* positions, const float* inv_freq, std::int64_t T,
                   int nq, int nkv, int hd, int rope_style, std::uint16_t* k_cache, std::uint16_t* v_cache,
                   const std::int64_t* slot, void* stream) {
  const RopeKvWrite r{positions, inv_freq, nq, nkv, hd, rope_style, k_cache, v_cache, slot};
  constexpr const char* who = "cuda::rope_write_kv";
  if (T < 0) throw InvalidArgument(detail::cat(who, ": negative size (T ", T, ")"));
  check_rope_shape(r, who);
  if (T > 0x7fffffff) throw InvalidArgument(detail::cat(who, ": ", T, " tokens exceed one grid"));
  // A token's units (one pair, or one value of v, per thread at most) spread over grid.y blocks.
  if ((static_cast<std::int64_t>(nq + nkv) * hd / 2 + static_cast<std::int64_t>(nkv) * hd) > std::int64_t{65535} * kThreads)
    throw InvalidArgument(detail::cat(who, ": ", nq, " + ", nkv, " heads of ", hd,
                                      " values are more than one token's row of blocks can take"));
  if (T == 0 || nq + nkv == 0) return;
  if (qkv_bf16 == nullptr) throw InvalidArgument(detail::cat(who, ": null qkv pointer for ", T, " tokens"));
  check_rope_pointers(r, who);
  const bool vec = hd % 16 == 0 && aligned16(qkv_bf16) && (nkv == 0 || (aligned16(k_cache) && aligned16(v_cache)));
  const auto s = static_cast<cudaStream_t>(stream);
  if (rope_style == 0) {
    if (vec) launch<true, true>(T, s, qkv_bf16, positions, inv_freq, nq, nkv, hd, k_cache, v_cache, slot);
    else launch<true, false>(T, s, qkv_bf16, positions, inv_freq, nq, nkv, hd, k_cache, v_cache, slot);
  } else {
    if (vec) launch<false, true>(T, s, qkv_bf16, positions, inv_freq, nq, nkv, hd, k_cache, v_cache, slot);
    else launch<false, false>(T, s, qkv_bf16, positions, inv_freq, nq, nkv, hd, k_cache, v_cache, slot);
  }
  backend::cuda::check(cudaGetLastError(), "cuda::rope_write_kv: kernel launch");
}

}  // namespace infer::kernels::cuda
