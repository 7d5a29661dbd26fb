#pragma once
/// \file
/// `PagedAttention<Tuning>`: the AttentionKernel of the dynamic paged engine. A sequence's K/V rows
/// are found through its block table (PagedKvView), so blocks can be shared between sequences
/// (prefix cache, forks) and grown one at a time. `Tuning` holds the per-backend tile sizes
/// (`cpu_kv_tile`, see cpu_attention.hpp); `void` takes the defaults.
/// The CPU `attend` runs one chunk over its view; the CUDA `attend(cuda, batch)` runs a whole step of
/// one layer: the flash-decoding kernel over the decode rows and the causal prefill kernel over the
/// prefill chunks (kernels/cuda/paged_{decode,prefill}_attention.cu), both reading the block tables.

#include <cstdint>
#include <span>
#include <string_view>

#include "infer/attention/cpu_attention.hpp"
#include "infer/attention/device_batch.hpp"
#include "infer/attention/kv_view.hpp"
#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"
#if defined(INFER_HAVE_CUDA)
#include "infer/kernels/cuda/attention.hpp"
#endif

namespace infer {

template <class Tuning = void>
struct PagedAttention {
  static constexpr KvLayout layout = KvLayout::paged;
  static constexpr std::string_view name = "paged";
  static constexpr bool reads_fp8_kv_cache = true;  ///< concepts.hpp
  template <class T>
  using view = PagedKvView<T>;

  /// One layer's view of one sequence: `table` (the allocator's block_table) must outlive the view.
  template <class T>
  static view<T> make_view(T* k, T* v, std::span<const std::int32_t> table, std::int32_t block_size,
                           std::int32_t kv_heads, std::int32_t head_dim) {
    return view<T>{k, v, table.data(), static_cast<std::int32_t>(table.size()), block_size, kv_heads, head_dim};
  }

  /// T: float, or std::uint8_t for an FP8 cache's e4m3 codes (cpu_attention.hpp).
  template <class T>
  static void attend(cpu, const AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<T>& kv) {
    require<InvalidArgument>(static_cast<std::int64_t>(start) + count <=
                                 static_cast<std::int64_t>(kv.num_table_blocks) * kv.block_size,
                             "PagedAttention: positions up to ", static_cast<std::int64_t>(start) + count,
                             " need more than the ", kv.num_table_blocks, " blocks of ", kv.block_size,
                             " tokens in the block table; grow the sequence first");
    kernels::cpu::attention<kernels::cpu::detail::cpu_kv_tile<Tuning>()>(shape, q, out, start, count, kv);
  }

#if defined(INFER_HAVE_CUDA)
  /// Decode rows through the split-K kernel (its partial softmax states need the workspace), prefill
  /// chunks through the causal kernel; both enqueue on batch.stream and never synchronize.
  static void attend(cuda, const DeviceAttentionBatch& b) {
    if (b.num_decode > 0)
      kernels::cuda::paged_decode_attention(decode_part(b), b.q, b.num_heads, b.scale, b.out, b.workspace,
                                            b.workspace_bytes, b.stream, b.q_stride);
    if (b.num_prefill > 0) {
      const std::int64_t dense = static_cast<std::int64_t>(b.num_heads) * b.head_dim;
      const auto first = static_cast<std::size_t>(b.num_decode);
      kernels::cuda::paged_prefill_attention(prefill_part(b), b.q + first * static_cast<std::size_t>(b.q_stride ? b.q_stride : dense),
                                             b.prefill_indptr, b.prefill_start, b.num_heads, b.scale,
                                             b.out + first * static_cast<std::size_t>(dense), b.stream, b.q_stride);
    }
  }

  /// Workspace of the decode kernel's split-K partials (the prefill kernel needs none).
  static std::size_t workspace_bytes(cuda, const DeviceAttentionBatch& b) {
    return b.num_decode > 0 ? kernels::cuda::paged_decode_workspace_bytes(decode_part(b), b.num_heads) : 0;
  }

 private:
  static kernels::cuda::PagedKvBatch decode_part(const DeviceAttentionBatch& b) {
    return {b.k,          b.v,          b.decode_tables, b.decode_lens, b.num_decode, b.table_width, b.block_size,
            b.num_kv_heads, b.head_dim, b.kv_dtype,      b.k_scale,     b.v_scale};
  }
  static kernels::cuda::PagedKvBatch prefill_part(const DeviceAttentionBatch& b) {
    return {b.k,          b.v,          b.prefill_tables, nullptr,   b.num_prefill, b.table_width, b.block_size,
            b.num_kv_heads, b.head_dim, b.kv_dtype,       b.k_scale, b.v_scale};
  }
#endif
};

static_assert(AttentionKernel<PagedAttention<>, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(AttentionKernel<PagedAttention<>, cuda>);
#endif

}  // namespace infer
