#pragma once
// RoPE and the KV-cache write as a QKV projection's epilogue, shared by rope_kv.cu (the separate kernel)
// and the batch-1 GEMVs (bf16_gemv.cu, fp8_linear.cu) that fuse it.
//
// The fused GEMVs give each row group the two rows of one rotation pair instead of two neighbours: pair i of
// head h is rows h·hd + i and h·hd + i + hd/2 (neox) or h·hd + 2i and + 1 (interleaved), so the lane that
// ends with both dot products rotates them and writes them where rope_write_kv would: q and k rotated in
// place in the projection's output, k and v also into the cache row of the token's slot. v heads are pairs
// too (not rotated). Each value is rounded to bf16 before the rotation, as the projection's output is
// before rope_write_kv reads it, and both go through rope_rotate: the fused result equals the two kernels'
// bit for bit.
//
// Why: at batch 1 the separate RoPE kernel cost ~3.7-4.4 µs per layer (ncu, H200 and H100), ~0.13 ms of a
// Llama-3-8B decode step, for a few kilobytes of work.
#include <cstdint>

#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"

namespace infer::kernels::cuda::rope_epilogue {

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

/// The pair a row group owns: its head, its pair index within the head, and its two rows of the projection.
struct Pair {
  int head, i;
  std::int64_t row0, row1;
};

__device__ __forceinline__ Pair pair_of(const RopeKvWrite& r, std::int64_t group) {
  const int half = r.hd / 2;
  Pair p;
  p.head = static_cast<int>(group / half);
  p.i = static_cast<int>(group - static_cast<std::int64_t>(p.head) * half);
  const std::int64_t base = static_cast<std::int64_t>(p.head) * r.hd;
  p.row0 = base + (r.rope_style == 0 ? p.i : 2 * p.i);
  p.row1 = base + (r.rope_style == 0 ? p.i + half : 2 * p.i + 1);
  return p;
}

/// What the epilogue needs of token m, read and computed before the GEMV streams its weights, so that the
/// epilogue waits on no load: the rotation's sine and cosine, and the token's cache slot.
struct Token {
  float sin = 0.0f, cos = 1.0f;
  std::int64_t slot = -1;
};

__device__ __forceinline__ Token token_of(const RopeKvWrite& r, const Pair& p, int m) {
  Token t;
  if (p.head < r.nq + r.nkv) rope_angle(__ldg(r.positions + m), r.inv_freq, p.i, t.sin, t.cos);
  if (p.head >= r.nq) t.slot = __ldg(r.slot + m);
  return t;
}

/// Token m's two values of pair `p` (already bf16): rotated unless p is a v head, written to row m of the
/// projection's output y (row length N) and, for k and v heads of a token with a slot, to the cache.
__device__ __forceinline__ void write(const RopeKvWrite& r, const Pair& p, const Token& t, int m, std::int64_t N,
                                      std::uint16_t a, std::uint16_t b, std::uint16_t* __restrict__ y) {
  if (p.head < r.nq + r.nkv) rope_rotate(t.sin, t.cos, a, b);
  y[m * N + p.row0] = a;
  y[m * N + p.row1] = b;
  if (p.head < r.nq) return;
  const std::int64_t slot = t.slot;
  if (slot < 0) return;  // a padding token writes nothing to the cache
  const bool is_k = p.head < r.nq + r.nkv;
  const int kv = p.head - r.nq - (is_k ? 0 : r.nkv);
  std::uint16_t* dst = (is_k ? r.k_cache : r.v_cache) + (slot * r.nkv + kv) * r.hd;
  const std::int64_t base = static_cast<std::int64_t>(p.head) * r.hd;
  dst[p.row0 - base] = a;
  dst[p.row1 - base] = b;
}

}  // namespace infer::kernels::cuda::rope_epilogue
