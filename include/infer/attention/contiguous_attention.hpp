#pragma once
/// \file
/// `FusedContiguousAttention<Tuning>`: the AttentionKernel of the static-shape engine. Each sequence
/// owns one slot of consecutive token rows (ContiguousKvView), so addressing is a multiply, with no
/// table lookup. Allocators hand every kernel a block table and a block size; a contiguous allocator's
/// table is its slot's consecutive blocks, so the slot starts at row table[0]·block_size and holds
/// table.size()·block_size rows, which is how make_view reads them. On the CPU the math is the shared
/// kernel of cpu_attention.hpp. On the GPU the slot *is* a block table, and the paged kernels read it as
/// such (PagedAttention's attend): a separate contiguous kernel would pay only if it fused more (RoPE,
/// the K/V write), which no benchmark has asked for yet.

#include <cstdint>
#include <span>
#include <string_view>

#include "infer/attention/cpu_attention.hpp"
#include "infer/attention/kv_view.hpp"
#include "infer/attention/paged_attention.hpp"
#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"

namespace infer {

template <class Tuning = void>
struct FusedContiguousAttention {
  static constexpr KvLayout layout = KvLayout::contiguous;
  static constexpr std::string_view name = "fused_contiguous";
  static constexpr bool reads_fp8_kv_cache = true;  ///< concepts.hpp
  template <class T>
  using view = ContiguousKvView<T>;

  /// The slot of table.size() consecutive blocks starting at table[0]. InvalidArgument for an empty table
  /// (no slot assigned) or one that does not start on a slot boundary (table[0] a multiple of its size).
  template <class T>
  static view<T> make_view(T* k, T* v, std::span<const std::int32_t> table, std::int32_t block_size,
                           std::int32_t kv_heads, std::int32_t head_dim) {
    require<InvalidArgument>(!table.empty(),
                             "FusedContiguousAttention::make_view: the block table is empty; a contiguous sequence's "
                             "table is its slot's consecutive blocks");
    const auto blocks = static_cast<std::int32_t>(table.size());
    require<InvalidArgument>(table[0] >= 0 && table[0] % blocks == 0, "FusedContiguousAttention::make_view: the table ",
                             "starts at block ", table[0], ", not at a slot of ", blocks, " blocks");
    return view<T>{k, v, table[0] / blocks, blocks * block_size, kv_heads, head_dim};
  }

  /// T: float, or std::uint8_t for an FP8 cache's e4m3 codes (cpu_attention.hpp).
  template <class T>
  static void attend(cpu, const AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<T>& kv) {
    require<InvalidArgument>(static_cast<std::int64_t>(start) + count <= kv.capacity,
                             "FusedContiguousAttention: positions up to ", static_cast<std::int64_t>(start) + count,
                             " exceed the slot's capacity of ", kv.capacity, " tokens");
    kernels::cpu::attention<kernels::cpu::detail::cpu_kv_tile<Tuning>()>(shape, q, out, start, count, kv);
  }

#if defined(INFER_HAVE_CUDA)
  /// A slot's table is consecutive blocks: the paged kernels read it as they read any table.
  static void attend(cuda, const DeviceAttentionBatch& b) { PagedAttention<Tuning>::attend(cuda{}, b); }
  static std::size_t workspace_bytes(cuda, const DeviceAttentionBatch& b) {
    return PagedAttention<Tuning>::workspace_bytes(cuda{}, b);
  }
#endif
};

static_assert(AttentionKernel<FusedContiguousAttention<>, cpu>);
#if defined(INFER_HAVE_CUDA)
static_assert(AttentionKernel<FusedContiguousAttention<>, cuda>);
#endif

}  // namespace infer
