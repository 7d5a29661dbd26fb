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

/// Whether the wgmma prefill kernel can run on the current device (compute capability 9.0, the only one its
/// sm_90a code runs on).
bool prefill_wgmma_runs_here();

/// The wgmma prefill kernel (bf16 cache, head_dim 64 or 128, 16-byte aligned q and out): a thread block of two
/// warpgroups takes 128 queries of one (sequence, head). `cap`: the most positions a sequence's table covers.
cudaError_t launch_prefill_wgmma(const PrefillParams& p, int head_dim, int num_seqs, std::int64_t cap,
                                 cudaStream_t stream);

}  // namespace infer::kernels::cuda::detail
