#pragma once
/// \file
/// Device-only building blocks for Hopper's warpgroup MMA (wgmma.mma_async, sm_90a only): bf16 inputs, f32
/// accumulators, operands in shared memory described by a 64-bit descriptor or A in registers.
///
/// A warpgroup is 4 consecutive warps (128 threads) that issue each wgmma together. For a 64 x N result, warp
/// w of the group owns rows 16w..16w+15 and each thread holds, for every n8 column tile j, the four values
/// d[4j + 0..3] = (row g, cols 8j + 2t, +1), (row g + 8, cols 8j + 2t, +1), with g = lane / 4 and t = lane % 4:
/// per warp, exactly the C layout of mma.sync.m16n8k16 (mma_bf16.cuh). A 64 x 16 A operand in registers has
/// the mma.sync A layout per warp (a0..a3), so an f32 result rounded to bf16 pairs feeds the next product.
///
/// Shared operands use the 128-byte swizzle: a tile is stored as panels of 64 bf16 (128 bytes) a row, rows
/// 128 bytes apart, and the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its row; every panel starts
/// on a 1,024-byte boundary (8 rows, one swizzle period). Such a panel is read
///  - "K-major" (the reduction index along the row: Q and K for S = Q·Kᵀ): stride between 8-row groups 1,024
///    bytes; the k16 step s of a panel starts 32·s bytes into it;
///  - "MN-major" (the output index along the row: V for O = P·V, with the transpose flag): 8-row groups (of
///    the reduction index) 1,024 bytes apart, and the next 64 output columns in the next panel, `panel_bytes`
///    on; the k16 step s starts 16 rows (2,048 bytes) on.
/// Shared memory written by ordinary stores or cp.async must be fenced (fence_proxy_async) before a wgmma
/// reads it, and registers written by other instructions before a wgmma uses them (fence()).
#include <cstdint>

namespace infer::kernels::cuda::detail::wgmma {

/// The descriptor of a 128-byte-swizzled shared operand at shared address `addr` (see above): `lbo` is the
/// byte distance between panels along the row's index where the operand spans several (MN-major), `sbo`
/// between 8-row groups.
__device__ __forceinline__ std::uint64_t desc_sw128(std::uint32_t addr, std::uint32_t lbo, std::uint32_t sbo) {
  return static_cast<std::uint64_t>((addr & 0x3ffffu) >> 4) | (static_cast<std::uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<std::uint64_t>((sbo >> 4) & 0x3fffu) << 32) | (std::uint64_t{1} << 62);
}

/// Orders this thread's earlier register and shared-memory accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
/// Closes the wgmmas issued since the last commit into one group.
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/// Waits until at most N committed groups are in flight (their results then readable).
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Ties registers a wgmma in flight reads or writes to this point of the program. The compiler sees a wgmma's
/// accumulators as written, and its A registers as read, when the instruction issues, while the tensor cores
/// use them until wait() returns: without this after the wait, it could move a read of the results (or a reuse
/// of the A registers) before it.
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(std::uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

/// Makes this thread's generic-proxy writes to shared memory (stores, cp.async) visible to the async proxy
/// that wgmma reads through; then a barrier, then the wgmma.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define INFER_WG_F8(d, i)                                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])

/// d (64 x 64) += A (64 x 16, shared, K-major) · B where B's 64 columns are the rows of a K-major shared tile.
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[32], std::uint64_t desc_a, std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : INFER_WG_F8(d, 0), INFER_WG_F8(d, 8), INFER_WG_F8(d, 16), INFER_WG_F8(d, 24)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

/// d (64 x 64) += A (64 x 16, registers) · B (16 x 64, shared, MN-major: transposed).
__device__ __forceinline__ void mma_m64n64k16_rs_tb(float (&d)[32], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : INFER_WG_F8(d, 0), INFER_WG_F8(d, 8), INFER_WG_F8(d, 16), INFER_WG_F8(d, 24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

/// d (64 x 128) += A (64 x 16, registers) · B (16 x 128, shared, MN-major over two panels: transposed).
__device__ __forceinline__ void mma_m64n128k16_rs_tb(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : INFER_WG_F8(d, 0), INFER_WG_F8(d, 8), INFER_WG_F8(d, 16), INFER_WG_F8(d, 24), INFER_WG_F8(d, 32),
        INFER_WG_F8(d, 40), INFER_WG_F8(d, 48), INFER_WG_F8(d, 56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

#undef INFER_WG_F8

}  // namespace infer::kernels::cuda::detail::wgmma
