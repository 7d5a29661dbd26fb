#pragma once
/// \file
/// `DeviceAttentionBatch`: one layer of one engine step as a GPU attention policy receives it — plain
/// device pointers and sizes (FlashInfer's way of describing a paged KV layout), so the policy needs no
/// host metadata type and the header needs no CUDA header.
///
/// The step's query rows are stacked in plan order, decodes first (StepPlan's batch order): rows
/// [0, num_decode) are one token per sequence at position decode_lens[s] - 1; the remaining rows are
/// prefill chunks, chunk c holding rows prefill_indptr[c] .. prefill_indptr[c+1]-1 (relative to the first
/// prefill row) at positions prefill_start[c] + i. Every row's K/V is already in the cache. Block tables
/// are [chunks][table_width] int32, one table per chunk, decode tables first.

#include <cstddef>
#include <cstdint>

#include "infer/memory/kv_dtype.hpp"

namespace infer {

struct DeviceAttentionBatch {
  // ---- the layer's cache: [num_blocks][block_size][num_kv_heads][head_dim], K and V: bf16 values, or with
  // kv_dtype fp8_e4m3 e4m3 codes whose values are code · k_scale (K) and code · v_scale (V)
  const void* k = nullptr;
  const void* v = nullptr;
  KvCacheDtype kv_dtype = KvCacheDtype::automatic;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  std::int32_t block_size = 0;
  std::int32_t num_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  float scale = 1.0f;

  // ---- the step
  /// [rows][num_heads][head_dim] bf16, row r at q + r * q_stride: the fused QKV projection's output read in
  /// place (q_stride = its row length), or densely packed (q_stride = 0, num_heads * head_dim apart).
  const std::uint16_t* q = nullptr;
  std::int64_t q_stride = 0;
  std::uint16_t* out = nullptr;      ///< [rows][num_heads][head_dim], dense
  std::int32_t table_width = 0;      ///< entries per block table (capacity = table_width * block_size tokens)
  std::int32_t num_decode = 0;
  const std::int32_t* decode_tables = nullptr;  ///< [num_decode][table_width]
  const std::int32_t* decode_lens = nullptr;    ///< [num_decode] tokens in the cache, this step's included
  std::int32_t num_prefill = 0;
  std::int32_t prefill_rows = 0;                  ///< query rows of all prefill chunks
  const std::int32_t* prefill_tables = nullptr;   ///< [num_prefill][table_width]
  const std::int32_t* prefill_indptr = nullptr;   ///< [num_prefill + 1]
  const std::int32_t* prefill_start = nullptr;    ///< [num_prefill]

  /// Device, at least the policy's workspace_bytes(batch); zeroed when the model allocates it, so a policy
  /// that keeps state there between calls (counters, say) finds zeros first and must leave it as it found it.
  float* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  void* stream = nullptr;  ///< cudaStream_t
};

}  // namespace infer
