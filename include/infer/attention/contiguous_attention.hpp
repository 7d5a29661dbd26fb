#pragma once
/// \file
/// `FusedContiguousAttention<Tuning>`: the AttentionKernel of the static-shape engine. Each sequence
/// owns one slot of `capacity` consecutive token rows (ContiguousKvView), so addressing is a multiply,
/// with no table lookup. Allocators hand every kernel a block table and a block size; for a contiguous
/// allocator that table is {slot} and the block size is the slot's capacity, which is how make_view
/// reads them. On the CPU the math is the shared kernel of cpu_attention.hpp; "fused" names what the
/// CUDA version (a later `attend(cuda, ...)` overload) does.

#include <cstdint>
#include <span>
#include <string_view>

#include "infer/attention/cpu_attention.hpp"
#include "infer/attention/kv_view.hpp"
#include "infer/concepts.hpp"
#include "infer/core/backend.hpp"
#include "infer/core/error.hpp"

namespace infer {

template <class Tuning = void>
struct FusedContiguousAttention {
  static constexpr KvLayout layout = KvLayout::contiguous;
  static constexpr std::string_view name = "fused_contiguous";
  template <class T>
  using view = ContiguousKvView<T>;

  /// slot = table[0], capacity = block_size. InvalidArgument for an empty table (no slot assigned).
  template <class T>
  static view<T> make_view(T* k, T* v, std::span<const std::int32_t> table, std::int32_t block_size,
                           std::int32_t kv_heads, std::int32_t head_dim) {
    require<InvalidArgument>(!table.empty(),
                             "FusedContiguousAttention::make_view: the block table is empty; a contiguous sequence's "
                             "table must be {slot}");
    return view<T>{k, v, table[0], block_size, kv_heads, head_dim};
  }

  static void attend(cpu, const AttentionShape& shape, const float* q, float* out, std::int32_t start,
                     std::int32_t count, const view<float>& kv) {
    require<InvalidArgument>(static_cast<std::int64_t>(start) + count <= kv.capacity,
                             "FusedContiguousAttention: positions up to ", static_cast<std::int64_t>(start) + count,
                             " exceed the slot's capacity of ", kv.capacity, " tokens");
    kernels::cpu::attention<kernels::cpu::detail::cpu_kv_tile<Tuning>()>(shape, q, out, start, count, kv);
  }
};

static_assert(AttentionKernel<FusedContiguousAttention<>, cpu>);

}  // namespace infer
