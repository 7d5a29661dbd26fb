// RoPE on the fused QKV output plus the paged KV-cache write. One block per token: its threads first
// compute the token's hd/2 (cos, sin) pairs into shared memory (angle = f32(position) * inv_freq, an
// accurate sincosf), then rotate every q and k pair in place, copy rotated k into cache row slot[t],
// and copy v there too (16-byte chunks when head_dim % 8 == 0 and the pointers allow).
#include <cuda_runtime.h>

#include <cstdint>

#include "infer/backend/cuda_runtime.hpp"
#include "infer/core/error.hpp"
#include "infer/core/half.hpp"
#include "infer/kernels/cuda/ops.hpp"
#include "chained_launch.cuh"

namespace infer::kernels::cuda {
namespace {

constexpr int kThreads = 128;

/// kNeox: pair i is (i, i + hd/2); otherwise (2i, 2i + 1). kVecV: v copied in 16-byte chunks.
template <bool kNeox, bool kVecV>
__global__ void rope_write_kv_kernel(std::uint16_t* __restrict__ qkv, const std::int32_t* __restrict__ positions,
                                     const float* __restrict__ inv_freq, int nq, int nkv, int hd,
                                     std::uint16_t* __restrict__ k_cache, std::uint16_t* __restrict__ v_cache,
                                     const std::int64_t* __restrict__ slot) {
  chained::wait_for_previous_kernel();  // chained launch: see chained_launch.cuh
  extern __shared__ float cs[];  // [half] cos, then [half] sin
  const std::int64_t t = blockIdx.x;
  const int half = hd / 2;
  const auto pos = static_cast<float>(__ldg(positions + t));
  for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
    float s, c;
    sincosf(pos * __ldg(inv_freq + i), &s, &c);
    cs[i] = c;
    cs[half + i] = s;
  }
  __syncthreads();

  const std::int64_t row_stride = static_cast<std::int64_t>(nq + 2 * nkv) * hd;
  std::uint16_t* row = qkv + t * row_stride;
  const std::int64_t dst_row = __ldg(slot + t);
  const bool write = dst_row >= 0;
  const std::int64_t cache_base = dst_row * nkv * hd;

  const int pairs = (nq + nkv) * half;
  for (int j = static_cast<int>(threadIdx.x); j < pairs; j += static_cast<int>(blockDim.x)) {
    const int h = j / half, i = j - h * half;
    const int ia = kNeox ? i : 2 * i, ib = kNeox ? i + half : 2 * i + 1;
    std::uint16_t* v = row + static_cast<std::int64_t>(h) * hd;
    const float a = bf16_to_f32(v[ia]), b = bf16_to_f32(v[ib]);
    const float c = cs[i], s = cs[half + i];
    const std::uint16_t ra = f32_to_bf16(a * c - b * s), rb = f32_to_bf16(a * s + b * c);
    v[ia] = ra;
    v[ib] = rb;
    if (h >= nq && write) {
      std::uint16_t* k = k_cache + cache_base + static_cast<std::int64_t>(h - nq) * hd;
      k[ia] = ra;
      k[ib] = rb;
    }
  }

  if (!write) return;
  const std::uint16_t* vsrc = row + static_cast<std::int64_t>(nq + nkv) * hd;
  std::uint16_t* vdst = v_cache + cache_base;
  if constexpr (kVecV) {
    const int chunks = nkv * hd / 8;
    for (int j = static_cast<int>(threadIdx.x); j < chunks; j += static_cast<int>(blockDim.x))
      reinterpret_cast<uint4*>(vdst)[j] = reinterpret_cast<const uint4*>(vsrc)[j];
  } else {
    const int n = nkv * hd;
    for (int j = static_cast<int>(threadIdx.x); j < n; j += static_cast<int>(blockDim.x)) vdst[j] = vsrc[j];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <bool kNeox>
void launch(bool vec, std::int64_t T, cudaStream_t s, std::uint16_t* qkv, const std::int32_t* positions,
            const float* inv_freq, int nq, int nkv, int hd, std::uint16_t* k_cache, std::uint16_t* v_cache,
            const std::int64_t* slot) {
  const dim3 grid(static_cast<unsigned>(T)), block(kThreads);
  const std::size_t smem = static_cast<std::size_t>(hd) * sizeof(float);
  if (vec)
    chained::launch(rope_write_kv_kernel<kNeox, true>, grid, block, smem, s, qkv, positions, inv_freq, nq, nkv, hd,
                    k_cache, v_cache, slot);
  else
    chained::launch(rope_write_kv_kernel<kNeox, false>, grid, block, smem, s, qkv, positions, inv_freq, nq, nkv, hd,
                    k_cache, v_cache, slot);
}

}  // namespace

void rope_write_kv(std::uint16_t* qkv_bf16, const std::int32_t* positions, const float* inv_freq, std::int64_t T,
                   int nq, int nkv, int hd, int rope_style, std::uint16_t* k_cache, std::uint16_t* v_cache,
                   const std::int64_t* slot, void* stream) {
  if (T < 0 || nq < 0 || nkv < 0)
    throw InvalidArgument(detail::cat("cuda::rope_write_kv: negative size (T ", T, ", nq ", nq, ", nkv ", nkv, ")"));
  if (hd <= 0 || hd % 2 != 0 || hd > 8192)
    throw InvalidArgument(detail::cat("cuda::rope_write_kv: head_dim ", hd, " must be even and in [2, 8192]"));
  if (rope_style != 0 && rope_style != 1)
    throw InvalidArgument(detail::cat("cuda::rope_write_kv: rope_style ", rope_style,
                                      " is neither 0 (neox) nor 1 (interleaved)"));
  if (static_cast<std::int64_t>(nq + 2 * nkv) * hd > 0x7fffffff)
    throw InvalidArgument(detail::cat("cuda::rope_write_kv: a row of ", nq, " + 2 * ", nkv, " heads of ", hd,
                                      " values is too long"));
  if (T > 0x7fffffff) throw InvalidArgument(detail::cat("cuda::rope_write_kv: ", T, " tokens exceed one grid"));
  if (T == 0 || nq + nkv == 0) return;
  const void* ptrs[] = {qkv_bf16, positions, inv_freq, slot};
  const char* names[] = {"qkv", "positions", "inv_freq", "slot"};
  for (int i = 0; i < 4; ++i)
    if (ptrs[i] == nullptr)
      throw InvalidArgument(detail::cat("cuda::rope_write_kv: null ", names[i], " pointer for ", T, " tokens"));
  if (nkv > 0 && (k_cache == nullptr || v_cache == nullptr))
    throw InvalidArgument(detail::cat("cuda::rope_write_kv: null ", k_cache == nullptr ? "k_cache" : "v_cache",
                                      " pointer with ", nkv, " KV heads"));
  const bool vec = hd % 8 == 0 && aligned16(qkv_bf16) && aligned16(v_cache);
  const auto s = static_cast<cudaStream_t>(stream);
  if (rope_style == 0)
    launch<true>(vec, T, s, qkv_bf16, positions, inv_freq, nq, nkv, hd, k_cache, v_cache, slot);
  else
    launch<false>(vec, T, s, qkv_bf16, positions, inv_freq, nq, nkv, hd, k_cache, v_cache, slot);
  backend::cuda::check(cudaGetLastError(), "cuda::rope_write_kv: kernel launch");
}

}  // namespace infer::kernels::cuda
