#pragma once
/// \file
/// What the prefill attention kernels share (internal to kernels/cuda): their parameters, and the entry of
/// the Hopper kernel, which lives in its own translation unit (sm90a/, compiled for sm_90a only: wgmma).
#include <cuda_runtime.h>

#include <cstdint>

namespace infer::kernels::cuda::detail {

/// One paged_prefill_attention call, as every prefill kernel reads it.
struct PrefillParams {
  const void* k;  ///< bf16 bits, or e4m3 codes (FP8 cache)
  const void* v;
  const std::int32_t* tables;
  const std::int32_t* q_indptr;
  const std::int32_t* q_start;
  const std::uint16_t* q;
  std::int64_t q_stride;  ///< elements from one query row to the next
  std::uint16_t* out;
  int max_blocks;
  int block_shift;
  int kv_heads;
  int num_heads;
  int group;
  float scale_log2;  ///< scale · log2 e (· K's scale, FP8)
  float v_scale;     ///< V's scale (FP8), else 1
};

/// What a prefill thread block reads of its sequence `seq` (query head `h`): its chunk's rows of q and where they
/// sit in the context, and its block table.
struct PrefillSeq {
  int kvh;        ///< the KV head of query head h (GQA)
  int q_begin;    ///< the chunk's first row of q
  int count;      ///< the chunk's queries
  int start;      ///< the context position of its first query
  int cap;        ///< positions the table covers
  int block_mask;
  const std::int32_t* table;

#if defined(__CUDACC__)
  __device__ __forceinline__ PrefillSeq(const PrefillParams& p, int seq, int h)
      : kvh(h / p.group),
        q_begin(p.q_indptr[seq]),
        count(p.q_indptr[seq + 1] - p.q_indptr[seq]),
        start(p.q_start[seq]),
        cap(p.max_blocks << p.block_shift),
        block_mask((1 << p.block_shift) - 1),
        table(p.tables + static_cast<std::size_t>(seq) * p.max_blocks) {}

  /// Values from a layer's cache start to position `pos`'s row of this KV head (head_dim D): through the table.
  __device__ __forceinline__ std::size_t kv_offset(const PrefillParams& p, int pos, int d) const {
    const auto blk = static_cast<std::size_t>(__ldg(table + (pos >> p.block_shift)));
    const std::size_t row = (blk << p.block_shift) + static_cast<std::size_t>(pos & block_mask);
    return (row * static_cast<std::size_t>(p.kv_heads) + static_cast<std::size_t>(kvh)) * static_cast<std::size_t>(d);
  }
#endif
};

/// One tile of BQ queries from q0 in a tensor-core kernel, and the K/V tiles of BK positions it walks.
struct PrefillTile {
  int q0;       ///< its first query in the chunk
  int nq;       ///< its queries (the last tile may have fewer than BQ)
  int last;     ///< its last visible position
  int diag;     ///< positions <= diag are visible to every row
  int n_tiles;  ///< K/V tiles up to `last`

#if defined(__CUDACC__)
  __device__ __forceinline__ PrefillTile(const PrefillSeq& s, int tile, int bq, int bk)
      : q0(tile * bq),
        nq(min(bq, s.count - tile * bq)),
        last(min(s.start + tile * bq + nq - 1, s.cap - 1)),
        diag(min(s.start + tile * bq, last)),
        n_tiles(last < 0 ? 0 : last / bk + 1) {}
#endif
};

/// Whether the wgmma prefill kernel can run on the current device (compute capability 9.0, the only one its
/// sm_90a code runs on).
bool prefill_wgmma_runs_here();

/// The wgmma prefill kernel (bf16 cache, head_dim 64 or 128, 16-byte aligned q and out): a thread block of two
/// warpgroups takes 128 queries of one (sequence, head). `cap`: the most positions a sequence's table covers.
cudaError_t launch_prefill_wgmma(const PrefillParams& p, int head_dim, int num_seqs, std::int64_t cap,
                                 cudaStream_t stream);

}  // namespace infer::kernels::cuda::detail
