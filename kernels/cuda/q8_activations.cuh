// Activations quantized to int8 per 32 values for the GGUF integer kernels (gguf_gemv.cu, gguf_mmq.cu): the
// codes and quant::Q8Scale of quant::quantize_q8_block, the CPU reference, bit for bit (the same IEEE division
// and round-to-nearest-even; the maximum is exact in any order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "infer/quant/gguf_dot.hpp"

namespace infer::kernels::cuda {

/// x as 8-value chunks of bf16: chunk c is 16 bytes at x + 8c. A source of quantize_q8_chunks_from, which reads a
/// chunk in two halves so that a thread's loads of several chunks are in flight together: `fetch(c)` loads chunk
/// c's bytes (its `Raw`, loads only), `expand(raw, c, v)` puts its values (bf16 values as floats) in v; kMaxBatch
/// is how many Raw a thread may hold at once (registers: 4 here, 16 of them).
struct Bf16Chunks {
  const std::uint16_t* __restrict__ x;
  using Raw = uint4;
  static constexpr int kMaxBatch = 4;
  __device__ __forceinline__ Raw fetch(std::int64_t c) const { return reinterpret_cast<const uint4*>(x)[c]; }
  __device__ __forceinline__ void expand(const Raw& u, std::int64_t, float (&v)[8]) const {
    const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[2 * e] = __uint_as_float(w[e] << 16);
      v[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
  }
};

/// x into int8 codes and a Q8Scale per 32 values, by a set of threads that walk the 8-value chunks
/// from `first` in steps of `stride`: each thread takes 8 values (Bf16Chunks: one 16-byte load), 4
/// neighbouring lanes a block, which agree on its maximum by shuffles. Chunks at or past `valid` (of `chunks`, a
/// multiple of 4) are zeros: codes 0 and scale 0, the padding rows of a tile. `first` and `stride` must keep
/// whole warps together (each a multiple of 32 plus the lane): the loop's trip count is uniform across a warp,
/// for its shuffles. Where the results go is the store's: `store.codes(c, codes)` takes chunk c's 8 codes (every
/// chunk below `chunks`), `store.scale(b, scale)` block b's scale (b = c / 4, called once a block).
///
/// batch (1..Source::kMaxBatch, the same in every thread; larger is taken as kMaxBatch): chunks a thread fetches
/// before it expands any. x was just written by the previous kernel and sits in L2, so each round of this loop
/// waits one L2 round trip (~0.5 us on an H100 under load); a GEMV whose CTAs each quantize all of x
/// (gguf_gemv.cu: 1,792 chunks of Llama-3-8B's down projection over 256 threads, 7 rounds) keeps its weight
/// stream waiting that long, so it fetches several chunks a round. Kernels whose threads hold one chunk each
/// (gguf_mmq.cu's quantization) keep 1.
template <class Source, class Store>
__device__ __forceinline__ void quantize_q8_chunks_from(const Source& src, std::int64_t valid, std::int64_t chunks,
                                                        Store& store, std::int64_t first, std::int64_t stride,
                                                        int batch = 1) {
  constexpr int kMaxBatch = Source::kMaxBatch;
  if (batch > kMaxBatch) batch = kMaxBatch;
  const std::int64_t lane0 = first & ~std::int64_t{31};  // the warp's first chunk of this round
  for (std::int64_t base = lane0; base < chunks; base += batch * stride) {
    typename Source::Raw raw[kMaxBatch];
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) {  // every load of the round first
      const std::int64_t c = base + b * stride + (first & 31);
      if (b < batch && c < valid) raw[b] = src.fetch(c);
    }
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) {
      if (b >= batch) break;
      const std::int64_t c = base + b * stride + (first & 31);
      const bool in_range = c < chunks;
      float v[8];
      if (c < valid) {
        src.expand(raw[b], c, v);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = 0.0f;
      }
      float amax = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      std::uint32_t packed[2] = {0u, 0u};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int q = __float2int_rn(v[e] * id);
        sum += q;
        packed[e / 4] |= (static_cast<std::uint32_t>(q) & 0xffu) << (8 * (e % 4));
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);              // lanes 0-1 of the block: values 0-15
      const int other = __shfl_xor_sync(0xffffffffu, sum, 2);  // lanes 2-3: values 16-31
      if (in_range) {
        store.codes(c, make_uint2(packed[0], packed[1]));
        if ((c & 3) == 0)
          store.scale(c / 4, quant::Q8Scale{amax / 127.0f, static_cast<std::int16_t>(sum), static_cast<std::int16_t>(other)});
      }
    }
  }
}

/// quantize_q8_chunks_from a bf16 x.
template <class Store>
__device__ __forceinline__ void quantize_q8_chunks_into(const std::uint16_t* __restrict__ x, std::int64_t valid,
                                                        std::int64_t chunks, Store& store, std::int64_t first,
                                                        std::int64_t stride) {
  quantize_q8_chunks_from(Bf16Chunks{x}, valid, chunks, store, first, stride);
}

/// The plain layout: chunk c's codes at xq + 8c, block b's scale at xs[b].
struct Q8PlainStore {
  std::int8_t* xq;
  quant::Q8Scale* xs;
  __device__ __forceinline__ void codes(std::int64_t c, uint2 v) const { reinterpret_cast<uint2*>(xq)[c] = v; }
  __device__ __forceinline__ void scale(std::int64_t b, quant::Q8Scale v) const { xs[b] = v; }
};

/// quantize_q8_chunks_into in the plain layout.
__device__ __forceinline__ void quantize_q8_chunks(const std::uint16_t* __restrict__ x, std::int64_t valid,
                                                   std::int64_t chunks, std::int8_t* xq, quant::Q8Scale* xs,
                                                   std::int64_t first, std::int64_t stride) {
  Q8PlainStore store{xq, xs};
  quantize_q8_chunks_into(x, valid, chunks, store, first, stride);
}

}  // namespace infer::kernels::cuda
