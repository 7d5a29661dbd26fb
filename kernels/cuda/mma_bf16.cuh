#pragma once
/// \file
/// Device-only building blocks for bf16 tensor-core kernels on sm_80+ (inline PTX): warp-level
/// `mma.sync.m16n8k16` with f32 accumulators, `ldmatrix` fragment loads from shared memory, `cp.async`
/// 16-byte global->shared copies with zero fill, and the conversions the softmax needs.
///
/// Fragment layouts of mma.m16n8k16.row.col (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
/// g = lane / 4 (the "group") and t = lane % 4 (the thread in the group); each .b32 holds two bf16, the
/// lower column (or k) index in the low half:
///  - A (16 x 16, row-major): a0 = (row g, cols 2t..2t+1), a1 = (row g+8, cols 2t..), a2 = (row g, cols
///    2t+8..), a3 = (row g+8, cols 2t+8..);
///  - B (16 x 8, k x n):      b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g);
///  - C (16 x 8, f32):        c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1).
/// `ldmatrix.x4` loads four 8x8 b16 matrices: lanes 8i..8i+7 give the row addresses of matrix i, and
/// register i of every lane receives matrix i's (row g, cols 2t..2t+1); with `.trans` it receives
/// (rows 2t and 2t+1, col g), i.e. the fragment of the transposed matrix.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace infer::kernels::cuda::detail {

/// The shared-state-space address (what ldmatrix / cp.async take) of a generic pointer to shared memory.
__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// D += A * B for one 16x8x16 tile: bf16 inputs, f32 accumulators (layouts above).
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                  std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// The same with f16 inputs.
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                 std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Four 8x8 b16 matrices from shared memory; this lane gives the address of row (lane % 8) of matrix lane / 8.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// As ldmatrix_x4, each matrix transposed on the way.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// Asynchronous 16-byte copy global -> shared through L2 only (.cg). With `valid` false nothing is read
/// (src may be any valid address) and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

/// Asynchronous 8-byte copy global -> shared (through L1: .cg takes 16 bytes only).
__device__ __forceinline__ void cp_async_8(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most N of this thread's committed cp.async groups are still pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Two f32 -> one .b32 of two bf16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  std::uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/// Two f32 -> one .b32 of two f16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ std::uint32_t pack_f16x2(float lo, float hi) {
  std::uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/// The f16 in the low / high half of a .b32, as f32.
__device__ __forceinline__ float lo_f16(std::uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
}
__device__ __forceinline__ float hi_f16(std::uint32_t w) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

/// 2^x on the SFU (ex2.approx.ftz: ~2 ulp; 2^-inf = 0; results below 2^-126 flush to 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

}  // namespace infer::kernels::cuda::detail
