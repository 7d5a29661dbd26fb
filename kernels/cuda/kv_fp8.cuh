#pragma once
// An FP8 KV cache's e4m3 codes widened inside the attention kernels, exactly: to f16 for the decode kernel
// (paged_decode_attention.cu: f16 tensor-core math), to bf16 for the prefill kernels (paged_prefill_attention.cu:
// the bf16 cache's math on shared-memory tiles).
//
// To f16: cvt.rn.f16x2.e4m3x2, one instruction for two codes (every e4m3 value, subnormals included, is a
// normal f16).
//
// To bf16 there is no such instruction. The code's bits placed in a bf16 — the sign at bit 15, the 4 exponent and 3 mantissa bits shifted left
// by 4 — are exactly the code's value times 2^-120 (e4m3's exponent bias is 7, bf16's 127; an e4m3
// subnormal lands on a bf16 subnormal with the same factor), and one bf16x2 multiply by 2^120 undoes that
// exactly. That is 4 instructions for two values, no table, no branch; zero stays zero.
#include <cstdint>

namespace infer::kernels::cuda::kv_fp8 {

/// Two e4m3 codes (bytes b and b + 1 of `x`, b = 0 or 2) as an f16x2 of their exact values.
__device__ __forceinline__ std::uint32_t to_f16x2(std::uint32_t x, int b) {
  const auto pair = static_cast<unsigned short>(b == 0 ? x & 0xffffu : x >> 16);
  std::uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(pair));
  return r;
}

/// Eight codes (8 bytes) as eight f16 values (16 bytes), in order.
__device__ __forceinline__ uint4 to_f16x8(const uint2& c) {
  return make_uint4(to_f16x2(c.x, 0), to_f16x2(c.x, 2), to_f16x2(c.y, 0), to_f16x2(c.y, 2));
}

/// Two e4m3 codes (bytes b and b + 1 of `x`, b = 0 or 2) as a bf16x2 of their exact values.
__device__ __forceinline__ std::uint32_t widen2(std::uint32_t x, int b) {
  const std::uint32_t h = __byte_perm(x, 0u, b == 0 ? 0x1404 : 0x3424);  // each code in the high byte of a half
  const std::uint32_t w = (h & 0x80008000u) | ((h >> 4) & 0x07f007f0u);  // the value · 2^-120
  std::uint32_t r;
  // · 2^120 (bf16 0x7b80) + -0: exact, subnormal inputs included; -0 keeps a zero's sign.
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(0x7b807b80u), "r"(0x80008000u));
  return r;
}

/// Eight codes (8 bytes) as eight bf16 values (16 bytes), in order.
__device__ __forceinline__ uint4 widen8(const uint2& c) {
  return make_uint4(widen2(c.x, 0), widen2(c.x, 2), widen2(c.y, 0), widen2(c.y, 2));
}

}  // namespace infer::kernels::cuda::kv_fp8
